"""cuda_graph=full (engine/fullstep.py) on the CPU: the bucketing, the static buffers, the tensor
hyperparameters and the fallbacks, with a capturer that replays by running the captured function
again. The CUDA capture itself is tests/gpu/test_fullstep_gpu.py's."""

import copy
import gc
import logging
import weakref

import pytest
import torch
from testkit import box_batch

from libreyolo.config import build_config
from libreyolo.engine import builder, fullstep, optim
from libreyolo.engine.capture_check import CaptureCheck
from libreyolo.engine.fullstep import WholeStep, bucket_boxes
from libreyolo.engine.hooks import Hook
from libreyolo.engine.step import train_step
from libreyolo.families import REGISTRY, get_family

CPU = torch.device("cpu")


class ReplayingCapturer:
    """Replays a captured function by calling it again; its output tensor is refilled in place,
    as a graph's static output is."""

    def __init__(self):
        self.warmups = self.captures = 0

    def warm_up(self, body):
        self.warmups += 1
        body()

    def capture(self, body):
        self.captures += 1
        out = torch.empty(0)

        def replay():
            result = body()
            if result is not None:
                out.resize_(result.shape).copy_(result)

        return replay, out

    def release(self):
        pass


def _contexts(monkeypatch, optimizer="adamw", family="yolo9", size="t", **extra):
    """(eager context, whole-step context) from the same weights, with the fused optimizers a GPU
    run gets (they run on a CPU too)."""
    monkeypatch.setattr(optim, "implementation_kwargs", lambda cls, device_type: {"fused": True})
    spec = get_family(family)
    cfg = build_config({"model": f"{family}-{size}", "device": "cpu", "optimizer": optimizer, "lr0": 0.01,
                        "batch": 2, "imgsz": 64, "clip_grad": 10.0, **extra}, spec.defaults)
    torch.manual_seed(0)
    model = spec.build(size, 3).train()
    twin = copy.deepcopy(model)
    eager = builder.build_step_context(cfg, spec, model, CPU)
    whole_ctx = builder.build_step_context(cfg, spec, twin, CPU)
    whole_ctx.whole = WholeStep(whole_ctx, name=spec.display, backend=ReplayingCapturer(), capture_after=2)
    return eager, whole_ctx


def _flat(ctx):
    return torch.cat([p.detach().flatten() for p in ctx.params])


def _ema_flat(ctx):
    return torch.cat([t.detach().float().flatten() for t in ctx.ema.ema.state_dict().values()])


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_the_whole_step_trains_as_the_eager_step(monkeypatch, optimizer):
    """Twelve steps over three box-count buckets, accumulating two batches per update, with the
    LR changed before every update (as the schedule does): the same losses, weights and EMA as
    the eager step. The replayed update reads its LR from a float32 tensor (what the fused CUDA
    kernels take), so the LRs here are float32 numbers: then the two agree to the EMA's rounding
    (a device-weighted blend instead of lerp). With LRs of double precision AdamW drifts by 1e-8
    a step, which its normalisation carries on."""
    eager, whole_ctx = _contexts(monkeypatch, optimizer)
    whole = whole_ctx.whole
    counts = [3, 12, 3, 20, 12, 3, 20, 12, 3, 20, 3, 12]
    for i, boxes in enumerate(counts):
        batch = box_batch(i, boxes)
        update = i % 2 == 1
        for ctx in (eager, whole_ctx):
            for group in ctx.optimizer.param_groups:
                group["lr"] = float(torch.tensor(0.01 * (1 + i) / len(counts), dtype=torch.float32))
        a = train_step(eager, batch, update)
        b = train_step(whole_ctx, batch, update)
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7)
    stats = whole.stats()
    assert stats["enabled"] and stats["update_captured"]
    # Slots 8, 16 and 32 (pad_targets gives 8, 16, 24): each captured at its second sighting.
    assert sorted(stats["buckets"]) == sorted(f"2x3x64x64 uint8, {m} box slots an image" for m in (8, 16, 32))
    assert stats["replayed_steps"] == len(counts) - 3 and stats["eager_steps"] == 3
    assert whole.captures == 3 + 1  # three micro-steps and the update (the profiler's window reads it)
    torch.testing.assert_close(_flat(whole_ctx), _flat(eager), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(_ema_flat(whole_ctx), _ema_flat(eager), rtol=1e-5, atol=1e-6)
    assert whole_ctx.ema.updates == eager.ema.updates == len(counts) // 2
    for group in whole_ctx.optimizer.param_groups:  # the groups keep host floats between replays
        assert isinstance(group["lr"], float)
        assert group.get("capturable", False) is False
    # Gradients were zeroed by the captured update, as the eager one zeroes them.
    assert all(p.grad is not None and not p.grad.any() for p in whole_ctx.params)


def test_an_update_waits_while_the_momentum_ramps(monkeypatch):
    eager, whole_ctx = _contexts(monkeypatch, "sgd")
    whole = whole_ctx.whole
    settled = [False, False, True, True, True]
    for i, ready in enumerate(settled):
        whole.ready = lambda ready=ready: ready
        batch = box_batch(i, 3)
        torch.testing.assert_close(train_step(whole_ctx, batch, True), train_step(eager, batch, True),
                                   rtol=1e-4, atol=1e-6)
    stats = whole.stats()
    # Step 1 is the micro-step's first sighting (eager throughout); step 2 replays it and updates
    # eager (momentum still ramping); step 3's update is the checked run the capture follows.
    assert stats["eager_updates"] == 1 and stats["update_captured"]
    torch.testing.assert_close(_flat(whole_ctx), _flat(eager), rtol=1e-4, atol=1e-6)


def test_bucket_boxes_is_the_next_power_of_two():
    assert [bucket_boxes(m) for m in (0, 1, 8, 9, 16, 24, 33, 100, 1024)] == [8, 8, 8, 16, 16, 32, 64, 128, 1024]


def test_batches_past_the_limits_train_eager_with_one_line(monkeypatch, caplog):
    _, ctx = _contexts(monkeypatch)
    whole = ctx.whole
    whole.max_buckets = 1
    caplog.set_level(logging.INFO, logger="libreyolo")
    for i in range(4):
        train_step(ctx, box_batch(i, 3), True)
        train_step(ctx, box_batch(i, 12), True)
    many = box_batch(9, fullstep.MAX_BOXES + 1, b=1)
    for _ in range(2):
        train_step(ctx, many, True)
    said = [r.getMessage() for r in caplog.records]
    assert sum("more than 1 batch shapes" in line for line in said) == 1
    assert sum(f"{fullstep.MAX_BOXES + 8} box slots an image (more than {fullstep.MAX_BOXES})" in line
               for line in said) == 1
    assert whole.stats()["buckets"] == ["2x3x64x64 uint8, 8 box slots an image"]


def test_an_uncapturable_step_falls_back_to_network_graphs_with_one_line(monkeypatch, caplog):
    _, ctx = _contexts(monkeypatch)
    released = []
    ctx.whole.on_fallback = released.append
    criterion = ctx.whole.ctx.criterion

    def reads_the_host(preds, targets):
        loss, items = criterion(preds, targets)
        if loss > 0:  # a host read: a replay would not take this branch again
            pass
        return loss, items

    ctx.whole.ctx.criterion = reads_the_host
    caplog.set_level(logging.INFO, logger="libreyolo")
    for i in range(3):
        train_step(ctx, box_batch(i, 3), True)
    [line] = [r.getMessage() for r in caplog.records if "cuda_graph=full" in r.getMessage()]
    assert line.startswith("cuda_graph=full: YOLOv9's step cannot be captured: a host read of a device value")
    assert "at engine/step.py:" in line  # the innermost line of ours: the criterion's caller
    assert "tests/unit/test_fullstep.py" not in line  # only our package's lines are named
    assert line.endswith("; training with cuda_graph=true")
    assert ctx.whole.stats()["enabled"] is False and len(released) == 1


def test_the_step_graphs_are_re_captured_when_the_loss_changes(monkeypatch, caplog):
    _, ctx = _contexts(monkeypatch)
    for i in range(3):
        train_step(ctx, box_batch(i, 3), True)
    assert ctx.whole.backend.captures == 2  # the micro-step and the update
    caplog.set_level(logging.INFO, logger="libreyolo")
    ctx.whole.invalidate("the L1 term turned on")
    assert "whole-step CUDA graphs invalidated (the L1 term turned on): 1 discarded" in caplog.text
    for i in range(3):
        train_step(ctx, box_batch(i, 3), True)
    assert ctx.whole.backend.captures == 3  # the micro-step again; the update graph is kept


class _FailingUpdateCapturer(ReplayingCapturer):
    """The micro-step captures and replays; the update's capture runs its Python as a real capture
    does and fails in the optimizer's step (after the scaler unscaled), or its replay raises."""

    def __init__(self, optimizer, at: str):
        super().__init__()
        self.optimizer, self.at = optimizer, at

    def capture(self, body):
        replay, out = super().capture(body)
        if self.captures == 1:  # the micro-step
            return replay, out
        if self.at == "capture":
            step = self.optimizer.step
            self.optimizer.step = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("operation not permitted"))
            try:
                body()
            finally:
                self.optimizer.step = step

        def failing_replay():
            raise RuntimeError("graph replay failed")

        return failing_replay, out


@pytest.mark.parametrize("at", ["capture", "replay"])
def test_a_failed_update_capture_or_replay_loses_no_update(monkeypatch, caplog, at):
    """A live loss scaler (the float16 run's; the CPU has one too) left mid-step by a failed update
    capture is reset, so the eager updates after it unscale again; a failed update replay runs its
    step's update eagerly. Either way the run ends where the eager one does, with one line."""
    eager, whole_ctx = _contexts(monkeypatch)
    for ctx in (eager, whole_ctx):
        ctx.precision.scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    whole_ctx.whole.backend = _FailingUpdateCapturer(whole_ctx.optimizer, at)
    caplog.set_level(logging.INFO, logger="libreyolo")
    for i in range(5):
        batch = box_batch(i, 3)
        torch.testing.assert_close(train_step(whole_ctx, batch, True), train_step(eager, batch, True),
                                   rtol=1e-5, atol=1e-6)
    stats = whole_ctx.whole.stats()
    assert not stats["enabled"] and f"whole-step CUDA graph update {at} failed" in stats["fallback_reason"]
    assert sum("training with cuda_graph=true" in r.getMessage() for r in caplog.records) == 1
    torch.testing.assert_close(_flat(whole_ctx), _flat(eager), rtol=1e-5, atol=1e-6)
    assert whole_ctx.ema.updates == eager.ema.updates == 5


class _Compiled(torch.nn.Module):
    """torch.compile's wrapper as the step sees it (`_orig_mod`), recording whether each call ran
    under a dispatch mode (the capture check), where torch.compile would run the plain module."""

    def __init__(self, module):
        super().__init__()
        self._orig_mod = module
        self.under_mode: list[bool] = []

    def forward(self, images):
        from torch.utils._python_dispatch import _get_current_dispatch_mode

        self.under_mode.append(_get_current_dispatch_mode() is not None)
        return self._orig_mod(images)


def test_a_compiled_network_runs_once_outside_the_check_before_its_capture(monkeypatch):
    import dataclasses

    _, ctx = _contexts(monkeypatch)
    compiled = _Compiled(ctx.whole.ctx.capturable)
    ctx.whole.ctx = dataclasses.replace(ctx.whole.ctx, capturable=compiled)
    train_step(ctx, box_batch(0, 3), True)  # the first sighting: eager, through the step's own module
    train_step(ctx, box_batch(1, 3), True)  # the capture
    # Outside the check (it compiles there), the checked warm-up, then the replay (this capturer
    # records nothing: it replays by calling the function again).
    assert compiled.under_mode == [False, True, False]


def test_full_on_a_cpu_trains_eager_with_the_network_managers_line(caplog):
    spec = get_family("yolo9")
    caplog.set_level(logging.INFO, logger="libreyolo")
    ctx = builder.build_step_context(build_config({"device": "cpu", "cuda_graph": "full"}), spec,
                                     spec.build("t", 3), CPU)
    assert ctx.whole is None
    assert "cuda_graph=full ignored: CUDA graphs need a CUDA device (training on cpu); training eager" in caplog.text


def test_cuda_graph_takes_full_true_and_false():
    assert build_config({"cuda_graph": "full"}).cuda_graph == "full"
    assert build_config({"cuda_graph": True}).cuda_graph is True
    with pytest.raises(Exception, match="cuda_graph"):
        build_config({"cuda_graph": "whole"})


# --- the capture check --------------------------------------------------------------------------
def _problem(fn):
    with CaptureCheck() as check:
        fn()
    return check.problem


@pytest.mark.parametrize("fn, expected", [
    (lambda x: x.sum().item(), "a host read of a device value"),
    (lambda x: bool(x.sum() > 0), "a host read of a device value"),
    (lambda x: x[x > 0], "boolean-mask indexing"),
    (lambda x: x.nonzero(), "nonzero, whose output depends on the data's values"),
    (lambda x: torch.unique(x), "whose output depends on the data's values"),
    (lambda x: torch.equal(x, x), "equal, whose output depends on the data's values"),
    (lambda x: x.to("meta"), None),
    (lambda x: x[torch.tensor([0, 2])] * 2 + x.topk(2).values.sum(), None),
])
def test_the_capture_check_names_what_a_replay_could_not_repeat(fn, expected):
    x = torch.randn(5)
    problem = _problem(lambda: fn(x))
    if expected is None:
        assert problem is None
    else:
        assert problem is not None and expected in problem


def _task_targets(task: str, b: int, size: int):
    if task in ("detect", "points"):
        return box_batch(0, 5, b=b, size=size).targets
    if task == "classify":
        from libreyolo.data.classify import ClassTargets

        return ClassTargets(torch.tensor([0, 2, 1, 2][:b]))
    from libreyolo.data.segment import SegTargets

    return SegTargets(torch.randint(0, 3, (b, size, size), generator=torch.Generator().manual_seed(0)))


def _solved_on_the_device(monkeypatch):
    """The DETR matcher's Triton solve (a CUDA kernel, no host read: families/detr/matcher.py),
    stood in for on a CPU by the same exact assignment, which the check then does not hear."""
    from libreyolo.families.detr import matcher

    monkeypatch.setattr(matcher, "_device_solver", lambda cost: matcher._scipy_solve)


def _micro_step(spec, static: bool = True):
    """A family's micro-step (its first task) on padded targets, as cuda_graph=full would run it
    (its model's `static_shapes` on)."""
    torch.manual_seed(0)
    size = spec.sizes[0]
    model = spec.build(size, 3).train()
    if hasattr(model, "static_shapes"):
        model.static_shapes = static
    cfg = build_config({"model": spec.name + spec.joiner + size, "imgsz": 64}, spec.defaults_for(size))
    criterion = spec.criterion(model, cfg)
    targets = _task_targets(spec.tasks[0], 2, 64)
    images = torch.rand(2, 3, 64, 64)

    def micro():
        loss, _ = criterion(model.forward_train(model.capturable(images), targets), targets)
        loss.backward()

    return micro


@pytest.mark.parametrize("family", sorted(REGISTRY))
def test_every_familys_step_is_checked_for_capture(family, monkeypatch):
    """The micro-step of every family under the capture check. A family whose spec says its whole
    step can be captured (`CapturePlan.whole` empty) must pass; one whose spec names a reason
    must fail the check there, which cuda_graph=full logs instead of trying."""
    _solved_on_the_device(monkeypatch)
    spec = REGISTRY[family]
    problem = _problem(_micro_step(spec))
    if not spec.capture.whole:
        assert problem is None, problem
    else:
        assert problem is not None, f"{family}'s spec says it cannot be captured whole, and its step can"


def test_a_detr_step_is_capturable_only_with_static_shapes_and_the_device_solve(monkeypatch):
    """What the check finds in a DETR step without either: the denoising's host read of the largest
    box count, and, on a CPU tensor invisible to any operator, the matcher's SciPy solve (it says
    so through markers.host_work)."""
    spec = get_family("rtdetr")
    assert "families/detr/denoise.py" in _problem(_micro_step(spec, static=False))
    assert _problem(_micro_step(spec)).startswith("the Hungarian matcher's")
    _solved_on_the_device(monkeypatch)
    assert _problem(_micro_step(spec)) is None


def test_a_family_whose_step_cannot_be_captured_trains_with_true_and_says_why(monkeypatch):
    import dataclasses
    from types import SimpleNamespace

    from libreyolo.families.base import CapturePlan

    spec = dataclasses.replace(get_family("yolo9"), capture=CapturePlan("network", whole="its loss reads the host"))
    ctx = SimpleNamespace(model=None, device=torch.device("cuda"), optimizer=SimpleNamespace(param_groups=[]))
    monkeypatch.setattr(fullstep, "network_reason", lambda model, family, device: None)
    reason = fullstep.unsupported_reason(ctx, spec)
    assert reason == "YOLOv9's step cannot be captured whole: its loss reads the host"


class _NoiseKeepingCapturer(ReplayingCapturer):
    """Its warm-up leaves the random state as it found it, so that the replay after it draws the
    eager step's denoising noise (a CUDA graph's replay draws its own, statistically alike)."""

    def warm_up(self, body):
        state = torch.get_rng_state()
        super().warm_up(body)
        torch.set_rng_state(state)


def _resync(whole_ctx, eager):
    """The eager context's weights and momentum copied into the whole-step one, in place (the
    replayed update keeps reading the same tensors)."""
    with torch.no_grad():
        for w, e in zip(whole_ctx.params, eager.params):
            w.copy_(e)
            for key, value in eager.optimizer.state[e].items():
                if torch.is_tensor(value) and value.dim() > 0:
                    whole_ctx.optimizer.state[w][key].copy_(value)


def test_a_detr_trains_under_whole_step_graphs_as_the_eager_step(monkeypatch):
    """RT-DETR's step replayed over two box-count buckets: the static denoising (query slots by
    the padded width, the dead ones masked) and the device solve give the eager step's losses and
    updates. Both draw the same noise: each step starts from the same seed, and the noise is drawn
    for 2 max(100, K) and 2 max(100, M) slots, 200 both here (families/detr/denoise.py). The static
    step attends over 200 denoising queries where the eager one has 2 K G, so its sums run in
    another order, and a from-scratch DETR amplifies such noise about tenfold a step (an eager twin
    whose weights differ by 5e-7, relative, ends four steps 0.48 of an update apart). So each step
    starts from the eager step's weights and momentum: one step's difference stays within 1e-4 of
    its update (measured on a CPU: 4e-6 to 5e-6), where a dead slot that leaked into attention or the loss
    moves the loss itself."""
    _solved_on_the_device(monkeypatch)
    eager, whole_ctx = _contexts(monkeypatch, "sgd", family="rtdetr", size="r18")
    whole = whole_ctx.whole
    whole.backend = _NoiseKeepingCapturer()
    assert whole_ctx.model.static_shapes and not eager.model.static_shapes
    for i, boxes in enumerate([3, 12, 3, 12, 3]):
        batch = box_batch(i, boxes)
        before = _flat(eager).clone()
        torch.manual_seed(100 + i)
        a = train_step(eager, batch, True)
        torch.manual_seed(100 + i)
        b = train_step(whole_ctx, batch, True)
        torch.testing.assert_close(b, a, rtol=1e-5, atol=0)
        assert (_flat(whole_ctx) - _flat(eager)).norm() < 1e-4 * (_flat(eager) - before).norm()
        _resync(whole_ctx, eager)
    stats = whole.stats()
    assert stats["enabled"] and stats["replayed_steps"] == 3 and stats["eager_steps"] == 2
    assert sorted(stats["buckets"]) == sorted(f"2x3x64x64 uint8, {m} box slots an image" for m in (8, 16))
    whole._off("a test's reason")
    assert whole_ctx.model.static_shapes is False  # as cuda_graph=true trains it


def test_a_training_run_under_whole_step_graphs_ends_where_the_eager_one_does(tmp_path, monkeypatch):
    """The trainer's wiring: SGD's update waits for the warmup's end (the momentum ramp), the
    schedule's LRs reach the replayed update, checkpoints hold the groups' host floats, the
    run's weights are the eager run's, and the trainer is freed when the run ends."""
    from testkit import shapes_subset

    from libreyolo import LibreYOLO
    from libreyolo.engine import trainer as trainer_module

    monkeypatch.setattr(optim, "implementation_kwargs", lambda cls, device_type: {"fused": True})
    (tmp_path / "data").mkdir()
    args = dict(data=shapes_subset(tmp_path / "data", 16), imgsz=64, batch=8, device="cpu", workers=0, amp=False,
                val=False, epochs=4, optimizer="sgd", warmup_epochs=3, mosaic=0.0)
    eager = LibreYOLO("yolo9-t").train(project=str(tmp_path / "eager"), **args)
    built = []

    def with_whole_step(cfg, family, model, device):
        ctx = builder.build_step_context(cfg, family, model, device)
        ctx.whole = WholeStep(ctx, name=family.display, backend=ReplayingCapturer(), capture_after=2)
        built.append(ctx)
        return ctx

    monkeypatch.setattr(trainer_module, "build_step_context", with_whole_step)
    trainers = []

    class Keep(Hook):
        def before_train(self, trainer) -> None:
            trainers.append(weakref.ref(trainer))

    gc.disable()  # the trainer must go by its reference count: no cycle through the runner
    try:
        whole = LibreYOLO("yolo9-t").train(project=str(tmp_path / "whole"), hooks=[Keep()], **args)
        assert trainers[0]() is None
    finally:
        gc.enable()
    [ctx] = built
    stats = ctx.whole.stats()
    assert stats["update_captured"] and stats["replayed_steps"] >= 4 and stats["eager_updates"] >= 1, stats
    a, b = (torch.load(r.last, weights_only=True) for r in (eager, whole))
    for key, value in a["model"].items():
        torch.testing.assert_close(b["model"][key], value, rtol=1e-5, atol=1e-6, msg=key)
    assert all(isinstance(g["lr"], float) for g in b["optimizer"]["param_groups"])


def test_compile_trains_the_compiled_network_and_leaves_the_model_plain(tmp_path, monkeypatch, caplog):
    """compile=true with dynamo's eager backend (no inductor build on a 2-core CPU): the steps run the
    compiled wrapper, the run says so and times its first step, and the weights and checkpoint
    keys are the uncompiled run's."""
    from testkit import shapes_subset

    from libreyolo import LibreYOLO

    monkeypatch.setattr(builder, "COMPILE_OPTIONS", {"backend": "eager", "dynamic": False})
    (tmp_path / "data").mkdir()
    args = dict(data=shapes_subset(tmp_path / "data", 16), imgsz=64, batch=8, device="cpu", workers=0, amp=False,
                val=False, epochs=2, mosaic=0.0)
    plain = LibreYOLO("yolo9-t").train(project=str(tmp_path / "plain"), **args)
    caplog.set_level(logging.INFO, logger="libreyolo")
    compiled = LibreYOLO("yolo9-t").train(project=str(tmp_path / "compiled"), compile=True, **args)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("compile=true")]
    assert said[0].startswith("compile=true: torch.compile(backend='eager', dynamic=False) of YOLOv9's network")
    assert said[1].startswith("compile=true: the first step took ") and "inductor caches its kernels in " in said[1]
    assert len(said) == 2
    a, b = (torch.load(r.last, weights_only=True) for r in (plain, compiled))
    assert a["model"].keys() == b["model"].keys()
    for key, value in a["model"].items():
        torch.testing.assert_close(b["model"][key], value, rtol=1e-5, atol=1e-6, msg=key)


def test_compile_leaves_a_family_without_a_whole_network_region_uncompiled(caplog):
    spec = get_family("rtdetr")
    caplog.set_level(logging.INFO, logger="libreyolo")
    model = spec.build("r18", 3)
    ctx = builder.build_step_context(build_config({"device": "cpu", "compile": True}), spec, model, CPU)
    assert ctx.capturable is model.capturable
    assert "compile=true: RT-DETR compiles only where its captured region is the whole network (it is encoder)" \
        in caplog.text
