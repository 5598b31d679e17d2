"""The faults a long run meets (issue #36), through the real command: signals, writes that fail,
broken checkpoints, two runs on one directory, a run directory deleted under the run, divergence,
resumes against a changed world, paths with spaces and non-ASCII names.

The runs are tiny (16 images at 64 px: two steps an epoch). Only what needs its own process
(signals) starts one; everything else runs the CLI's entry point in this process."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from testkit import run_in_process

from libreyolo.data import load_data_config
from libreyolo.data.labels import label_path

pytestmark = pytest.mark.usefixtures("one_thread")

RUN = ["device=cpu", "workers=0", "imgsz=64", "batch=8", "amp=false", "val=false"]
RUN_KW = dict(device="cpu", workers=0, imgsz=64, batch=8, amp=False, val=False)


def own_dataset(root: Path, n_train: int = 16, n_val: int = 4) -> Path:
    """A self-contained copy of the first shapes images (it can be moved as a whole); its yaml."""
    shapes = load_data_config("shapes")
    for split, files in (("train", shapes.train[:n_train]), ("val", shapes.val[:n_val])):
        for kind in ("images", "labels"):
            (root / kind / split).mkdir(parents=True, exist_ok=True)
        for f in files:
            shutil.copy(f, root / "images" / split / f.name)
            shutil.copy(label_path(f), root / "labels" / split / label_path(f).name)
    y = root / "data.yaml"
    y.write_text(json.dumps({"path": ".", "train": "images/train", "val": "images/val", "names": shapes.names}))
    return y


def _rows(run_dir: Path) -> list[str]:
    return [line.split(",")[0] for line in (run_dir / "results.csv").read_text().splitlines()[1:]]


def _errors(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("error: ")]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One epoch of yolo9-t on a 16-image dataset of its own; the checkpoint made resumable (its
    config says 2 epochs) as `resumable`."""
    from libreyolo import LibreYOLO

    root = tmp_path_factory.mktemp("faults")
    data = own_dataset(root / "ds")
    result = LibreYOLO("yolo9-t").train(data=str(data), epochs=1, project=str(root / "runs"), name="one", **RUN_KW)
    ns = type("Trained", (), {})()
    ns.root, ns.data, ns.last = root, data, result.last
    ns.ckpt = torch.load(result.last, map_location="cpu", weights_only=True)
    return ns


def resumable_copy(trained, name: str) -> Path:
    """A run directory of its own holding the trained checkpoint with one more epoch to run."""
    run = trained.root / name
    shutil.copytree(trained.last.parent.parent, run)
    ckpt = dict(trained.ckpt)
    ckpt["config"] = {**ckpt["config"], "epochs": 2}
    torch.save(ckpt, run / "weights" / "last.pt")
    return run / "weights" / "last.pt"


# --- 1. signals ------------------------------------------------------------------------------------
def _popen(cli_command, cli_env, cwd, *args):
    return subprocess.Popen([*cli_command, *args], cwd=cwd, env=cli_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def test_sigterm_mid_run_ends_in_one_line_and_the_resume_writes_each_row_once(trained, cli_command, cli_env,
                                                                              tmp_path, capsys):
    """The scheduler's SIGTERM, sent to the whole process group (the loader worker too): exit 143,
    one line naming the last good state, last.pt whole; resume=, here after results.csv was
    also damaged (not UTF-8), continues the schedule with every epoch's row once."""
    run_args = [a for a in RUN if not a.startswith("workers=")]
    proc = _popen(cli_command, cli_env, tmp_path, "train", "model=yolo9-t", f"data={trained.data}", "epochs=3",
                  *run_args, "workers=1", "name=term")
    last = tmp_path / "runs" / "train" / "term" / "weights" / "last.pt"
    deadline = time.time() + 300
    while not last.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    assert "Traceback" not in err and len(_errors(err)) == 1, err[-3000:]
    assert _errors(err)[0].startswith("error: interrupted by SIGTERM at epoch ")
    assert f"the last good state is {last.relative_to(tmp_path)} (end of epoch " in _errors(err)[0]
    epoch = torch.load(last, weights_only=True)["epoch"]  # a whole checkpoint
    run = last.parent.parent
    assert not (run / ".lock").exists()  # freed on the way out
    (run / "results.csv").write_bytes(b"\xff\xfe damaged \x00")

    code, _, err = run_in_process(["train", f"resume={last}"], capsys)
    assert code == 0, err
    assert f"{run / 'results.csv'} is not UTF-8 text (byte 0): rebuilt its {epoch + 1} rows from the checkpoint" in err
    assert _rows(run) == ["1", "2", "3"]


def test_a_signal_at_start_up_is_the_same_one_line(cli_env, tmp_path):
    # `python -m libreyolo` runs the entry point a pip install makes the `libreyolo` script run
    proc = _popen([sys.executable, "-m", "libreyolo"], cli_env, tmp_path, "train", "model=yolo9-t", "data=shapes", *RUN)
    time.sleep(0.3)  # importing typer, or torch
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and err.splitlines() == ["error: interrupted by SIGINT"], err[-3000:]
    assert not (tmp_path / "runs").exists()


SLOW_CLEANUP = """
import os, signal, sys, time
from libreyolo.signals import install
install()
try:
    print("ready", flush=True)
    time.sleep(60)
except KeyboardInterrupt:
    print("cleaning up", flush=True)
    time.sleep(60)  # a cleanup that takes long (a checkpoint write to finish)
"""


def test_a_second_signal_exits_at_once(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", SLOW_CLEANUP], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGINT)
    assert proc.stdout.readline() == "cleaning up\n"
    t0 = time.time()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 143 and time.time() - t0 < 10
    assert err == ("error: SIGTERM again: exiting at once (a checkpoint write in progress is dropped; the previous "
                   "one is kept)\n")


# --- 2. writes that fail ---------------------------------------------------------------------------
def test_a_checkpoint_the_disk_cannot_hold_is_one_line_and_no_truncated_file(trained, tmp_path, monkeypatch, capsys):
    """last.pt on a full disk (a link to /dev/full stands in for it: the kernel's ENOSPC)."""
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full")
    from libreyolo import atomic

    real = atomic.temp_path

    def full_for_checkpoints(path, suffix=".tmp"):
        tmp = real(path, suffix)
        if path.suffix == ".pt":
            tmp.symlink_to("/dev/full")
        return tmp

    monkeypatch.setattr(atomic, "temp_path", full_for_checkpoints)
    monkeypatch.chdir(tmp_path)
    code, _, err = run_in_process(["train", "model=yolo9-t", f"data={trained.data}", "epochs=2", *RUN], capsys)
    last = tmp_path / "runs" / "train" / "exp" / "weights" / "last.pt"
    assert code == 2 and _errors(err) == [f"error: cannot write checkpoint {Path('runs/train/exp/weights/last.pt')}: "
                                          f"No space left on device (ENOSPC: the disk is full)"], err
    assert "Traceback" not in err and list(last.parent.iterdir()) == []  # no last.pt, no temp file
    assert _rows(last.parent.parent) == ["1"]  # epoch 2 stopped at the failed write, before its row


# --- 3. broken checkpoints -------------------------------------------------------------------------
def _broken(kind: str, good: Path, trained, folder: Path) -> Path:
    import zipfile

    path = folder / f"{kind}.pt"
    data = good.read_bytes()
    if kind == "truncated":
        path.write_bytes(data[: len(data) * 2 // 3])
    elif kind == "random":
        path.write_bytes(random.Random(0).randbytes(4096))  # seeded: noise, never by chance a pickle header
    elif kind == "zip":
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("notes/readme.txt", "not a checkpoint")
            z.writestr("notes/data.bin", os.urandom(256))
    elif kind == "other-family":
        from libreyolo.families import get_family

        yolox = get_family("yolox").build("t", len(trained.ckpt["names"])).state_dict()
        torch.save({**trained.ckpt, "model": yolox, "ema": yolox, "config": {**trained.ckpt["config"], "epochs": 2}},
                   path)
    elif kind == "newer":
        torch.save({**trained.ckpt, "schema": 99}, path)
    return path


BROKEN = {"truncated": "is not a readable checkpoint (truncated or corrupt: cut short",
          "random": "is not a LibreYOLO checkpoint (not a PyTorch file",
          "zip": "is not a readable checkpoint (truncated or corrupt",
          "other-family": "weights do not fit yolo9-t",
          "newer": "has checkpoint schema 99, newer than this LibreYOLO understands"}


@pytest.mark.parametrize("kind", list(BROKEN))
def test_a_broken_checkpoint_is_one_line_exit_2_for_every_command(kind, trained, tmp_path, monkeypatch, capsys):
    path = _broken(kind, trained.last, trained, tmp_path)
    image = next((trained.data.parent / "images" / "val").iterdir())
    monkeypatch.chdir(tmp_path)
    for argv in (["train", f"resume={path}"], ["val", f"model={path}", "device=cpu", "workers=0"],
                 ["predict", f"model={path}", f"source={image}", "device=cpu"],
                 ["export", f"model={path}", f"output={tmp_path / 'x.onnx'}"]):
        code, out, err = run_in_process(argv, capsys)
        assert code == 2 and len(err.splitlines()) == 1 and BROKEN[kind] in err, (argv[0], err)
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # nothing written


# --- 4. two runs on one run directory --------------------------------------------------------------
def test_a_second_training_on_a_held_run_directory_is_refused(trained, tmp_path, monkeypatch, capsys):
    from libreyolo.engine.lock import RunLock

    monkeypatch.chdir(tmp_path)
    run = tmp_path / "runs" / "train" / "shared"
    run.mkdir(parents=True)
    (run / "results.csv").write_text("epoch,train/box\n1,3.0\n")  # the holder's
    with RunLock(run):  # another training holds it (the lock is per open file, even in one process)
        code, _, err = run_in_process(["train", "model=yolo9-t", f"data={trained.data}", "epochs=1", *RUN,
                                       "name=shared", "exist_ok=true"], capsys)
        assert code == 2 and len(_errors(err)) == 1, err
        assert f"error: run directory {Path('runs/train/shared')} is in use by another training (pid {os.getpid()}" in err
        resumed = resumable_copy(trained, "held")
        with RunLock(resumed.parent.parent):
            code, _, err = run_in_process(["train", f"resume={resumed}"], capsys)
        assert code == 2 and "is in use by another training" in err
    assert sorted(p.name for p in run.iterdir()) == ["results.csv"]  # untouched: no args.yaml, no rows
    assert (run / "results.csv").read_text() == "epoch,train/box\n1,3.0\n"


# --- 6. divergence ---------------------------------------------------------------------------------
def test_a_diverging_run_stops_at_the_step_and_names_its_finite_checkpoint(trained, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_in_process(["train", "model=yolo9-t", f"data={trained.data}", "epochs=4", *RUN,
                                   "optimizer=sgd", "lr0=1e12"], capsys)
    import re

    last = Path("runs/train/exp/weights/last.pt")
    assert code == 2 and len(_errors(err)) == 1, err
    line = _errors(err)[0]
    found = re.fullmatch(r"error: non-finite loss at epoch (\d+), step (\d+) .*; the last good state is (.+) "
                         r"\(end of epoch (\d+)\)", line)
    assert found and found[3] == str(last) and int(found[4]) == int(found[1]) - 1 >= 1, line
    ckpt = torch.load(last, weights_only=True)  # the state named: finite, of the epoch named
    assert ckpt["epoch"] + 1 == int(found[4])
    for part in ("model", "ema"):
        assert all(torch.isfinite(v).all() for v in ckpt[part].values() if v.is_floating_point())


# --- 7. resume against a changed world -------------------------------------------------------------
def _remover(how: str):
    """A hook that takes the run directory away at the end of epoch 1, once its checkpoint landed."""
    from libreyolo.engine.hooks import Hook

    class Remove(Hook):
        def after_epoch(self, trainer):
            if trainer.epoch == 0:
                trainer.wait_for_checkpoints()
                if how == "deleted":
                    shutil.rmtree(trainer.run_dir)
                    return
                for p in trainer.run_dir.iterdir():  # `rm -r run/*`: the hidden lock file stays
                    if not p.name.startswith("."):
                        shutil.rmtree(p) if p.is_dir() else p.unlink()

    return Remove()


@pytest.mark.parametrize("how", ["deleted", "emptied"])
def test_a_run_directory_taken_away_mid_run_stops_it_in_one_line(trained, tmp_path, how):
    from libreyolo import LibreYOLO
    from libreyolo.errors import RunDirError

    with pytest.raises(RunDirError) as err:
        LibreYOLO("yolo9-t").train(data=str(trained.data), epochs=3, project=str(tmp_path), name="gone",
                                   hooks=[_remover(how)], **RUN_KW)
    run = tmp_path / "gone"
    said = "was deleted" if how == "deleted" else "was emptied (the last.pt this run wrote is gone)"
    assert str(err.value) == (f"run directory {run} {said} while training (found at the end of epoch 2): stopped "
                              f"without writing there again; no checkpoint of it is left")
    assert not run.exists()  # deleted; or emptied, then removed as a run that left nothing


def test_resume_on_the_same_dataset_moved_is_honoured_and_another_refused(trained, tmp_path, capsys):
    last = resumable_copy(trained, "moved")
    moved = tmp_path / "elsewhere"
    shutil.copytree(trained.data.parent, moved)
    old = trained.root / "ds_gone"
    trained.data.parent.rename(old)  # the dataset the run trained on is gone from its place
    try:
        code, _, err = run_in_process(["train", f"resume={last}"], capsys)
        assert code == 2 and "if it moved, resume with data=<its new place> beside resume=" in err, err
        fewer = tmp_path / "fewer"
        shutil.copytree(moved, fewer)
        next((fewer / "images" / "train").iterdir()).unlink()
        renamed = tmp_path / "renamed"
        shutil.copytree(moved, renamed)
        y = json.loads((renamed / "data.yaml").read_text())
        (renamed / "data.yaml").write_text(json.dumps({**y, "names": ["dot", *y["names"][1:]]}))
        for data, why in ((fewer, "15 usable train images there, 16 when it trained"),
                          (renamed, "class 0 is 'dot' there but 'circle' in the checkpoint")):
            code, _, err = run_in_process(["train", f"resume={last}", f"data={data / 'data.yaml'}"], capsys)
            assert code == 2 and len(err.splitlines()) == 1 and "not the dataset it trained on" in err and why in err, err
        code, _, err = run_in_process(["train", f"resume={last}", f"data={moved / 'data.yaml'}"], capsys)
        assert code == 0, err
        assert f"resuming on data={moved / 'data.yaml'} in place of {trained.data}: the same dataset moved" in err
        assert _rows(last.parent.parent) == ["1", "2"]
        assert torch.load(last, weights_only=True)["config"]["data"] == str(moved / "data.yaml")
    finally:
        old.rename(trained.data.parent)


# --- 5. odd paths ----------------------------------------------------------------------------------
def test_paths_with_spaces_and_non_ascii_names_work_everywhere(trained, tmp_path, monkeypatch, capsys):
    data = tmp_path / "dä ta" / "ünï set"
    shutil.copytree(trained.data.parent, data)
    monkeypatch.chdir(tmp_path)
    code, out, err = run_in_process(["train", "model=yolo9-t", f"data={data / 'data.yaml'}", "epochs=1", *RUN,
                                     "project=rüns x/dé", "name=naïve run"], capsys)
    assert code == 0, err
    last = tmp_path / "rüns x" / "dé" / "naïve run" / "weights" / "last.pt"
    assert out.strip() == str(Path("rüns x/dé/naïve run/weights/last.pt")) and last.is_file()
    code, out, err = run_in_process(["val", f"model={last}", "device=cpu", "workers=0", "--json"], capsys)
    assert code == 0 and json.loads(out)["data"] == str(data / "data.yaml"), err
    code, out, err = run_in_process(["predict", f"model={last}", f"source={data / 'images' / 'val'}", "device=cpu",
                                     "save=true", "project=prédictions x", "name=é"], capsys)
    assert code == 0 and len(out.splitlines()) == 4, err
    assert len(list((tmp_path / "prédictions x" / "é").iterdir())) == 4
