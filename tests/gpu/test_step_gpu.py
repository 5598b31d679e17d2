"""The real training step on CUDA: sync-free, precision behaviour, finite training (issues 3, 4)."""

import pytest
import torch
from testkit import synthetic_batch

from libreyolo.config import build_config
from libreyolo.engine.builder import build_step_context
from libreyolo.engine.step import train_step
from libreyolo.families import get_family


def _batch(**kw):
    return synthetic_batch(empty_first=True, **kw)


pytestmark = pytest.mark.gpu


def _ctx(amp=True, amp_dtype="float16", **extra):
    spec = get_family("yolo9")
    cfg = build_config({"model": "yolo9-t", "amp": amp, "amp_dtype": amp_dtype, "batch": 8, "imgsz": 256, **extra})
    torch.manual_seed(0)
    model = spec.build("t", 10).cuda().train()
    return build_step_context(cfg, spec, model, torch.device("cuda")), model


@pytest.mark.parametrize("amp_dtype", ["float16", "bfloat16"])
def test_steady_state_step_is_sync_free(amp_dtype):
    ctx, _ = _ctx(amp_dtype=amp_dtype)
    batch = _batch()
    for _ in range(3):  # warm-up: allocator, cuDNN autotune, anchor caches
        train_step(ctx, batch, update=True)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(10):
            items = train_step(ctx, batch, update=True)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert torch.isfinite(items).all()


def test_interval_read_backs_within_an_epoch_do_not_sync():
    """The loop's loss read-back is deferred on CUDA (engine/meter.py): steps, their items and the
    interval reads before the epoch's last one run under sync debug mode "error"; the final read
    then holds every step's items."""
    from libreyolo.engine.meter import LossMeter

    ctx, _ = _ctx()
    batch = _batch()
    meter = LossMeter(tuple(ctx.criterion.item_names), torch.device("cuda"))
    assert meter.deferred and meter._host[0].is_pinned()
    for _ in range(3):
        train_step(ctx, batch, update=True)
    torch.cuda.synchronize()
    seen, shown = [], []
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step in range(12):
            items = train_step(ctx, batch, update=True)
            meter.add(items, images=8)
            seen.append(items.clone())
            if (step + 1) % 4 == 0 and step < 11:
                meter.read(True, f"epoch 1, step {step + 1}", lambda: "")
                shown.append((meter.last_log, meter.epoch_means()))  # host figures only
    finally:
        torch.cuda.set_sync_debug_mode(0)
    meter.read(True, "epoch 1, step 12", lambda: "", final=True)

    def mean(xs):
        return torch.stack([x for x in xs if torch.isfinite(x).all()]).mean(0).tolist()
    # Deferred (sync debug mode does not flag an event wait, so these say the read did not settle
    # at once): nothing shown after the first read, steps 1-4 after the second, all after the final.
    assert shown[0][0] is None
    assert list(shown[1][1].values()) == pytest.approx(mean(seen[:4]), rel=1e-5)
    assert list(meter.epoch_means().values()) == pytest.approx(mean(seen), rel=1e-5)
    assert meter.last_log["img_s"] > 0 and meter.last_log["mem_gb"] > 0


def test_float16_scaler_is_live_and_skips_an_overflow():
    ctx, model = _ctx(amp_dtype="float16")
    assert ctx.precision.scaler_enabled and ctx.precision.describe() == "float16 autocast, scaler on"
    batch = _batch()
    for _ in range(3):  # the first steps may overflow while the scale calibrates from 2**16
        train_step(ctx, batch, update=True)
    scale0, skipped0 = ctx.precision.scaler.get_scale(), ctx.precision.skipped_steps()
    before = [p.detach().clone() for p in model.parameters()]
    # Plant an overflow: the next backward sees an infinite loss.
    criterion = ctx.criterion

    def planted(preds, targets):
        loss, items = criterion(preds, targets)
        return loss * float("inf"), items

    ctx.criterion = planted
    train_step(ctx, batch, update=True)
    ctx.criterion = criterion
    assert ctx.precision.scaler.get_scale() == scale0 / 2
    assert ctx.precision.skipped_steps() == skipped0 + 1
    assert all(torch.equal(a, b.detach()) for a, b in zip(before, model.parameters())), "skipped step changed weights"
    state = ctx.precision.state_dict()
    assert state["scaler_enabled"] and state["skipped"] == skipped0 + 1


def test_bfloat16_has_no_scaler():
    ctx, _ = _ctx(amp_dtype="bfloat16")
    assert not ctx.precision.scaler_enabled
    assert ctx.precision.describe() == "bfloat16 autocast, scaler off"


@pytest.mark.parametrize("amp,amp_dtype", [(True, "float16"), (True, "bfloat16"), (False, "float16")])
def test_fifty_steps_finite_and_decreasing(amp, amp_dtype):
    ctx, model = _ctx(amp=amp, amp_dtype=amp_dtype, lr0=0.01, warmup_epochs=0.0)
    batch = _batch(seed=1)
    losses = []
    for _ in range(50):
        losses.append(train_step(ctx, batch, update=True).sum())
    losses = torch.stack(losses).cpu()
    assert torch.isfinite(losses).all()
    assert losses[-5:].mean() < 0.7 * losses[:5].mean()
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_the_checkpoint_copy_of_a_cuda_state_is_exact_and_leaves_in_a_few_transfers(monkeypatch):
    # engine/state._copied: a GPU's tensors are concatenated there by dtype and copied to the
    # packed CPU buffers in one transfer per run (a copy to the host waits for the device).
    from libreyolo.engine import state

    ctx, model = _ctx()
    train_step(ctx, _batch(), update=True)
    live = {"model": model.state_dict(), "optimizer": ctx.optimizer.state_dict()}
    transfers = []
    real_cat = torch.cat
    monkeypatch.setattr(torch, "cat", lambda ts, *a, **k: transfers.append(len(ts)) or real_cat(ts, *a, **k))
    copy = state._copied(live)
    monkeypatch.undo()
    flat_live, flat_copy = [], []
    from libreyolo.engine.checkpoint import map_tensors

    map_tensors(live, flat_live.append)
    map_tensors(copy, flat_copy.append)
    assert len(flat_copy) == len(flat_live) > 1000
    for got, want in zip(flat_copy, flat_live):
        assert got.device.type == "cpu" and got.dtype == want.dtype and torch.equal(got, want.cpu())
    on_gpu = sum(t.is_cuda for t in flat_live)
    assert sum(transfers) == on_gpu and len(transfers) <= 8, transfers


@pytest.mark.usefixtures("deterministic_cudnn")
@pytest.mark.parametrize("amp_dtype", ["float16", "bfloat16"])
def test_handed_over_gradients_train_as_autograds_own_adds(amp_dtype):
    """The eager step's GradHandoff (on for CUDA runs without graphs): the same weights over 8 steps
    of two micro-batches each as the step without it."""
    import copy

    handed, model = _ctx(amp_dtype=amp_dtype)
    assert handed.handoff is not None
    spec = get_family("yolo9")
    plain = build_step_context(build_config({"model": "yolo9-t", "amp": True, "amp_dtype": amp_dtype, "batch": 8,
                                             "imgsz": 256}), spec, copy.deepcopy(model), torch.device("cuda"))
    plain.handoff = None
    for a, b in zip(handed.params, plain.params):
        b.data.copy_(a.data)
    for i in range(16):
        batch = _batch(seed=i % 4)
        x = train_step(handed, batch, update=i % 2 == 1)
        y = train_step(plain, batch, update=i % 2 == 1)
        assert torch.equal(x, y), f"step {i}"
    for a, b in zip(handed.params, plain.params):
        assert torch.equal(a, b)
