"""Registry-driven, on CUDA: every classifier's step is sync-free under float16 and bfloat16,
its graphed step matches the eager one through the real step (the whole network captured), and
it trains from the command line on the built-in set."""

import dataclasses
import json
import subprocess
import sys

import pytest
import torch
from testkit import sync_free_step

from libreyolo.config import build_config
from libreyolo.data import ClassBatch, ClassTargets
from libreyolo.engine.builder import build_step_context, place_model
from libreyolo.engine.graphs import GraphManager
from libreyolo.engine.step import train_step
from libreyolo.families import REGISTRY, arch_name

pytestmark = pytest.mark.gpu
CLASSIFIERS = sorted(f for f, spec in REGISTRY.items() if "classify" in spec.tasks)
DEVICE = torch.device("cuda")


def _batch(seed: int, n: int = 16, size: int = 224, classes: int = 10) -> ClassBatch:
    gen = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=gen)
    return ClassBatch(images.pin_memory(), ClassTargets(torch.randint(0, classes, (n,), generator=gen)))


def _context(family: str, dropout: bool = True, **over):
    spec = REGISTRY[family]
    size = spec.sizes[0]
    cfg = build_config({"model": arch_name(spec, size), "batch": 16, **over}, spec.defaults_for(size))
    torch.manual_seed(0)
    model = place_model(spec.build(size, 10), cfg, DEVICE).train()
    if not dropout:
        _no_dropout(model)
    return cfg, spec, model, build_step_context(cfg, spec, model, DEVICE)


def _no_dropout(model):
    """Dropout draws a new mask each step, and a replay draws its own from the graph's RNG offsets:
    two runs compared step for step must have no random op. (timm's heads drop with F.dropout and
    a `drop_rate` attribute; torchvision's ResNet has none.)"""
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
        if hasattr(m, "drop_rate"):
            m.drop_rate = 0.0


@pytest.mark.parametrize("family", CLASSIFIERS)
@pytest.mark.parametrize("amp_dtype", ["float16", "bfloat16"])
def test_step_has_no_host_sync(family, amp_dtype):
    _, _, _, ctx = _context(family, amp=True, amp_dtype=amp_dtype)
    assert torch.isfinite(sync_free_step(ctx, [_batch(i) for i in range(3)], _batch(5))).all()


@pytest.mark.parametrize("family", CLASSIFIERS)
def test_graphed_step_matches_eager(family):
    saved = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        cfg, spec, _, eager = _context(family, dropout=False, amp=True, amp_dtype="bfloat16")
        _, _, model, graphed = _context(family, dropout=False, amp=True, amp_dtype="bfloat16")
        manager = GraphManager.for_run(model, dataclasses.replace(cfg, cuda_graph=True), spec, DEVICE,
                                       graphed.precision)
        graphed.capturable = manager.step_callable
        for i in range(10):
            a = train_step(eager, _batch(i % 3), update=i % 2 == 1)
            b = train_step(graphed, _batch(i % 3), update=i % 2 == 1)
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5, msg=f"step {i}")
        stats = manager.stats()
        assert stats["enabled"] and stats["replayed_steps"] == 8 and stats["captured_shapes"] == [[16, 3, 224, 224]]
    finally:
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved


def test_dropout_draws_a_new_mask_on_every_replay():
    """MobileNetV4 trains with dropout 0.3 before its classifier: a replayed graph must not reuse
    the captured mask. Through the real step on one batch without optimizer updates (the weights
    stay put, BatchNorm normalises with the batch's own statistics), dropout is the only thing
    that can change the loss from one replay to the next."""
    cfg, spec, model, ctx = _context("mobilenetv4", amp=True, amp_dtype="bfloat16")
    manager = GraphManager.for_run(model, dataclasses.replace(cfg, cuda_graph=True), spec, DEVICE, ctx.precision)
    ctx.capturable = manager.step_callable
    batch = _batch(0)
    losses = [train_step(ctx, batch, update=False) for _ in range(6)]
    assert manager.stats()["replayed_steps"] == 4  # the third call captures and replays
    replayed = torch.stack(losses[2:]).flatten()
    assert torch.isfinite(replayed).all() and len(set(replayed.tolist())) == 4, replayed


@pytest.mark.parametrize("family", CLASSIFIERS)
def test_cli_trains_graphed_on_the_builtin_set(family, tmp_path):
    spec = REGISTRY[family]
    arch = arch_name(spec, spec.sizes[0])
    proc = subprocess.run([sys.executable, "-m", "libreyolo", "train", f"model={arch}", "data=shapes-cls",
                           "epochs=2", "batch=32", "cuda_graph=true", "workers=4", f"project={tmp_path}", "--json"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["task"] == "classify" and 0.0 <= out["metrics"]["top1"] <= 1.0
    assert "CUDA graph captured for input" in proc.stderr and "training eager" not in proc.stderr
