"""The faults a long run meets (issue #36), one class at a time, without training: writes that fail,
the run directory's lock, hostile dataset files, divergence checks, results.csv on resume,
the signal handlers. tests/cli/test_faults_cli.py runs the same through real runs."""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest
import torch

from libreyolo import atomic
from libreyolo.atomic import atomic_path, write_json_atomic, write_text_atomic
from libreyolo.errors import DataError, RunDirError, WriteError


# --- writes that fail ------------------------------------------------------------------------------
@pytest.fixture
def full_disk(monkeypatch):
    """A failing filesystem stand-in with the kernel's own error: every atomic write goes to a temp
    name that is a link to /dev/full, whose writes fail with ENOSPC (whoever does the writing:
    Python, torch, PIL, onnx)."""
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full")
    made = []

    def temp_path(path, suffix=".tmp"):
        tmp = path.with_name(f".{path.name}.full{suffix}")
        tmp.symlink_to("/dev/full")
        made.append(tmp)
        return tmp

    monkeypatch.setattr(atomic, "temp_path", temp_path)
    return made


def _only(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_a_full_disk_is_one_line_naming_the_file_and_keeps_the_previous_one(tmp_path, full_disk):
    from libreyolo.engine.checkpoint import save_checkpoint
    from libreyolo.engine.results_csv import ResultsTable

    page = tmp_path / "results.html"
    page.write_text("old page")  # written before the disk filled
    writes = {
        "results.html": lambda: write_text_atomic(tmp_path / "results.html", "new page"),
        "profile.json": lambda: write_json_atomic(tmp_path / "profile.json", {"x": 1}),
        "last.pt": lambda: save_checkpoint(tmp_path / "last.pt", {"epoch": 1}),
        "results.csv": lambda: ResultsTable().add(tmp_path / "results.csv", {"epoch": 1, "train/box": 1.0}),
        "m.pt2": lambda: _export_pt2(tmp_path / "m.pt2"),
    }
    for name, write in writes.items():
        with pytest.raises(WriteError) as err:
            write()
        kept = "; the previous file is kept" if name == "results.html" else ""
        assert str(err.value).endswith(f"{tmp_path / name}: No space left on device (ENOSPC: the disk is full){kept}")
    assert page.read_text() == "old page"
    assert _only(tmp_path) == ["results.html"]  # no temp file, nothing under another real name


def _export_pt2(path: Path) -> None:
    """export.py's write of a torch.export program, as export_model does it (a tiny program)."""
    from libreyolo.export import FORMATS, _write_pt2

    program = torch.export.export(torch.nn.Linear(2, 2), (torch.zeros(1, 2),))
    with atomic_path(path, suffix=FORMATS["pt2"]) as tmp:
        _write_pt2(program, tmp, {})


@pytest.mark.parametrize("code, said", [(errno.EIO, "Input/output error (EIO: the device reported an I/O error)"),
                                        (errno.EFBIG, "File too large (EFBIG: a file-size limit (ulimit -f) or quota)"),
                                        (errno.EDQUOT, "Disk quota exceeded (EDQUOT: a disk quota is used up)")])
def test_a_failing_write_half_done_leaves_the_old_file_whole(tmp_path, code, said):
    """The stand-in writes half of the new file, then fails as the device would."""
    path = write_text_atomic(tmp_path / "args.yaml", "epochs: 3\n")
    with pytest.raises(WriteError) as err, atomic_path(path) as tmp:
        tmp.write_text("epochs: 3\nbatch:")
        raise OSError(code, os.strerror(code))
    assert str(err.value) == f"cannot write {path}: {said}; the previous file is kept"
    assert path.read_text() == "epochs: 3\n" and _only(tmp_path) == ["args.yaml"]


def test_a_checkpoint_that_fails_to_write_in_the_background_is_one_line(tmp_path, monkeypatch):
    from libreyolo.engine import checkpoint as C

    good = C.save_checkpoint(tmp_path / "last.pt", {"epoch": 0})
    before = good.read_bytes()

    def broken_disk(obj, f, *a, **kw):  # torch.save writing into a device that fails half way
        f.write(b"PK\x03\x04 half")
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(C.torch, "save", broken_disk)
    writer = C.BackgroundWriter()
    writer.submit(good, {"epoch": 1}, tag=1)
    with pytest.raises(WriteError) as err:
        writer.wait()
    assert str(err.value) == (f"cannot write checkpoint {good}: Input/output error (EIO: the device reported an I/O "
                              f"error); the previous file is kept")
    assert good.read_bytes() == before and _only(tmp_path) == ["last.pt"]


LIMITED = r"""
import json, os, resource, signal, sys
from pathlib import Path
import torch
from libreyolo.atomic import write_json_atomic, write_text_atomic
from libreyolo.engine.checkpoint import save_checkpoint
from libreyolo.engine.results_csv import ResultsTable
from libreyolo.errors import WriteError
from libreyolo.predict.draw import Saver
from libreyolo.predict.sources import Frame

out = Path(sys.argv[1])
rows = [{"epoch": i, "train/box": 1.0 / i, "note": "x" * 40} for i in range(1, 4)]
table = ResultsTable()
for r in rows:
    table.add(out / "results.csv", r)
save_checkpoint(out / "last.pt", {"w": torch.zeros(10)})
write_text_atomic(out / "results.html", "<p>old</p>")
write_json_atomic(out / "profile.json", {"old": 1})
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (32 << 10, resource.RLIM_INFINITY))  # 32 kB
big = "y" * (64 << 10)
errors = {}
for name, write in [
        ("last.pt", lambda: save_checkpoint(out / "last.pt", {"w": torch.zeros(100_000)})),
        ("results.csv", lambda: table.add(out / "results.csv", {"epoch": 4, "train/box": 0.1, "note": big})),
        ("results.html", lambda: write_text_atomic(out / "results.html", big)),
        ("profile.json", lambda: write_json_atomic(out / "profile.json", {"big": big})),
        ("a.png", lambda: Saver(out).save(Frame(None, "a.png", "/src/a.png", None, 0),
                                           torch.randint(0, 255, (3, 256, 256), dtype=torch.uint8)))]:
    try:
        write()
        errors[name] = None
    except WriteError as exc:
        errors[name] = str(exc)
print(json.dumps(errors))
"""


def test_a_file_size_limit_fails_each_write_in_one_line_and_keeps_the_previous_file(tmp_path):
    """`ulimit -f` with SIGXFSZ ignored: the kernel's EFBIG, in a child process (the limit is
    per process)."""
    out = tmp_path / "run"
    out.mkdir()
    proc = subprocess.run([sys.executable, "-c", LIMITED, str(out)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    errors = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, message in errors.items():
        kept = "; the previous file is kept" if name != "a.png" else ""
        assert message is not None and message.endswith(
            f"{out / name}: File too large (EFBIG: a file-size limit (ulimit -f) or quota){kept}"), (name, message)
    assert _only(out) == ["last.pt", "profile.json", "results.csv", "results.html"]  # no temp, no a.png
    assert torch.load(out / "last.pt", weights_only=True)["w"].shape == (10,)
    assert [r.split(",")[0] for r in (out / "results.csv").read_text().splitlines()] == ["epoch", "1", "2", "3"]
    assert (out / "results.html").read_text() == "<p>old</p>" and json.loads((out / "profile.json").read_text()) == {"old": 1}


# --- the run directory's lock --------------------------------------------------------------------
def test_a_held_run_directory_is_refused_and_freed_on_release(tmp_path):
    from libreyolo.engine.lock import LOCK_NAME, RunLock

    first = RunLock(tmp_path).acquire()
    holder = json.loads((tmp_path / LOCK_NAME).read_text())
    assert holder["pid"] == os.getpid()
    with pytest.raises(RunDirError) as err:  # another open of the file: a second training
        RunLock(tmp_path).acquire()
    assert f"run directory {tmp_path} is in use by another training (pid {os.getpid()} on " in str(err.value)
    first.release()
    assert not (tmp_path / LOCK_NAME).exists()
    with RunLock(tmp_path):  # free again
        assert (tmp_path / LOCK_NAME).exists()
    assert not (tmp_path / LOCK_NAME).exists()


def test_the_lock_of_a_crashed_run_is_stale_and_taken_over(tmp_path, caplog):
    from libreyolo.engine.lock import LOCK_NAME, RunLock

    crash = ("import os, sys; from libreyolo.engine.lock import RunLock; RunLock(sys.argv[1]).acquire(); "
             "print(os.getpid(), flush=True); os._exit(9)")  # dies holding it: no release, no cleanup
    proc = subprocess.run([sys.executable, "-c", crash, str(tmp_path)], capture_output=True, text=True, timeout=60)
    dead = int(proc.stdout)
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == dead
    with caplog.at_level(logging.INFO, logger="libreyolo"), RunLock(tmp_path) as lock:
        assert lock.check() is None
    assert f"(pid {dead} on " in caplog.text and "was stale; taken over" in caplog.text


def test_a_run_directory_deleted_or_emptied_under_the_lock_is_noticed(tmp_path):
    import shutil

    from libreyolo.engine.lock import LOCK_NAME, RunLock

    run = tmp_path / "exp"
    run.mkdir()
    lock = RunLock(run).acquire()
    (run / LOCK_NAME).unlink()
    assert lock.check() == "was emptied (its lock file is gone)"
    (run / LOCK_NAME).write_text("{}")
    assert lock.check() == "was replaced (its lock file is another one)"
    shutil.rmtree(run)
    assert lock.check() == "was deleted"
    lock.release()  # nothing left to remove: no error


# --- hostile dataset files -------------------------------------------------------------------------
BOMB = "\n".join(["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
                 + [f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi")]
                 + ["path: .", "train: images", "val: images", "names: *i"]) + "\n"


def test_a_yaml_alias_bomb_fails_fast_in_bounded_memory(tmp_path):
    from libreyolo.data import load_data_config

    (tmp_path / "bomb.yaml").write_text(BOMB)  # 10^9 values in 440 bytes
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(DataError) as err:
            load_data_config(str(tmp_path / "bomb.yaml"))
        seconds, (_, peak) = time.perf_counter() - t0, tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "its aliases expand to more than 100000 values (an alias bomb?)" in str(err.value)
    assert seconds < 2 and peak < 20e6, (seconds, peak)
    (tmp_path / "loop.yaml").write_text("names: &n [a, *n]\ntrain: a\nval: a\n")
    with pytest.raises(DataError, match="refers to the block that contains it"):
        load_data_config(str(tmp_path / "loop.yaml"))


def test_yaml_aliases_within_bounds_still_work():
    from libreyolo.data.safe_yaml import load_yaml

    assert load_yaml("x: &v [1, 2]\ny: *v\n", "t.yaml") == {"x": [1, 2], "y": [1, 2]}
    assert load_yaml("", "t.yaml") is None


def _generate_into(yaml_text: str, folder: Path):
    from libreyolo.data import load_data_config

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "data.yaml").write_text(yaml_text)
    return load_data_config(str(folder / "data.yaml"))


@pytest.mark.parametrize("path_key", ["/etc", "../.."])
def test_a_path_escaping_to_a_foreign_folder_is_never_written(tmp_path, path_key):
    """`builtin: shapes` used to replace whatever `path:` named (rmtree of /etc, run as root);
    `download:` to move it aside. Both now refuse before writing anything there or beside it."""
    target = Path("/etc") if path_key == "/etc" else tmp_path
    (tmp_path / "a" / "b").mkdir(parents=True)
    before = sorted(os.listdir(target)), sorted(os.listdir(target.parent))
    for extra in ("builtin: shapes", "download: https://example.invalid/x.zip"):
        with pytest.raises(DataError, match="already holds other files, and LibreYOLO only generates or downloads"):
            _generate_into(f"path: {path_key}\n{extra}\ntrain: images/train\nval: images/val\nnames: [a]\n",
                           tmp_path / "a" / "b")
        (tmp_path / "a" / "b" / "data.yaml").unlink()
    assert (sorted(os.listdir(target)), sorted(os.listdir(target.parent))) == before


def test_symlink_loops_in_image_folders_do_not_hang(tmp_path):
    from libreyolo.data import load_data_config
    from libreyolo.predict.sources import open_source

    images = tmp_path / "images" / "train"
    images.mkdir(parents=True)
    (tmp_path / "labels" / "train").mkdir(parents=True)
    (images / "up").symlink_to("..")          # a folder loop
    (images / "self").symlink_to("../train")  # another
    (images / "a.jpg").symlink_to("b.jpg")    # a file loop
    (images / "b.jpg").symlink_to("a.jpg")
    from torchvision.io import encode_jpeg
    (images / "0.jpg").write_bytes(encode_jpeg(torch.full((3, 32, 32), 99, dtype=torch.uint8)).numpy().tobytes())
    (tmp_path / "data.yaml").write_text(json.dumps({"path": str(tmp_path), "train": "images/train",
                                                    "val": "images/train", "names": ["a"]}))
    t0 = time.perf_counter()
    cfg = load_data_config(str(tmp_path / "data.yaml"))
    assert sorted(p.name for p in cfg.train) == ["0.jpg", "a.jpg", "b.jpg"]  # the loops are not walked
    source = open_source(str(tmp_path / "images" / "**" / "*.jpg"))  # glob's ** used to follow them
    assert [p.name for p in source.image_files()] == ["0.jpg"]  # and a file loop is no image
    assert time.perf_counter() - t0 < 10


def test_a_50_mb_label_file_is_refused_without_reading_it(tmp_path):
    from libreyolo.data.labels import parse_label_file

    big = tmp_path / "a.txt"
    with open(big, "wb") as f:
        f.truncate(50 << 20)  # sparse: 50 MB on paper, instant to make
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"50.0 MB: more than the 2 MB a label file may be"):
        parse_label_file(big, 3)
    (tmp_path / "b.txt").write_text("0 0.5 0.5 0.1 0.1\n" * 10_001)
    with pytest.raises(ValueError, match="10001 boxes: more than the 10000 an image may hold"):
        parse_label_file(tmp_path / "b.txt", 3)
    assert time.perf_counter() - t0 < 5


# --- divergence ------------------------------------------------------------------------------------
def _weights(value: float) -> dict:
    return {"w": torch.full((3,), value), "steps": torch.tensor(4)}


def test_the_last_good_state_is_read_back_and_only_named_when_finite(tmp_path):
    from libreyolo.engine.checkpoint import save_checkpoint
    from libreyolo.engine.diverge import last_good_state

    weights = tmp_path / "weights"
    none = "no checkpoint was saved yet (the first epoch did not end)"
    assert last_good_state(tmp_path, {}) == none
    save_checkpoint(weights / "last.pt", {"epoch": 4, "model": _weights(1.0), "ema": _weights(1.0)})
    assert last_good_state(tmp_path, {}) == none  # another run's (a reused directory): not this one's state
    written = {weights / "last.pt": 4}
    assert last_good_state(tmp_path, written) == f"the last good state is {weights / 'last.pt'} (end of epoch 5)"
    save_checkpoint(weights / "last.pt", {"epoch": 5, "model": _weights(1.0), "ema": _weights(float("inf"))})
    assert last_good_state(tmp_path, written) == (f"{weights / 'last.pt'} holds non-finite weights and no other "
                                                  f"checkpoint of the run has finite ones")
    save_checkpoint(weights / "epoch2.pt", {"epoch": 1, "model": _weights(1.0), "ema": None})
    save_checkpoint(weights / "epoch4.pt", {"epoch": 3, "model": _weights(float("nan")), "ema": None})
    save_checkpoint(weights / "best.pt", {"epoch": 0, "model": _weights(1.0), "ema": None})
    assert last_good_state(tmp_path, {}, resumed=True) == (  # a resume: the files it resumed among count
        f"{weights / 'last.pt'} holds non-finite weights; the last good state is {weights / 'epoch2.pt'} (end of "
        f"epoch 2)")


def test_non_finite_weights_are_never_checkpointed():
    from libreyolo.engine.diverge import check_weights
    from libreyolo.engine.meter import NonFiniteLossError

    check_weights({"model": _weights(1.0), "ema": None}, "epoch 1, step 2", lambda: "unused")
    with pytest.raises(NonFiniteLossError) as err:
        check_weights({"model": _weights(1.0), "ema": {"bn.running_var": torch.tensor([1.0, float("inf")])}},
                      "epoch 5, step 16", lambda: "the last good state is x/last.pt (end of epoch 4)")
    assert str(err.value) == ("the weights became non-finite by epoch 5, step 16 (1 tensors, e.g. 'bn.running_var') "
                              "while every loss read back was finite: not saved; the last good state is x/last.pt "
                              "(end of epoch 4)")


def test_the_finite_check_of_a_detached_state_is_one_per_storage(monkeypatch):
    # engine/state.py packs each part into one buffer per dtype: checking the buffers, not the
    # 2,000-odd tensors one by one, says the same (a NaN anywhere is found).
    from libreyolo.engine import diverge
    from libreyolo.engine.state import cpu_state

    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Conv2d(4, 4, 1), torch.nn.BatchNorm2d(4))
                                  for _ in range(20)])
    weights, ema = cpu_state(model), cpu_state(model)
    checks = []
    real = torch.isfinite
    monkeypatch.setattr(diverge.torch, "isfinite", lambda t: checks.append(t.numel()) or real(t))
    assert diverge.finite_storages(weights, ema, None)
    floats = sum(v.numel() for v in weights.values() if v.is_floating_point())
    assert checks == [floats, floats]  # one float32 buffer each; num_batches_tracked (int64) is not checked
    key = next(k for k, v in ema.items() if k.endswith("running_var"))
    ema[key][1] = float("nan")
    assert not diverge.finite_storages(weights, ema)
    assert diverge.finite_storages({"w": torch.ones(3)})
    assert not diverge.finite_storages({"w": torch.tensor([1.0, float("inf")])})


def test_a_loss_scaler_that_skips_step_after_step_stops_the_run():
    """float16 scaling on the CPU stands in for CUDA's: an inf gradient is skipped and counted, a
    finite step breaks the run of skips, and the watch stops the run at its limit."""
    from libreyolo.engine.diverge import SkipWatch
    from libreyolo.engine.meter import NonFiniteLossError
    from libreyolo.engine.precision import Precision, Resolution

    w = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([w], lr=0.1)
    precision = Precision(torch.device("cpu"), Resolution(None, True, None))
    watch = SkipWatch(precision, limit=5)

    def step(grad: float) -> None:
        precision.backward((w * grad).sum())
        precision.step(opt, [w], clip_grad=0.0)

    for g in (float("inf"),) * 3 + (1.0,) + (float("inf"),) * 4:
        step(g)
    watch.read("epoch 1, step 8", lambda: "unused")  # longest run so far: 4
    assert precision.skipped_steps() == 7 and int(precision.skip_streak) == 4
    step(float("nan"))
    with pytest.raises(NonFiniteLossError) as err:
        watch.read("epoch 1, step 9", lambda: "the last good state is x/last.pt (end of epoch 0)")
    assert str(err.value).startswith("the float16 loss scaler skipped 5 steps in a row (by epoch 1, step 9): "
                                     "the loss or its gradients are non-finite at every step")


# --- results.csv on resume -------------------------------------------------------------------------
ROWS = [{"epoch": e, "train/box": 1.0 / e, "lr": 0.01, "map50_95": ""} for e in (1, 2, 3)]


def _resumed_table(rows):
    from libreyolo.engine.results_csv import ResultsTable

    table = ResultsTable()
    table.load(rows)
    return table


@pytest.mark.parametrize("damage, said", [(b"\xff\xfe\x00garbage", "is not UTF-8 text (byte 0)"),
                                          (b"epoch,train/box\n1,9\n", "does not match the checkpoint's epochs (damaged or edited)"),
                                          (None, "is missing")])
def test_a_damaged_results_csv_is_rebuilt_from_the_checkpoint(tmp_path, caplog, damage, said):
    from libreyolo.engine.results_csv import table_text

    path = tmp_path / "results.csv"
    if damage is not None:
        path.write_bytes(damage)
    with caplog.at_level(logging.INFO, logger="libreyolo"):
        _resumed_table(ROWS[:2]).start(path, start_epoch=2)  # the epoch-2 checkpoint holds rows 1-2
    assert path.read_bytes() == table_text(ROWS[:2]).encode()
    assert f"{path} {said}: rebuilt its 2 rows from the checkpoint" in caplog.text


def test_rows_written_after_the_checkpoint_are_dropped_quietly(tmp_path, caplog):
    from libreyolo.engine.results_csv import table_text

    path = tmp_path / "results.csv"
    path.write_text(table_text(ROWS), newline="")  # epoch 3 ran after the epoch-2 checkpoint
    with caplog.at_level(logging.INFO, logger="libreyolo"):
        _resumed_table(ROWS[:2]).start(path, start_epoch=2)
    assert path.read_bytes() == table_text(ROWS[:2]).encode() and "rebuilt" not in caplog.text


def test_a_damaged_results_csv_without_history_in_the_checkpoint_is_refused(tmp_path):
    from libreyolo.engine.results_csv import ResultsTable

    path = tmp_path / "results.csv"
    path.write_bytes(b"epoch,train/box\n1,3.0\n\xff\xff\n")
    with pytest.raises(RunDirError) as err:
        ResultsTable().start(path, start_epoch=1)  # an old checkpoint: no rows in it
    assert str(err.value).startswith(f"cannot resume: {path} is not UTF-8 text (byte 22), and the checkpoint holds no "
                                     f"table to rebuild it from")
    path.write_text("epoch,train/box\n1,3.0\n2,2.0\n")
    table = ResultsTable()
    table.start(path, start_epoch=1)  # readable: its own rows, cut at the checkpoint
    assert path.read_text().splitlines() == ["epoch,train/box", "1,3.0"] and table.rows == [{"epoch": "1", "train/box": "3.0"}]


# --- signals ---------------------------------------------------------------------------------------
def test_interrupts_say_the_signal_and_exit_128_plus_it():
    import signal

    from libreyolo.signals import Interrupted, exit_code, interrupted_line, note

    term = Interrupted(signal.SIGTERM)
    note(term, "epoch 3, step 2", "the last good state is x/last.pt (end of epoch 2)")
    assert isinstance(term, KeyboardInterrupt) and exit_code(term) == 143
    assert interrupted_line(term) == ("interrupted by SIGTERM at epoch 3, step 2: the last good state is x/last.pt "
                                      "(end of epoch 2)")
    assert exit_code(KeyboardInterrupt()) == 130 and interrupted_line(KeyboardInterrupt()) == "interrupted by SIGINT"
