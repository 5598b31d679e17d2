"""FOMO on CUDA through the real step: sync-free, graphed training equal to eager to float32
rounding, and a graphed 2-epoch run of the command on the built-in `shapes`.

Graphed against eager: both start from the same weights and see the same batches at the family's
recipe (float32, batch 32 at 96 px, channels_last), cuDNN deterministic so both pick the same
kernels. The whole network is captured and replayed, so the two differ at most in the order of
float32 sums; the test prints the largest differences for docs/families.md and allows 1e-5
(relative), which still catches a capture bug (a stale input buffer or a lost BatchNorm update
changes results outright).
"""

import dataclasses
import json
import subprocess
import sys

import pytest
import torch
from testkit import sync_free_step, synthetic_batch

from libreyolo.config import build_config
from libreyolo.engine.builder import build_step_context, place_model
from libreyolo.engine.graphs import GraphManager
from libreyolo.engine.step import train_step
from libreyolo.families import get_family

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("deterministic_cudnn")]

DEVICE = torch.device("cuda")
SPEC = get_family("fomo")
RTOL = 1e-5


def _config(**over):
    return build_config({"model": "fomo-035", "imgsz": 96, "batch": 32, **over}, SPEC.defaults_for("035"))


def _context(cfg, init):
    model = SPEC.build("035", 10)
    model.load_state_dict(init)
    model = place_model(model, cfg, DEVICE).train()
    return model, build_step_context(cfg, SPEC, model, DEVICE)


def _batch(seed: int):
    return synthetic_batch(b=32, size=96, seed=seed, empty_first=seed == 0)  # 10 classes, as the model


def _flat(tensors):
    return torch.cat([t.detach().float().flatten() for t in tensors])


def _rel(a, b):
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


@pytest.mark.parametrize("amp", [False, True])
def test_step_has_no_host_sync(amp):
    torch.manual_seed(0)
    _, ctx = _context(_config(amp=amp, amp_dtype="bfloat16"), SPEC.build("035", 10).state_dict())
    assert torch.isfinite(sync_free_step(ctx, [_batch(i) for i in range(3)], _batch(5))).all()


def test_graphed_gradients_match_eager_to_float32_rounding():
    cfg = _config()
    assert (cfg.amp, cfg.channels_last, cfg.batch, cfg.imgsz) == (False, True, 32, 96)  # the recipe
    torch.manual_seed(0)
    init = SPEC.build("035", 10).state_dict()
    _, eager = _context(cfg, init)
    model, graphed = _context(cfg, init)
    manager = GraphManager.for_run(model, dataclasses.replace(cfg, cuda_graph=True), SPEC, DEVICE, graphed.precision)
    graphed.capturable = manager.step_callable
    start = _flat(eager.params)
    worst = 0.0
    for i in range(20):
        update = i % 2 == 1  # two micro-batches per update: gradient accumulation through replays
        a = train_step(eager, _batch(i % 4), update)
        b = train_step(graphed, _batch(i % 4), update)
        worst = max(worst, float(((a - b).abs() / a.abs().clamp_min(1e-6)).max()))
        torch.testing.assert_close(b, a, rtol=RTOL, atol=1e-6, msg=f"step {i}")
    update_rel = _rel(_flat(graphed.params) - start, _flat(eager.params) - start)
    train_step(eager, _batch(7), update=False)
    train_step(graphed, _batch(7), update=False)
    ge, gg = _flat([p.grad for p in eager.params]), _flat([p.grad for p in graphed.params])
    grad_rel = _rel(gg, ge)
    grad_max = float((gg - ge).abs().max() / ge.abs().max())  # largest difference, relative to the largest gradient
    stats = manager.stats()
    print(f"\n[fomo-035 float32 channels_last b32 96px] worst loss-item rel diff {worst:.2e}, weight-update rel L2 "
          f"{update_rel:.2e}, grad rel L2 {grad_rel:.2e}, grad max rel error {grad_max:.2e}, stats {stats}")
    assert update_rel < RTOL and grad_rel < RTOL and grad_max < RTOL
    assert stats["enabled"] and stats["replayed_steps"] == 19 and stats["eager_steps"] == 2
    assert stats["captured_shapes"] == [[32, 3, 96, 96]]


def test_cli_trains_graphed_on_the_builtin_set(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "libreyolo", "train", "model=fomo-035", "data=shapes", "epochs=2",
                           "cuda_graph=true", "workers=4", f"project={tmp_path}", "--json"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["task"] == "points" and 0.0 <= out["metrics"]["f1"] <= 1.0
    assert "CUDA graph captured for input" in proc.stderr and "training eager" not in proc.stderr
