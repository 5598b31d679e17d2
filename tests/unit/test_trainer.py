"""Trainer behaviour that needs a real (tiny) run: non-finite loss stop, results.csv semantics."""

import csv

import pytest
import torch

from libreyolo import LibreYOLO
from libreyolo.engine.meter import NonFiniteLossError
from libreyolo.families.yolo9.loss import YOLO9Loss

# Tiny tensors gain nothing from intra-op threads, and on a busy 2-core runner two threads made
# one of these tests take 75 s instead of 12 (conftest.py, `one_thread`).
pytestmark = pytest.mark.usefixtures("one_thread")

TINY = dict(data="shapes", imgsz=64, batch=8, device="cpu", workers=0, amp=False, val=False, log_interval=10)


def _small(tmp_path, **kw):
    """TINY on 16 shapes images (4 to validate): two steps an epoch, for the tests of what an epoch
    or a run does around its steps (results.csv, timings, checkpoints, resume), not of the steps."""
    from testkit import shapes_subset

    (tmp_path / "data").mkdir(exist_ok=True)
    return {**TINY, "data": shapes_subset(tmp_path / "data", 16), **kw}


def test_nonfinite_loss_stops_with_one_line_and_keeps_last_good(tmp_path, monkeypatch):
    calls = {"n": 0}
    original = YOLO9Loss.__call__

    def poisoned(self, preds, targets):
        loss, items = original(self, preds, targets)
        calls["n"] += 1
        if calls["n"] > 20:  # epoch 2 (16 steps per epoch), step 5 onwards
            return loss * float("nan"), items * float("nan")
        return loss, items

    monkeypatch.setattr(YOLO9Loss, "__call__", poisoned)
    with pytest.raises(NonFiniteLossError) as err:
        LibreYOLO("yolo9-t").train(epochs=3, project=str(tmp_path), **TINY)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("non-finite loss at epoch 2, step 10 (6 of the last 10 steps)")
    last = tmp_path / "exp" / "weights" / "last.pt"
    assert f"the last good state is {last} (end of epoch 1)" in message
    ckpt = torch.load(last, weights_only=True)
    assert ckpt["epoch"] == 0 and all(torch.isfinite(v).all() for v in ckpt["model"].values() if v.is_floating_point())


def _deferred_meter(monkeypatch):
    """The CUDA read-back (deferred by one interval) on the CPU."""
    from libreyolo.engine import meter

    init = meter.LossMeter.__init__
    monkeypatch.setattr(meter.LossMeter, "__init__", lambda self, names, device, deferred=None:
                        init(self, names, device, deferred=True))


def test_deferred_read_back_logs_the_same_losses(tmp_path, monkeypatch):
    """Two epochs of 16 steps with log_interval 5 (reads at 5, 10, 15 and the final 16): the epoch
    losses the deferred meter logs are the synchronous meter's."""
    rows = {}
    for mode in ("sync", "deferred"):
        if mode == "deferred":
            _deferred_meter(monkeypatch)
        result = LibreYOLO("yolo9-t").train(epochs=2, project=str(tmp_path), name=mode, **{**TINY, "log_interval": 5})
        with (result.run_dir / "results.csv").open() as f:
            rows[mode] = [{k: v for k, v in r.items() if k.startswith("train/")} for r in csv.DictReader(f)]
    assert len(rows["sync"]) == 2 and rows["deferred"] == rows["sync"]


def test_deferred_read_back_names_the_interval_the_loss_went_bad_in(tmp_path, monkeypatch):
    _deferred_meter(monkeypatch)
    calls = {"n": 0}
    original = YOLO9Loss.__call__

    def poisoned(self, preds, targets):
        loss, items = original(self, preds, targets)
        calls["n"] += 1
        return (loss * float("nan"), items * float("nan")) if calls["n"] == 23 else (loss, items)

    monkeypatch.setattr(YOLO9Loss, "__call__", poisoned)
    with pytest.raises(NonFiniteLossError) as err:  # caught at step 16's (final) read, named by its own
        LibreYOLO("yolo9-t").train(epochs=3, project=str(tmp_path), **TINY)
    # Poisoned at epoch 2's step 7; without accumulation (accumulate=auto in this short run) its
    # optimizer step makes the weights NaN, so steps 7-10 of the interval are non-finite.
    assert str(err.value).startswith("non-finite loss at epoch 2, step 10 (4 of the last 10 steps)")
    assert "(end of epoch 1)" in str(err.value) and calls["n"] == 32


def test_results_csv_blank_metrics_on_epochs_without_validation(tmp_path):
    result = LibreYOLO("yolo9-t").train(epochs=3, project=str(tmp_path), eval_interval=2,
                                        **_small(tmp_path, val=True))
    with (result.run_dir / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["map50_95"] != "" for r in rows] == [False, True, True]  # epoch 2 and the last
    assert set(rows[0]) >= {"epoch", "train/box", "train/cls", "train/dfl", "lr", "seconds", "skipped_steps"}


def test_family_set_epoch_reason_invalidates_graphs(tmp_path, monkeypatch, caplog):
    """A family whose captured computation changes at an epoch says so; the trainer re-arms graphs."""
    import logging

    from libreyolo.engine.graphs import GraphManager
    from libreyolo.families.yolo9.net import YOLO9Model

    seen, invalidated = [], []
    monkeypatch.setattr(YOLO9Model, "set_epoch", lambda self, epoch, cfg: seen.append(epoch) or
                        ("l1 branch on" if epoch == 1 else None), raising=False)
    monkeypatch.setattr(GraphManager, "invalidate", lambda self, reason: invalidated.append(reason))
    with caplog.at_level(logging.INFO, logger="libreyolo"):
        LibreYOLO("yolo9-t").train(epochs=2, project=str(tmp_path), **_small(tmp_path))
    assert seen == [0, 1] and invalidated == ["l1 branch on"]
    assert "epoch 2: l1 branch on" in caplog.text


def test_resume_of_an_optimizer_state_that_does_not_fit_is_one_line(tmp_path):
    """A checkpoint from before the flat optimizer holds one state entry per parameter."""
    from libreyolo.errors import CheckpointError

    result = LibreYOLO("yolo9-t").train(epochs=2, project=str(tmp_path), **_small(tmp_path))
    ckpt = torch.load(result.last, weights_only=True)
    ckpt["epoch"] = 0
    group = ckpt["optimizer"]["param_groups"][0]
    group["params"] = list(range(100, 100 + 40))  # per-parameter layout: 40 tensors, not 1
    old = tmp_path / "old.pt"
    torch.save(ckpt, old)
    with pytest.raises(CheckpointError) as err:
        LibreYOLO("yolo9-t").train(resume=str(old))
    assert "\n" not in str(err.value) and "fine-tune from its weights" in str(err.value)


def test_a_detached_training_state_shares_no_tensor_with_the_trainer(tmp_path, monkeypatch):
    """What the checkpoint thread writes while training goes on: nothing in it may change."""
    from libreyolo.engine.state import training_state
    from libreyolo.engine.trainer import Trainer

    checked = []
    submit = Trainer.save_in_background

    def check(self, *paths):  # at the epoch's end, on the live trainer
        live = list(_tensors(self.optimizer.state_dict())) + list(self.model.parameters())
        assert live and any(t.numel() > 1 for t in _tensors(self.optimizer.state_dict()["state"]))
        ptrs = {t.untyped_storage().data_ptr() for t in live}
        state = training_state(self, detached=True)
        checked.append(not {t.untyped_storage().data_ptr() for t in _tensors(state)} & ptrs)
        assert {t.untyped_storage().data_ptr() for t in _tensors(training_state(self))} & ptrs  # the plain one shares
        submit(self, *paths)

    monkeypatch.setattr(Trainer, "save_in_background", check)
    LibreYOLO("yolo9-t").train(epochs=1, project=str(tmp_path), **_small(tmp_path))
    assert checked == [True]


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)


def test_an_epoch_that_improves_serialises_its_state_once_for_last_and_best(tmp_path, monkeypatch):
    """best.pt is a byte copy of the last.pt just written (checkpoint.copy_checkpoint), and the
    weights are checked finite a buffer at a time, not a tensor at a time (about 2,200 for
    YOLOv9-t's weights and EMA)."""
    from libreyolo.engine import checkpoint as C
    from libreyolo.engine.trainer import Trainer

    saves, checks = [], []
    real_save, real_isfinite, submit = C.torch.save, torch.isfinite, Trainer.save_in_background
    monkeypatch.setattr(C.torch, "save", lambda obj, f, *a, **k: saves.append(obj["epoch"]) or real_save(obj, f, *a, **k))

    def counted(self, *paths):
        monkeypatch.setattr(torch, "isfinite", lambda t: checks.append(1) or real_isfinite(t))
        try:
            submit(self, *paths)
        finally:
            monkeypatch.setattr(torch, "isfinite", real_isfinite)

    monkeypatch.setattr(Trainer, "save_in_background", counted)
    result = LibreYOLO("yolo9-t").train(epochs=1, project=str(tmp_path), **_small(tmp_path, val=True))
    weights = result.run_dir / "weights"
    assert saves == [0] and (weights / "best.pt").read_bytes() == (weights / "last.pt").read_bytes()
    assert 0 < len(checks) <= 4  # model and EMA: a float32 buffer each


def test_a_failed_checkpoint_write_stops_the_run_with_one_line(tmp_path, monkeypatch):
    """Written on the checkpoint thread, a failed last.pt surfaces at the next epoch's checkpoint."""
    from libreyolo.engine import checkpoint as C
    from libreyolo.errors import WriteError

    real = C.save_checkpoint

    def disk_full_at_first(path, payload, **kw):
        if payload["epoch"] == 0:
            raise OSError(28, "No space left on device")
        return real(path, payload, **kw)

    monkeypatch.setattr(C, "save_checkpoint", disk_full_at_first)
    with pytest.raises(WriteError) as err:
        LibreYOLO("yolo9-t").train(epochs=3, project=str(tmp_path), name="full", **_small(tmp_path))
    last = tmp_path / "full" / "weights" / "last.pt"
    assert str(err.value) == f"cannot write checkpoint {last}: No space left on device (ENOSPC: the disk is full)"
    assert not last.exists()


def test_run_timings_cover_epochs_validation_and_checkpoints(tmp_path):
    # Also: the loop runs with the objects alive at its start frozen out of the garbage
    # collector's passes (trainer.settled_heap), and gives them back when it ends.
    import gc
    import json

    from libreyolo.engine.hooks import Hook

    frozen = []

    class Look(Hook):
        def after_epoch(self, trainer) -> None:
            frozen.append(gc.get_freeze_count())

    assert gc.get_freeze_count() == 0
    result = LibreYOLO("yolo9-t").train(epochs=3, project=str(tmp_path), eval_interval=3, hooks=[Look()],
                                        **_small(tmp_path, val=True))
    assert len(frozen) == 3 and min(frozen) > 100_000 and gc.get_freeze_count() == 0
    t = result.timings
    assert json.loads((result.run_dir / "timings.json").read_text()) == t
    assert len(t["epochs_s"]) == 3 and t["first_epoch_s"] == t["epochs_s"][0]
    later = t["epochs_s"][1:]
    assert t["steady_epoch_s"] == pytest.approx(sum(later) / 2, abs=1e-3)  # the median of two
    assert t["first_epoch_overhead_s"] == pytest.approx(t["first_epoch_s"] - t["steady_epoch_s"], abs=1e-3)
    assert t["validation_s"] > 0 and t["val_img_s"] > 0  # one validation of the 4 val images
    assert t["checkpoint_s"] > 0  # last.pt every epoch, best.pt once
    assert t["created_unix"] <= t["first_step_unix"]
    assert t["train_s"] >= sum(t["epochs_s"]) + t["validation_s"]


@pytest.mark.parametrize("key,epochs,sizes,deterministic,expected", [
    ("auto", 5, 1, False, False), ("auto", 20, 1, False, True), ("auto", 20, 21, False, False),
    (True, 5, 1, False, True), (False, 50, 1, False, False), (True, 50, 1, True, False)])
def test_cudnn_autotune_policy(key, epochs, sizes, deterministic, expected):
    from libreyolo.config import build_config
    from libreyolo.engine.builder import cudnn_autotune

    cfg = build_config({"cudnn_benchmark": key, "epochs": epochs, "deterministic": deterministic})
    on, line = cudnn_autotune(cfg, 100, sizes)  # 100 steps per epoch
    assert on is expected
    assert (line is not None) == (key == "auto" and not deterministic)


@pytest.mark.parametrize("on,limit", [(True, 3), (False, 10), (True, 0)])
def test_set_cudnn_autotune_sets_switch_and_limit(on, limit):
    from libreyolo.config import build_config
    from libreyolo.engine.builder import set_cudnn_autotune

    saved = torch.backends.cudnn.benchmark, torch.backends.cudnn.benchmark_limit
    try:
        set_cudnn_autotune(build_config({"cudnn_benchmark_limit": limit}), on)
        assert (torch.backends.cudnn.benchmark, torch.backends.cudnn.benchmark_limit) == (on, limit)
    finally:
        torch.backends.cudnn.benchmark, torch.backends.cudnn.benchmark_limit = saved


def test_step_context_outside_the_trainer_resolves_optimizer_auto():
    """bench, tests and host_diag build a step context from a config whose optimizer is still
    `auto`: they get what auto gives a short run."""
    from libreyolo.config import build_config
    from libreyolo.engine.builder import build_step_context
    from libreyolo.families import get_family

    spec = get_family("yolo9")
    model = spec.build("t", 10)
    ctx = build_step_context(build_config({"device": "cpu"}), spec, model, torch.device("cpu"))
    assert isinstance(ctx.optimizer, torch.optim.AdamW)
    assert ctx.optimizer.param_groups[0]["lr"] == pytest.approx(0.000714)


def test_resume_of_a_checkpoint_with_the_best_epoch_at_the_top_level_keeps_it(tmp_path):
    """Checkpoints written before the validation hook kept its own state held best_fitness and
    best_epoch at the top level: a resume from one must not forget which epoch was best (its next
    validation would otherwise overwrite best.pt with whatever it measures)."""
    from libreyolo.engine import hooks

    result = LibreYOLO("yolo9-t").train(epochs=3, project=str(tmp_path), **_small(tmp_path))
    ckpt = torch.load(result.last, weights_only=True)
    ckpt["epoch"] = 0
    ckpt["hooks"].pop("ValidationHook")
    ckpt.update(best_fitness=0.5, best_epoch=0)
    old = tmp_path / "old.pt"
    torch.save(ckpt, old)
    seen = []

    class Probe(hooks.Hook):
        def before_train(self, trainer):
            seen.append(next(h for h in trainer.hooks if isinstance(h, hooks.ValidationHook)).state_dict())
            trainer.stop = True

    LibreYOLO("yolo9-t").train(resume=str(old), hooks=[Probe()])
    assert seen == [{"best_fitness": 0.5, "best_epoch": 0}]


def test_recipe_auto_trains_a_short_run_with_the_generic_augmentation(tmp_path, caplog):
    """The trainer resolves recipe=auto once the run's length is known, the loader augments with
    the result, and the checkpoint holds it (so a resume does not choose again)."""
    import logging

    from testkit import shapes_subset

    from libreyolo.engine.hooks import Hook

    seen = {}

    class Look(Hook):
        def before_train(self, trainer) -> None:
            seen.update(hyp=dict(trainer.train_loader.dataset.hyp), mixup=trainer.train_loader.sampler.mixup,
                        tau=trainer.ema.tau)

    data = shapes_subset(tmp_path, 8)
    with caplog.at_level(logging.INFO, logger="libreyolo"):
        result = LibreYOLO("yolo9-t").train(epochs=1, project=str(tmp_path), hooks=[Look()],
                                            **{**TINY, "data": data, "degrees": 3.0, "ema_tau": 50})
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("recipe=auto")]
    assert len(lines) == 1 and "scale=0.5 mixup=0.0 no_aug_epochs=10 instead of YOLOv9's published" in lines[0]
    assert seen["hyp"]["scale"] == 0.5 and seen["hyp"]["degrees"] == 3.0 and seen["mixup"] == 0.0
    # The closing is said once, with the count the run trains with (the generic 10), not with the
    # published 15 of the config the loader was built with before the recipe was chosen.
    said = [r.getMessage() for r in caplog.records if "mosaic and mixup" in r.getMessage()]
    assert said == ["mosaic and mixup off: epochs=1 <= no_aug_epochs=10"]
    saved = torch.load(result.last, weights_only=False)["config"]
    assert (saved["recipe"], saved["scale"], saved["optimizer"]) == ("generic", 0.5, "adamw")
    assert saved["no_aug_epochs"] == 10
    assert seen["tau"] == saved["ema_tau"] == 50.0  # the EMA the run kept ramps as the key says


@pytest.mark.parametrize("fail", [False, True], ids=["done", "error"])
def test_the_loaders_worker_processes_stop_when_training_ends(tmp_path, fail):
    """Persistent workers stop when train() returns or raises, even while something still holds
    the trainer (here a hook): left to the loader's collection, a cycle kept them to the
    interpreter's exit, where each one's join took torch's 5 s timeout."""
    from libreyolo.engine.hooks import Hook

    held = {}

    class Hold(Hook):
        def before_train(self, trainer) -> None:
            held["trainer"] = trainer

        def after_epoch(self, trainer) -> None:
            held["workers"] = list(trainer.train_loader.loader._iterator._workers)
            if fail:
                raise RuntimeError("a failure after the first epoch")

    kw = _small(tmp_path, workers=2, val=True, epochs=1, project=str(tmp_path / "runs"))
    if fail:
        with pytest.raises(RuntimeError, match="a failure after the first epoch"):
            LibreYOLO("yolo9-t").train(hooks=[Hold()], **kw)
    else:
        LibreYOLO("yolo9-t").train(hooks=[Hold()], **kw)
    trainer = held["trainer"]
    assert held["workers"] and not any(w.is_alive() for w in held["workers"])
    assert trainer.train_loader.loader._iterator is None and trainer.val_loader.loader._iterator is None
