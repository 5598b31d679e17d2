"""CUDA graphs on a real GPU (issue 6): YOLOv9-t at 256, graphed vs eager through the real step.

Both runs start from the same weights and see the same batches; cuDNN is put in deterministic
mode so the two runs pick the same kernels, leaving graph-vs-eager as the only difference.

Tolerance: a replay launches the very kernels eager launches, on the same inputs, so with
deterministic cuDNN the two runs agree to rounding. Measured on the H200 (torch 2.11, cuDNN 9.19):
loss items and the 20-step weight updates identical (0.0) in float32, float16 and bfloat16, and
the gradients of one more micro-batch within 1e-9 relative L2 in float32 (0.0 under autocast).
We allow 1e-5 (relative) for every check, which leaves room for another GPU's kernel choice while
still catching a capture bug (a stale buffer or a lost BN update changes results outright).
"""

import dataclasses

import pytest
import torch
from testkit import synthetic_batch

from libreyolo.config import build_config
from libreyolo.engine.builder import build_step_context
from libreyolo.engine.graphs import GraphManager
from libreyolo.engine.step import train_step
from libreyolo.families import get_family

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("deterministic_cudnn")]

DEVICE = torch.device("cuda")
RTOL = 1e-5


def _contexts(amp=True, amp_dtype="float16", channels_last=False, max_graphs=1, family="yolo9", size="t"):
    """(eager context, graphed context, manager) from the same initial weights."""
    spec = get_family(family)
    cfg = build_config({"model": f"{family}-{size}", "amp": amp, "amp_dtype": amp_dtype, "batch": 8,
                        "imgsz": 256, "channels_last": channels_last}, spec.defaults)
    torch.manual_seed(0)
    init = spec.build(size, 10).state_dict()
    out = []
    for _ in range(2):
        model = spec.build(size, 10)
        model.load_state_dict(init)
        model = model.to(DEVICE).train()
        if channels_last:
            model = model.to(memory_format=torch.channels_last)
        out.append((model, build_step_context(cfg, spec, model, DEVICE)))
    (_, eager), (model, graphed) = out
    manager = GraphManager.for_run(model, dataclasses.replace(cfg, cuda_graph=True), spec, DEVICE,
                                   graphed.precision)
    manager.max_graphs = max_graphs
    graphed.capturable = manager.step_callable
    assert manager.enabled and graphed.capturable is manager
    return eager, graphed, manager


def _flat(tensors):
    return torch.cat([t.detach().float().flatten() for t in tensors])


def _flat_grads(ctx):
    return _flat([p.grad for p in ctx.params])


def _rel(a, b):
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


@pytest.mark.parametrize("amp, amp_dtype, channels_last", [
    (False, "float16", False), (True, "float16", False), (True, "bfloat16", False), (True, "bfloat16", True)])
def test_graphed_training_matches_eager(amp, amp_dtype, channels_last):
    eager, graphed, manager = _contexts(amp, amp_dtype, channels_last)
    key = amp_dtype if amp else None
    init = _flat(eager.params)
    worst = 0.0
    for i in range(20):
        batch = synthetic_batch(seed=i % 4)
        update = i % 2 == 1  # two micro-batches per update: gradient accumulation through replays
        a = train_step(eager, batch, update)
        b = train_step(graphed, batch, update)
        worst = max(worst, float(((a - b).abs() / a.abs().clamp_min(1e-6)).max()))
        torch.testing.assert_close(b, a, rtol=RTOL, atol=1e-5, msg=f"step {i}")
    # What 20 steps did to the weights (float16 steps skipped for overflow are skipped in both).
    update_rel = _rel(_flat(graphed.params) - init, _flat(eager.params) - init)
    train_step(eager, synthetic_batch(seed=7), update=False)
    train_step(graphed, synthetic_batch(seed=7), update=False)
    ge, gg = _flat_grads(eager), _flat_grads(graphed)
    # A float16 micro-batch can still overflow at the current loss scale (inf in both runs).
    grad_rel = _rel(gg, ge) if torch.isfinite(ge).all() else None
    stats = manager.stats()
    print(f"\n[{key or 'float32'}{' channels_last' if channels_last else ''}] worst loss-item rel diff "
          f"{worst:.2e}, weight-update rel L2 {update_rel:.2e}, grad rel L2 {grad_rel}, stats {stats}")
    assert update_rel < RTOL
    assert grad_rel is None or grad_rel < RTOL
    assert stats["enabled"] and stats["replayed_steps"] == 19 and stats["eager_steps"] == 2
    assert stats["captured_shapes"] == [[8, 3, 256, 256]] and stats["pool_mb"] > 0


@pytest.mark.parametrize("family, size", [("yolox", "t"), ("rtmdet", "t"), ("yolo7", "t"), ("yolonas", "s")])
def test_other_families_graphed_match_eager(family, size):
    """YOLOX, RTMDet, YOLOv7 and YOLO-NAS through the same check (bfloat16, channels_last, 10 steps).
    RTMDet's head convs are shared across the three pyramid levels, so their gradient is a sum of
    three contributions: its relative difference, graphed vs eager, is printed for the docs."""
    eager, graphed, manager = _contexts(True, "bfloat16", True, family=family, size=size)
    for i in range(10):
        batch = synthetic_batch(seed=i % 4)
        a = train_step(eager, batch, update=i % 2 == 1)
        b = train_step(graphed, batch, update=i % 2 == 1)
        torch.testing.assert_close(b, a, rtol=RTOL, atol=1e-5, msg=f"step {i}")
    train_step(eager, synthetic_batch(seed=7), update=False)
    train_step(graphed, synthetic_batch(seed=7), update=False)
    grad_rel = _rel(_flat_grads(graphed), _flat_grads(eager))
    shared = ""
    if family == "rtmdet":
        pairs = [(mg.conv.weight.grad, me.conv.weight.grad)
                 for heads in ("cls_convs", "reg_convs")
                 for mg, me in zip(getattr(graphed.model.net.head, heads), getattr(eager.model.net.head, heads))]
        shared = f", shared head conv grads rel L2 max {max(_rel(g, e) for g, e in pairs):.2e}"
    print(f"\n[{family}-{size} bfloat16 channels_last] grad rel L2 {grad_rel:.2e}{shared}, stats {manager.stats()}")
    assert grad_rel < RTOL
    assert manager.stats()["replayed_steps"] == 9


def test_planted_capture_failure_falls_back_and_the_run_completes(caplog):
    eager, graphed, manager = _contexts()
    net = graphed.model.capturable

    def sync_while_capturing(module, args, output):
        if torch.cuda.is_current_stream_capturing():
            output[0].sum().item()  # a host sync: illegal during capture

    handle = net.head.register_forward_hook(sync_while_capturing)
    for i in range(8):
        items = train_step(graphed, synthetic_batch(seed=i), update=True)
        train_step(eager, synthetic_batch(seed=i), update=True)
    handle.remove()
    torch.cuda.synchronize()
    stats = manager.stats()
    print(f"\nfallback: {stats['fallback_reason']}")
    assert not stats["enabled"] and stats["fallback_reason"].startswith("CUDA graph capture failed")
    assert stats["replayed_steps"] == 0 and torch.isfinite(items).all()
    # Eager from the failure on: same weights as the all-eager run.
    for p, q in zip(graphed.params, eager.params):
        torch.testing.assert_close(p, q, rtol=1e-3, atol=1e-4)


def test_failed_backward_replay_recomputes_and_continues_eager():
    # bfloat16: no loss scale, so six accumulated micro-batches cannot overflow.
    eager, graphed, manager = _contexts(amp_dtype="bfloat16")
    for i in range(3):
        train_step(eager, synthetic_batch(seed=i), update=False)
        train_step(graphed, synthetic_batch(seed=i), update=False)
    [shape] = manager._graphs.values()

    class Broken:
        def replay(self):
            raise RuntimeError("planted backward replay failure")

    shape.backward_graph = Broken()
    for i in range(3, 6):
        train_step(eager, synthetic_batch(seed=i), update=False)
        train_step(graphed, synthetic_batch(seed=i), update=False)
    stats = manager.stats()
    assert "planted backward replay failure" in stats["fallback_reason"]
    assert stats["replayed_steps"] == 2  # the capturing step, and the step whose backward failed
    # The failed step's gradients were recomputed eagerly from the replayed forward's inputs.
    rel = _rel(_flat_grads(graphed), _flat_grads(eager))
    print(f"\nrecomputed-step grad rel L2 vs eager: {rel:.2e}")
    assert rel < 1e-3


def test_multi_size_inputs_never_crash():
    _, graphed, manager = _contexts(max_graphs=2)
    sizes = [(8, 224), (8, 256), (8, 288), (8, 256), (5, 256), (8, 224)]
    for i in range(24):
        b, s = sizes[i % len(sizes)]
        items = train_step(graphed, synthetic_batch(b=b, size=s, seed=i), update=i % 2 == 1)
        assert torch.isfinite(items).all()
    stats = manager.stats()
    print(f"\nmulti-size: {stats}")
    assert stats["enabled"] and 1 <= len(stats["captured_shapes"]) <= 2
    assert stats["replayed_steps"] + stats["eager_steps"] == 24


def test_last_partial_batch_runs_eager_and_replay_resumes():
    _, graphed, manager = _contexts()
    for i in range(6):
        train_step(graphed, synthetic_batch(seed=i), update=True)
    before = manager.stats()
    train_step(graphed, synthetic_batch(b=5, seed=6), update=True)  # the epoch's last, partial batch
    after = manager.stats()
    assert after["replayed_steps"] == before["replayed_steps"]
    assert after["eager_steps"] == before["eager_steps"] + 1
    train_step(graphed, synthetic_batch(seed=7), update=True)
    assert manager.stats()["replayed_steps"] == before["replayed_steps"] + 1


def test_replayed_steps_are_sync_free():
    _, graphed, manager = _contexts()
    batches = [synthetic_batch(seed=i) for i in range(4)]
    for i in range(4):
        train_step(graphed, batches[i], update=True)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for i in range(8):
            items = train_step(graphed, batches[i % 4], update=True)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert manager.stats()["replayed_steps"] == 10 and torch.isfinite(items).all()


def test_invalidate_recaptures():
    _, graphed, manager = _contexts()
    for i in range(4):
        train_step(graphed, synthetic_batch(seed=i), update=True)
    manager.invalidate("test")
    assert manager.stats()["captured_shapes"] == []
    for i in range(3):
        train_step(graphed, synthetic_batch(seed=i), update=True)
    assert manager.stats()["captured_shapes"] == [[8, 3, 256, 256]] and manager.captures == 2


def test_peak_memory_eager_vs_graphed():
    eager, graphed, manager = _contexts()
    peaks = {}
    for name, ctx in (("eager", eager), ("graphed", graphed)):
        for i in range(4):  # the graphed run captures during these
            train_step(ctx, synthetic_batch(seed=i), update=True)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        for i in range(10):
            train_step(ctx, synthetic_batch(seed=i), update=True)
        torch.cuda.synchronize()
        peaks[name] = torch.cuda.max_memory_allocated() / 2**20
    print(f"\npeak allocated over 10 steps: eager {peaks['eager']:.0f} MB, graphed {peaks['graphed']:.0f} MB "
          f"(both runs' models live); graph pool {manager.stats()['pool_mb']:.0f} MB")
    assert manager.stats()["replayed_steps"] >= 10


@pytest.mark.parametrize("extra, said", [
    ([], "cuda_graph=auto: on, the network's forward and backward replay from a CUDA graph"),
    (["multi_scale=true"], "cuda_graph=auto: off, multi_scale=true"),
    (["cuda_graph=false"], None),
])
def test_a_default_training_run_on_one_gpu_is_graphed(tmp_path, extra, said):
    """cuda_graph=auto, the default, decided by the trainer: graphed at one batch size, eager under
    multi_scale, and cuda_graph=false as asked (no auto line at all)."""
    import subprocess
    import sys

    from testkit import shapes_subset

    (tmp_path / "data").mkdir()
    proc = subprocess.run([sys.executable, "-m", "libreyolo", "train", "model=yolo9-t",
                           f"data={shapes_subset(tmp_path / 'data', 48)}", "epochs=1", "imgsz=128", "batch=8",
                           "workers=2", f"project={tmp_path / 'runs'}", *extra],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("cuda_graph=auto")]
    assert lines == ([] if said is None else [lines[0]]) and (said is None or lines[0].startswith(said)), lines
    assert ("CUDA graph captured for input" in proc.stderr) == (not extra), proc.stderr[-3000:]
