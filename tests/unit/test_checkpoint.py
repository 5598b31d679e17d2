"""Checkpoints: atomic save/load round trip, one-line CheckpointErrors for every kind of bad file,
exact RNG-stream restore, precision state through a checkpoint, and weights_only loading."""

import pickle
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from libreyolo.engine.checkpoint import (
    MAGIC,
    SCHEMA,
    check_resumable,
    load_checkpoint,
    remove_stale_temps,
    restore_rng_state,
    rng_state,
    save_checkpoint,
)
from libreyolo.engine.precision import Precision, Resolution
from libreyolo.errors import CheckpointError

CPU = torch.device("cpu")


def _payload(**over) -> dict:
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    payload = {"family": "yolo9", "size": "t", "names": ["a", "b"], "model": model.state_dict(),
               "epoch": 3, "config": {"lr0": 0.01, "amp": False}}
    payload.update(over)
    return payload


def _one_line_error(path: Path) -> str:
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path)
    msg = str(err.value)
    assert msg and "\n" not in msg
    # No chained traceback under the one line (`from None` where another exception was caught).
    assert err.value.__cause__ is None
    assert err.value.__context__ is None or err.value.__suppress_context__
    return msg


@dataclass
class Foreign:  # not on torch's weights_only allow-list
    value: int = 1


def test_round_trip_is_atomic(tmp_path):
    payload = _payload()
    path = save_checkpoint(tmp_path / "sub" / "last.pt", payload)  # parent folder created
    assert path == tmp_path / "sub" / "last.pt"
    assert [p.name for p in path.parent.iterdir()] == ["last.pt"]  # no temp file left behind
    ckpt = load_checkpoint(path)
    assert ckpt["format"] == MAGIC and ckpt["schema"] == SCHEMA
    assert {k: ckpt[k] for k in ("family", "size", "names", "epoch", "config")} == \
        {k: payload[k] for k in ("family", "size", "names", "epoch", "config")}
    assert ckpt["model"].keys() == payload["model"].keys()
    assert all(torch.equal(ckpt["model"][k], v) for k, v in payload["model"].items())


def test_overwrite_keeps_old_file_when_save_fails(tmp_path):
    path = save_checkpoint(tmp_path / "last.pt", _payload(epoch=1))
    with pytest.raises((pickle.PicklingError, AttributeError)):
        save_checkpoint(path, _payload(epoch=2, bad=lambda: 0))  # a lambda cannot be pickled
    assert load_checkpoint(path)["epoch"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_truncated_file(tmp_path):
    whole = save_checkpoint(tmp_path / "whole.pt", _payload()).read_bytes()
    half = tmp_path / "half.pt"
    half.write_bytes(whole[: len(whole) // 2])
    msg = _one_line_error(half)
    assert msg.startswith(f"'{half}' is not a readable checkpoint (truncated or corrupt")


def test_empty_file(tmp_path):
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    assert "truncated or corrupt" in _one_line_error(empty)


@pytest.mark.parametrize("obj", [{"state_dict": {"w": torch.zeros(2)}}, torch.zeros(3), [1, 2]])
def test_foreign_torch_file(tmp_path, obj):
    path = tmp_path / "foreign.pt"
    torch.save(obj, path)
    assert _one_line_error(path) == f"'{path}' is not a LibreYOLO checkpoint (foreign file)"


def test_text_file_is_not_a_checkpoint(tmp_path):
    path = tmp_path / "notes.pt"
    path.write_text("these are not weights\n" * 20)
    assert _one_line_error(path) == (f"'{path}' is not a LibreYOLO checkpoint (a text file: PyTorch checkpoints "
                                     "are zip archives)")
    path.write_bytes(bytes(range(256)))
    assert "(not a PyTorch file: " in _one_line_error(path)


def test_random_bytes_that_open_with_0x80_are_not_taken_for_a_legacy_pickle(tmp_path):
    # One random file in 256 starts with pickle's PROTO opcode; only protocols 2-5 follow it in a
    # file torch.save wrote, so 0x80 0x1b is as foreign as any other noise.
    path = tmp_path / "noise.pt"
    path.write_bytes(b"\x80\x1b" + bytes(range(256)) * 4)
    assert "(not a PyTorch file: " in _one_line_error(path)
    legacy = tmp_path / "legacy.pt"
    torch.save({"a": torch.zeros(1)}, legacy, _use_new_zipfile_serialization=False)
    assert legacy.read_bytes()[:2] == b"\x80\x02"
    assert _one_line_error(legacy) == f"'{legacy}' is not a LibreYOLO checkpoint (foreign file)"


def test_stale_temp_files_of_a_killed_write_are_removed(tmp_path):
    save_checkpoint(tmp_path / "last.pt", _payload())
    for name in (".last.pt.abc123.tmp", ".best.pt.x_9.tmp"):
        (tmp_path / name).write_bytes(b"PK half")
    (tmp_path / "notes.tmp").write_text("not ours")
    removed = remove_stale_temps(tmp_path)
    assert [p.name for p in removed] == [".best.pt.x_9.tmp", ".last.pt.abc123.tmp"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "notes.tmp"]


@pytest.mark.parametrize("key,value,said", [("optimizer", None, "'optimizer' is missing"),
                                            ("epoch", "3", "'epoch' is a str, not an int"),
                                            ("config", [1], "'config' is a list, not a dict")])
def test_a_weights_only_checkpoint_cannot_be_resumed(tmp_path, key, value, said):
    ckpt = {**_payload(optimizer={}, precision={}, rng={}), key: value}
    if value is None:
        del ckpt[key]
    with pytest.raises(CheckpointError) as err:
        check_resumable(ckpt, "w.pt")
    assert str(err.value) == f"'w.pt' cannot be resumed: its {said} (weights only? fine-tune from it with model=w.pt instead)"


def test_newer_schema_says_upgrade(tmp_path):
    path = save_checkpoint(tmp_path / "new.pt", _payload(schema=SCHEMA + 1))
    msg = _one_line_error(path)
    assert f"schema {SCHEMA + 1}" in msg and "upgrade libreyolo" in msg


@pytest.mark.parametrize("key", ["family", "size", "names", "model"])
def test_missing_key(tmp_path, key):
    payload = _payload()
    del payload[key]
    path = save_checkpoint(tmp_path / "partial.pt", payload)
    assert _one_line_error(path) == (f"'{path}' is missing '{key}'; not a complete LibreYOLO checkpoint")


def test_nonexistent_path(tmp_path):
    path = tmp_path / "nowhere" / "last.pt"
    assert _one_line_error(path) == f"checkpoint '{path}' does not exist"
    assert _one_line_error(tmp_path) == f"checkpoint '{tmp_path}' does not exist"  # a folder


def _draw() -> tuple:
    return ([random.random() for _ in range(3)], random.gauss(0, 1),
            np.random.rand(3).tolist(), float(np.random.standard_normal()),
            torch.rand(3).tolist(), torch.randint(0, 1000, (4,)).tolist())


def test_rng_state_round_trip_through_a_checkpoint(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    # Leave a cached Gaussian in python's and numpy's generators: that is state too.
    random.gauss(0, 1)
    np.random.standard_normal()
    state = rng_state()
    expected = _draw()
    path = save_checkpoint(tmp_path / "rng.pt", _payload(rng=state))  # builds a model: draws from torch

    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    assert _draw() != expected  # reseeding changed every stream; the restore below is not a no-op
    restore_rng_state(load_checkpoint(path)["rng"])
    assert _draw() == expected


def _precision(enabled: bool) -> Precision:
    # An enabled float16 scaler on CPU exercises the full scaler state without a GPU.
    resolution = Resolution(torch.float16, True, None) if enabled else Resolution(None, False, None)
    return Precision(CPU, resolution)


def _skip_one_step(precision: Precision) -> None:
    lin = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    precision.backward(lin(torch.tensor([[float("inf"), 1.0]])).sum())  # overflow: step is skipped
    precision.step(opt, list(lin.parameters()), clip_grad=0.0)


def test_precision_state_survives_a_checkpoint(tmp_path):
    before = _precision(True)
    _skip_one_step(before)
    state = before.state_dict()
    assert state["skipped"] == 1 and state["scaler"]["scale"] == 32768.0  # the overflow halved it
    path = save_checkpoint(tmp_path / "amp.pt", _payload(precision=state))

    after = _precision(True)
    after.load_state_dict(load_checkpoint(path)["precision"])
    assert after.state_dict() == state
    assert after.scaler.get_scale() == 32768.0 and after.skipped_steps() == 1


def test_precision_state_across_a_precision_change(tmp_path):
    # float32 run resumed with a live scaler (or back): the scaler starts fresh, no error.
    path = save_checkpoint(tmp_path / "fp32.pt", _payload(precision=_precision(False).state_dict()))
    resumed = _precision(True)
    resumed.load_state_dict(load_checkpoint(path)["precision"])
    assert resumed.scaler.get_scale() == 65536.0 and resumed.skipped_steps() == 0
    with pytest.raises(CheckpointError, match="no usable precision state"):
        resumed.load_state_dict({})


def test_checkpoint_loads_with_weights_only(tmp_path):
    path = save_checkpoint(tmp_path / "safe.pt", _payload(rng=rng_state(), precision=_precision(True).state_dict()))
    plain = torch.load(path, map_location="cpu", weights_only=True)
    assert plain["format"] == MAGIC and plain["names"] == ["a", "b"]
    assert isinstance(plain["rng"]["numpy"][1], torch.Tensor)  # numpy keys stored as a tensor


def test_pickled_code_is_refused(tmp_path):
    # load_checkpoint uses weights_only=True, so an arbitrary object inside is refused, not built.
    path = tmp_path / "evil.pt"
    torch.save({"format": MAGIC, "schema": SCHEMA, **_payload(extra=Foreign())}, path)
    assert _one_line_error(path) == f"'{path}' is not a LibreYOLO checkpoint ({pickle.UnpicklingError.__name__})"


def test_background_writes_land_in_order_and_hold_what_was_submitted(tmp_path):
    from libreyolo.engine.checkpoint import BackgroundWriter

    writer = BackgroundWriter()
    payloads = [_payload(epoch=e) for e in range(4)]
    for e, p in enumerate(payloads):
        writer.submit(tmp_path / "last.pt", p, tag=e)
    writer.submit(tmp_path / "best.pt", payloads[1], tag=1)
    writer.wait()
    assert load_checkpoint(tmp_path / "last.pt")["epoch"] == 3  # the last submitted write won
    best = load_checkpoint(tmp_path / "best.pt")
    assert best["epoch"] == 1 and all(torch.equal(best["model"][k], v) for k, v in payloads[1]["model"].items())
    assert writer.written == {tmp_path / "last.pt": 3, tmp_path / "best.pt": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pt", "last.pt"]  # no temp left
    writer.wait()  # idempotent; the thread is gone
    writer.submit(tmp_path / "again.pt", _payload())  # and a later submit starts one again
    writer.wait()
    assert load_checkpoint(tmp_path / "again.pt")["format"] == MAGIC


def test_a_failed_background_write_is_one_line_or_logged_on_a_failure_path(tmp_path, caplog):
    import logging

    from libreyolo.engine.checkpoint import BackgroundWriter
    from libreyolo.errors import WriteError

    (tmp_path / "file").write_text("x")
    writer = BackgroundWriter()
    writer.submit(tmp_path / "ok.pt", _payload(), tag=0)
    writer.submit(tmp_path / "file" / "last.pt", _payload(), tag=1)  # a folder that is a file
    with pytest.raises(WriteError) as err:
        writer.wait()
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"cannot write checkpoint {tmp_path / 'file' / 'last.pt'}: ")
    assert writer.written == {tmp_path / "ok.pt": 0}  # the failed one is not recorded
    writer.submit(tmp_path / "file" / "x.pt", _payload())
    with caplog.at_level(logging.WARNING, logger="libreyolo"):
        writer.wait(raise_errors=False)  # another error is on its way: log, do not raise over it
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [f"cannot write checkpoint {tmp_path / 'file' / 'x.pt'}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "ok.pt"]


def test_the_threads_copy_stages_a_gpus_tensors_in_one_run_beside_the_cpus(monkeypatch):
    # AdamW's state on a GPU: per parameter a `step` counter on the CPU between two moments on the
    # device. The staged moments (here: every tensor of more than one element) keep a buffer of
    # their own, so the counters between them do not break their run into one per parameter.
    from libreyolo.engine import state

    transfers = []
    real_cat = torch.cat
    monkeypatch.setattr(torch, "cat", lambda ts, *a, **k: transfers.append(len(ts)) or real_cat(ts, *a, **k))
    live = {"state": {i: {"step": torch.tensor(float(i)), "exp_avg": torch.randn(5, 3), "exp_avg_sq": torch.rand(7)}
                      for i in range(50)}}
    copy = state._copied(live, stage=lambda t: t.dim() > 0)
    assert transfers == [100]
    for i in range(50):
        for k, v in live["state"][i].items():
            assert torch.equal(copy["state"][i][k], v)
    assert len({copy["state"][i][k].untyped_storage().data_ptr() for i in range(50) for k in live["state"][i]}) == 2


@pytest.mark.parametrize("staged", [False, True], ids=["direct", "staged"])
def test_the_threads_copy_is_one_buffer_per_dtype_and_owes_nothing_to_the_live_state(tmp_path, monkeypatch, staged):
    # torch.save writes a record per storage and waits for the GIL between records: the copy
    # the checkpoint thread writes keeps them to one per dtype (engine/state.py, _copied).
    # `staged`: the path a GPU's tensors take (concatenated in runs, one transfer a run), here on
    # the CPU's, with runs of at most 4 kB so that a part leaves in several.
    from libreyolo.engine import state

    monkeypatch.setattr(state, "_STAGE_BYTES", 4096)
    transfers = []
    real_cat = torch.cat
    monkeypatch.setattr(torch, "cat", lambda ts, *a, **k: transfers.append(len(ts)) or real_cat(ts, *a, **k))

    def _copied(value):
        return state._copied(value, stage=lambda t: True) if staged else state._copied(value)

    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Linear(128, 128),
                              torch.nn.Linear(128, 128))  # 130 kB of weights: pickle's size below is theirs
    live = {"model": net.state_dict(), "step": [torch.tensor(3.0), torch.tensor(True)], "epoch": 7,
            "moments": (torch.randn(2, 3).t(), torch.zeros(0, 4))}  # a transposed view, an empty tensor
    copy = _copied(live)
    leaves = [*copy["model"].values(), *copy["step"], *copy["moments"]]
    storages = {t.dtype: set() for t in leaves}
    for t in leaves:
        storages[t.dtype].add(t.untyped_storage().data_ptr())
    assert {dtype: len(ptrs) for dtype, ptrs in storages.items()} == \
           {torch.float32: 1, torch.int64: 1, torch.bool: 1}
    for got, want in zip(leaves, [*live["model"].values(), *live["step"], *live["moments"]]):
        assert got.shape == want.shape and got.dtype == want.dtype and torch.equal(got, want)
        assert got.device.type == "cpu" and not got.requires_grad
    assert copy["epoch"] == 7 and isinstance(copy["moments"], tuple)
    with torch.no_grad():
        net[0].weight.add_(1.0)  # training goes on: the copy keeps the state it was taken at
    assert not torch.equal(copy["model"]["0.weight"], net[0].weight)
    # Loaded, each tensor owns its storage again: pickle (a broadcast to the other ranks) writes a
    # view's whole buffer every time, so views would carry it once per tensor.
    save_checkpoint(tmp_path / "last.pt", _payload(model=copy["model"], ema=_copied(net.state_dict())))
    back = load_checkpoint(tmp_path / "last.pt")
    assert all(torch.equal(back["model"][k], v) for k, v in copy["model"].items())
    tensors = [*back["model"].values(), *back["ema"].values()]
    assert all(t.untyped_storage().nbytes() == t.nbytes for t in tensors)
    assert len(pickle.dumps(back)) < 1.2 * sum(t.nbytes for t in tensors) + 20_000  # views: about 6x
    if staged:  # every tensor of the two copies went in a run; the 64 kB Linear weights alone in theirs
        assert sum(transfers) == len(leaves) + len(net.state_dict()) and max(transfers) > 2
    else:
        assert not transfers


def test_a_state_under_two_names_is_serialised_once_and_the_copy_is_byte_identical(tmp_path, monkeypatch):
    # The epoch that writes last.pt and best.pt writes one state twice: the second is a copy of the
    # first file, not a second torch.save.
    from libreyolo.engine import checkpoint as C

    saves = []
    real = C.torch.save
    monkeypatch.setattr(C.torch, "save", lambda obj, f, *a, **k: saves.append(1) or real(obj, f, *a, **k))
    writer = C.BackgroundWriter()
    writer.submit(tmp_path / "last.pt", _payload(epoch=4), tag=4,
                  copies=(tmp_path / "best.pt", tmp_path / "epoch5.pt"))
    writer.wait()
    assert len(saves) == 1
    last = (tmp_path / "last.pt").read_bytes()
    assert (tmp_path / "best.pt").read_bytes() == last == (tmp_path / "epoch5.pt").read_bytes()
    assert (tmp_path / "best.pt").stat().st_ino != (tmp_path / "last.pt").stat().st_ino  # a copy, not a link
    assert load_checkpoint(tmp_path / "best.pt")["epoch"] == 4
    assert writer.written == {tmp_path / n: 4 for n in ("last.pt", "best.pt", "epoch5.pt")}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pt", "epoch5.pt", "last.pt"]  # no temp left


def test_a_copy_whose_source_failed_to_write_keeps_the_previous_file(tmp_path, monkeypatch, caplog):
    # Never a copy of the previous last.pt (an atomic write that failed keeps it) under best.pt.
    import logging

    from libreyolo.engine import checkpoint as C
    from libreyolo.errors import WriteError

    C.save_checkpoint(tmp_path / "last.pt", _payload(epoch=1))
    C.save_checkpoint(tmp_path / "best.pt", _payload(epoch=0))
    before = (tmp_path / "best.pt").read_bytes()

    def full(obj, f, *a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(C.torch, "save", full)
    writer = C.BackgroundWriter()
    writer.submit(tmp_path / "last.pt", _payload(epoch=2), tag=2, copies=(tmp_path / "best.pt",))
    with caplog.at_level(logging.WARNING, logger="libreyolo"), pytest.raises(WriteError) as err:
        writer.wait()
    assert str(err.value).startswith(f"cannot write checkpoint {tmp_path / 'last.pt'}: No space left on device")
    assert [r.getMessage() for r in caplog.records] == [
        f"cannot write checkpoint {tmp_path / 'best.pt'}: the write of {tmp_path / 'last.pt'} it copies failed; "
        "the previous file is kept"]
    assert (tmp_path / "best.pt").read_bytes() == before and writer.written == {}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pt", "last.pt"]

