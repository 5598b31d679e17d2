"""The DETR families on a real GPU: encoder-only CUDA graphs against eager, and the step's host syncs.

Registry-driven over every family whose capture plan is the encoder. Graphs capture the backbone
and the hybrid encoder; the decoder, denoising, matching and loss stay eager.

Eager training is not bitwise repeatable here: grid_sample's backward (the deformable attention)
accumulates with atomics, so one backward's gradients differ from the next by float rounding, and
over 20 optimizer steps two eager runs from the same weights drift 2-3 % apart in loss (the
Hungarian matching turns small differences into other assignments). The check first compared a
graphed 20-step run with the range of three eager runs widened by their spread. That asks a
fourth draw of the same drift to fall inside the range of three: a correct graph fails it now and
then. Simulated with the four runs as independent random walks over the 20 steps, it fails 10-13 %
of the time per family, so a run over the five families fails about four times in ten. On the H200 every family's
graphed run fell outside the eager range, by 35-74 % of the allowance (0.67-1.99e-2 against
1.9-3.1e-2, benchmarks/results/h200/detr/gpu_tests_detr.txt), as such draws do; and a whole-suite
run failed one test of this file or the classifiers' that passed when the two files ran alone.

So the graphed run is now held to eager step by step, from the same state each time, and the
drift never builds up: before each accumulation the eager context takes the graphed one's
weights, BatchNorm statistics and loss scale (`_follow`), then both run the same
micro-batches with the same denoising draws, cuDNN in deterministic mode. Every step's loss items
must agree to LOSS_RTOL (the forward has no atomics: the same weights give the same losses), and
each accumulation's first gradients within GRAD_RTOL, or ten times what two eager backwards of
that micro-batch differ by where that is more. One backward's atomics move the gradients by
rounding; a capture bug (a stale input buffer, gradients of the wrong region or none) moves
them outright. The graphed run itself trains on for its 20 steps untouched. The
figures are printed for the docs.
"""

import dataclasses

import pytest
import torch
from testkit import synthetic_batch

from libreyolo.config import build_config
from libreyolo.engine.builder import build_step_context
from libreyolo.engine.graphs import GraphManager
from libreyolo.engine.step import train_step
from libreyolo.families import REGISTRY

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("deterministic_cudnn")]

DEVICE = torch.device("cuda")
DETRS = sorted(f for f, spec in REGISTRY.items() if spec.capture.region == "encoder")
STEPS = 20
LOSS_RTOL = 1e-4
GRAD_RTOL = 1e-3


def _context(family: str, init: dict, graphed: bool):
    spec = REGISTRY[family]
    size = spec.sizes[0]
    cfg = build_config({"model": f"{family}-{size}", "batch": 4, "imgsz": 256, "multi_scale": False},
                       spec.defaults_for(size))
    model = spec.build(size, 10)
    model.load_state_dict(init)
    model = model.to(DEVICE).train()
    ctx = build_step_context(cfg, spec, model, DEVICE)
    manager = None
    if graphed:
        manager = GraphManager.for_run(model, dataclasses.replace(cfg, cuda_graph=True), spec, DEVICE, ctx.precision)
        ctx.capturable = manager.step_callable
        assert manager.enabled
    return ctx, manager


def _step(ctx, i: int, update: bool) -> torch.Tensor:
    torch.manual_seed(1000 + i)  # the denoising noise: the same draws in every run
    return train_step(ctx, synthetic_batch(b=4, seed=i % 4), update=update)


def _follow(eager, graphed) -> None:
    """The eager context in what the graphed one's next micro-batches read: its weights and
    buffers, and its loss scale (the gradients compared are scaled); gradients zero. (Eager's own
    optimizer step is never compared: the next accumulation starts from the graphed state again.)"""
    eager.model.load_state_dict(graphed.model.state_dict())
    eager.precision.scaler.load_state_dict(graphed.precision.scaler.state_dict())
    eager.optimizer.zero_grad(set_to_none=False)


def _grads(ctx) -> torch.Tensor:
    return torch.cat([p.grad.detach().float().flatten() for p in ctx.params])


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


@pytest.mark.parametrize("family", DETRS)
def test_encoder_graphed_training_matches_eager_step_by_step(family):
    spec = REGISTRY[family]
    torch.manual_seed(0)
    init = spec.build(spec.sizes[0], 10).state_dict()
    eager, _ = _context(family, init, False)
    graphed, manager = _context(family, init, True)
    loss_worst = grad_worst = noise_worst = 0.0
    for i in range(STEPS):
        update = i % 2 == 1  # two micro-batches per update: gradient accumulation through replays
        if not update:  # an accumulation starts: eager from the graphed run's state, twice
            _follow(eager, graphed)
            _step(eager, i, False)
            first = _grads(eager)
            _follow(eager, graphed)
        a = _step(eager, i, update)
        if not update:
            ge = _grads(eager)
        b = _step(graphed, i, update)
        torch.testing.assert_close(b, a, rtol=LOSS_RTOL, atol=1e-5, msg=f"step {i}: loss items")
        loss_worst = max(loss_worst, float(((a - b).abs() / a.abs().clamp_min(1e-6)).max()))
        if update:
            continue
        gg = _grads(graphed)
        # A float16 micro-batch can overflow at the current loss scale: then in both runs.
        finite = bool(torch.isfinite(ge).all())
        assert bool(torch.isfinite(gg).all()) == finite == bool(torch.isfinite(first).all()), f"step {i}"
        if finite:
            noise, diff = _rel(ge, first), _rel(gg, ge)
            noise_worst, grad_worst = max(noise_worst, noise), max(grad_worst, diff)
    # The eager spread is the run's: the decoder's atomics may happen to add in the same order in
    # both eager backwards of one step (DEIMv2, H200: 0 at one step, 2.0e-3 at others).
    assert grad_worst <= max(GRAD_RTOL, 10 * noise_worst), (grad_worst, noise_worst)
    stats = manager.stats()
    print(f"\n[{family}-{spec.sizes[0]} {graphed.precision.describe()}] worst loss-item rel diff {loss_worst:.2e}; "
          f"gradients rel L2, graphed vs eager {grad_worst:.2e}, eager vs eager {noise_worst:.2e}; stats {stats}")
    assert stats["replayed_steps"] == STEPS - 2 and stats["captured_shapes"] == [[4, 3, 256, 256]]


@pytest.mark.parametrize("static", [False, True], ids=["default", "static"])
@pytest.mark.parametrize("family", DETRS)
def test_step_host_syncs_are_the_documented_ones(family, static):
    """A DETR step syncs where the family says (`model.host_syncs`: the denoising group count and
    the matcher's reads, on CUDA with Triton only the former), nowhere else: counted with torch's
    sync debug mode. With `static_shapes` (what cuda_graph=full sets) a step makes none."""
    import warnings

    spec = REGISTRY[family]
    torch.manual_seed(0)
    ctx, _ = _context(family, spec.build(spec.sizes[0], 10).state_dict(), False)
    ctx.model.static_shapes = static
    if static:
        assert ctx.model.host_syncs == 0
    batch = synthetic_batch(b=4, seed=0)
    for _ in range(2):
        train_step(ctx, batch, update=True)  # warm-up: caches, Triton compilation, allocator
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            items = train_step(ctx, batch, update=True)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    # One warning per synchronising call (torch also warns once that the mode is a prototype).
    syncs = [str(w.message) for w in caught if "called a synchronizing CUDA operation" in str(w.message)]
    print(f"\n[{family}] host syncs per step: {len(syncs)}")
    assert torch.isfinite(items).all()
    assert len(syncs) == ctx.model.host_syncs, syncs
