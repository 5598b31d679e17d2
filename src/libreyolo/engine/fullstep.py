"""`cuda_graph=full`: the whole training step as CUDA graphs, replayed per shape bucket.

`cuda_graph=true` captures the network's forward and backward (engine/graphs.py); the loss, the
optimizer and the EMA still launch eagerly, and for a detector those are hundreds of small
kernels a step. Here two kinds of graph replace the whole step:
- one *micro-step* graph per bucket: the images' conversion, the forward, the loss and the scaled
  backward, which adds this batch's gradients into `param.grad` (the flat tensors of
  engine/optim.py) in place, as autograd does eagerly;
- one *update* graph, the same for every bucket: unscale, clip, the fused optimizer step, the
  loss scale's update, zeroed gradients and the EMA blend (step.apply_update).
A batch that steps the optimizer replays both; one that only accumulates replays the first, so
gradient accumulation and its warmup ramp need nothing of their own.

A bucket is the images' (shape, dtype) with the targets' shapes, the detection targets padded to
a power of two of boxes (`bucket_boxes`), so that a dataset's batches fall into a few buckets:
every loss honours `Targets.valid` (tests/unit/test_families.py checks that padding changes no
loss or gradient). The batch is copied into the bucket's static buffers before each replay.
A model with `static_shapes` (the family contract, families/base.py: the DETRs) is switched to
it, so that what it sized by a host read of the data (the denoising's query count) follows the
bucket's padded width instead, its extra slots masked.

What a replay cannot take from the host it takes from the device: the LR of every group and the
EMA's blend weight are 0-d tensors that the host writes (`fill_`, a kernel argument, no sync)
before each update replay; GradScaler's inf check and scale update, the skipped-step counters and
clipping's norm already run on the device. SGD's momentum is a kernel argument of the fused step,
so while the warmup ramps it the update runs eagerly (`ready`). What stays eager, each with one
line per run: a bucket seen fewer than `CAPTURE_AFTER` times, a bucket past `MAX_BUCKETS`, and
a batch of more than `MAX_BOXES` boxes an image.

Before a bucket's first capture its micro-step runs once under `CaptureCheck`
(engine/capture_check.py), as does the update's first run: a host read, a data-dependent shape
or a host-device copy anywhere in them turns whole-step graphs off with one line naming the
operator and our line that called it, and the run trains on with `cuda_graph=true`. A failed
capture or replay does the same. Never a silent difference: the captured functions are the eager
step's own (engine/step.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import math
import time
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import Tensor

from .. import markers
from ..families.base import Targets
from .capture_check import CaptureCheck
from .graphs import CAPTURE_AFTER, _buffers_restored, _capture_kwargs, _one_line, _stream_restored, release_graph_memory
from .graphs import unsupported_reason as network_reason
from .step import StepContext, apply_update, forward_loss, prepare_images

log = logging.getLogger("libreyolo")

FULL = "full"
# Graphs of the whole step share one memory pool (below), so a bucket costs its static buffers
# and little else; the cap bounds the captures (each takes about a second) of a run whose boxes
# per image vary widely.
MAX_BUCKETS = 4
# Boxes an image beyond which a batch runs eager: padding to the next power of two past this
# would make every box-against-anchor tensor of the assigner twice the size it needs.
MAX_BOXES = 1024
MIN_BOXES = 8  # the loaders' smallest padding (data/loader.pad_targets)


def bucket_boxes(m: int) -> int:
    """The padded box count of a bucket: the next power of two, at least MIN_BOXES."""
    return max(MIN_BOXES, 1 << max(0, math.ceil(math.log2(max(m, 1)))))


class Capturer(Protocol):
    """Records `body` once and returns what replays it (the CUDA backend, or a test's fake)."""

    def warm_up(self, body: Callable[[], Any]) -> None: ...

    def capture(self, body: Callable[[], Any]) -> tuple[Callable[[], None], Any]: ...

    def release(self) -> None: ...


def unsupported_reason(ctx: StepContext, family: Any) -> str | None:
    """Why this run cannot capture its whole step (then it trains with cuda_graph=true), or None."""
    reason = network_reason(ctx.model, family, ctx.device)
    if reason is not None:
        return reason
    if family.capture.whole:
        return f"{family.display}'s step cannot be captured whole: {family.capture.whole}"
    if not all(group.get("fused") for group in ctx.optimizer.param_groups):
        return "the update graph needs a fused optimizer step, and this torch has none for it"
    return None


class WholeStep:
    """Callable as `whole(batch, update) -> loss items`, or None for a batch the step runs itself."""

    def __init__(self, ctx: StepContext, *, name: str = "the model", backend: Capturer | None = None,
                 capture_after: int = CAPTURE_AFTER, max_buckets: int = MAX_BUCKETS,
                 on_fallback: Callable[[str], None] | None = None):
        # The functions captured are the step's own, with the plain module: the network graph
        # manager is held while whole-step graphs are on (it would capture the same shapes again).
        network = ctx.graphs.module if ctx.graphs is not None else ctx.model.capturable  # compiled, under compile=true
        self.ctx = dataclasses.replace(ctx, capturable=network, ddp=None, whole=None)
        self.backend = backend if backend is not None else CudaCapturer(ctx.device)
        self.capture_after, self.max_buckets = int(capture_after), int(max_buckets)
        self.name, self.on_fallback = name, on_fallback  # name: the family, for the lines
        self.ready: Callable[[], bool] = lambda: True  # False while SGD's warmup ramps its momentum
        self.fallback_reason: str | None = None
        self._micro: dict[tuple, _Bucket] = {}
        self._seen: dict[tuple, int] = {}
        self._update: Callable[[], None] | None = None
        self._lrs: list[Tensor] = []
        self._ema_weight = torch.zeros((), device=ctx.device)
        self._said: set[str] = set()
        self.replayed_steps = 0
        self.captures = 0  # graphs taken, micro-steps and the update (the profiler's window reads both counts)
        self.eager_steps = 0
        self.eager_updates = 0
        # A model that sizes part of its step by the data (the DETRs' denoising queries, by a host
        # read of the largest box count) sizes it by the padded targets instead while this is on.
        if hasattr(ctx.model, "static_shapes"):
            ctx.model.static_shapes = True

    @property
    def enabled(self) -> bool:
        return self.fallback_reason is None

    # --- the call ---------------------------------------------------------------------------------
    def __call__(self, batch, update: bool) -> Tensor | None:
        if self.fallback_reason is not None or not self.ctx.model.training:
            return None
        key = self._key(batch)
        bucket = self._micro.get(key) if key is not None else None
        if bucket is None and key is not None and self._count(key):
            bucket = self._capture_micro(key, batch)
        if bucket is None:
            self.eager_steps += 1
            return None
        try:
            with markers.phase("h2d"):
                bucket.load(batch)
            with markers.phase("forward"):  # under full capture: the forward, loss and backward
                bucket.replay()
            items = bucket.items.clone()  # the next replay writes the same tensor
        except Exception as exc:
            self._fail("micro-step replay", exc, key)
            # The replay may have added part of this batch's gradients: the accumulation restarts.
            self.ctx.optimizer.zero_grad(set_to_none=False)
            log.warning("the gradients accumulated for this optimizer step were discarded; this batch trains eager")
            return None
        self.replayed_steps += 1
        if update:
            self._step()
        return items

    def _key(self, batch) -> tuple | None:
        """The batch's bucket, or None (with one line per run) when it runs eager."""
        targets = batch.targets
        if isinstance(targets, Targets):
            m = targets.boxes.shape[1]
            if m > MAX_BOXES:
                self._say("boxes", f"cuda_graph=full: a batch with {m} box slots an image (more than {MAX_BOXES}) "
                                   "trains eager")
                return None
            shapes = ((targets.boxes.shape[0], bucket_boxes(m)),)
        else:
            shapes = tuple((tuple(t.shape), t.dtype) for t in _leaves(targets))
        images = batch.images
        return (tuple(images.shape), images.dtype), shapes

    def _count(self, key: tuple) -> bool:
        if len(self._micro) >= self.max_buckets:
            self._say("buckets", f"cuda_graph=full: more than {self.max_buckets} batch shapes; batches of the others "
                                 f"train eager (e.g. {_describe(key)})")
            return False
        self._seen[key] = self._seen.get(key, 0) + 1
        return self._seen[key] >= self.capture_after

    # --- the update -------------------------------------------------------------------------------
    def _step(self) -> None:
        ema = self.ctx.ema
        if self._update is None:
            if not self.ready():
                self.eager_updates += 1
                apply_update(self.ctx)
                return
            self._capture_update()
            return  # the capture's checked first run was this step's update
        groups = self.ctx.optimizer.param_groups
        with markers.phase("optimizer"):
            for lr, group in zip(self._lrs, groups):
                lr.fill_(group["lr"])
            if ema is not None:
                self._ema_weight.fill_(1.0 - ema.current_decay(ema.updates + 1))
            try:
                self._update()
            except Exception as exc:
                self._fail("update replay", exc, None)
                # A replay that raised ran none of its kernels: this step's update runs eager.
                apply_update(self.ctx)
                return
        if ema is not None:
            ema.updates += 1

    def _capture_update(self) -> None:
        """Run this step's update for real under the check, then capture it (capturing records
        kernels without running them: nothing is updated twice)."""
        ctx, ema = self.ctx, self.ctx.ema
        groups = ctx.optimizer.param_groups
        self._lrs = [torch.full((), float(g["lr"]), dtype=torch.float32, device=ctx.device) for g in groups]
        if ema is not None:
            self._ema_weight.fill_(1.0 - ema.current_decay(ema.updates + 1))

        def body() -> None:
            with _tensor_hyperparameters(groups, self._lrs):
                apply_update(ctx, self._ema_weight if ema is not None else None)

        with CaptureCheck() as check:
            body()
        if ema is not None:
            ema.updates += 1
        if check.problem is not None:
            self._fail_check(f"{self.name}'s optimizer update", check.problem)
            return
        t0 = time.perf_counter()
        try:
            replay, _ = self.backend.capture(body)
        except Exception as exc:
            # A capture cut short can leave the loss scaler mid-step (unscaled, not updated): the
            # next eager update would refuse to unscale again.
            ctx.precision.reset_step_stage()
            self._fail("update capture", exc, None)
            return
        self._update = replay
        self.captures += 1
        log.info(f"CUDA graph of the optimizer update and EMA captured in {time.perf_counter() - t0:.2f} s")

    # --- the micro-step ---------------------------------------------------------------------------
    def _capture_micro(self, key: tuple, batch) -> _Bucket | None:
        t0 = time.perf_counter()
        ctx = self.ctx
        bucket = _Bucket.allocate(batch, key, ctx.device)
        bucket.load(batch)
        params = [p for p in ctx.model.parameters() if p.requires_grad]

        def warm() -> None:  # the micro-step with its gradients returned, not accumulated
            loss, _ = forward_loss(ctx, prepare_images(ctx, bucket.images), bucket.targets)
            scaled = ctx.precision.scaler.scale(loss)
            torch.autograd.grad(scaled, params, allow_unused=True)

        def body() -> Tensor:
            loss, items = forward_loss(ctx, prepare_images(ctx, bucket.images), bucket.targets)
            ctx.precision.backward(loss)
            return items

        try:
            # The warm-up's BN updates are undone: the replays are the step's only ones.
            with _buffers_restored(ctx.model), markers.suspended():
                if _compiled(ctx.capturable):
                    # torch.compile runs the plain module under a dispatch mode (the check), so the
                    # network compiles here, outside the check and the capture.
                    warm()
                with CaptureCheck() as check:
                    self.backend.warm_up(warm)
                if check.problem is not None:
                    self._fail_check(f"{self.name}'s step", check.problem)
                    return None
                replay, items = self.backend.capture(body)
        except Exception as exc:
            self._fail("micro-step capture", exc, key)
            return None
        bucket.replay, bucket.items = replay, items
        self._micro[key] = bucket
        self.captures += 1
        log.info(f"CUDA graph of the whole step captured for {_describe(key)} in {time.perf_counter() - t0:.2f} s")
        return bucket

    # --- lifecycle --------------------------------------------------------------------------------
    def invalidate(self, reason: str) -> None:
        """What the micro-step computes changed (YOLOX's L1 term): its graphs are re-captured."""
        if self.fallback_reason is not None or not self._micro:
            return
        dropped = len(self._micro)
        self._micro.clear()
        self._seen.clear()
        log.info(f"whole-step CUDA graphs invalidated ({reason}): {dropped} discarded; re-capturing")

    def stats(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "replayed_steps": self.replayed_steps, "eager_steps": self.eager_steps,
                "captures": self.captures,
                "eager_updates": self.eager_updates, "buckets": [_describe(k) for k in self._micro],
                "update_captured": self._update is not None, "fallback_reason": self.fallback_reason}

    def _say(self, topic: str, line: str) -> None:
        if topic not in self._said:
            self._said.add(topic)
            log.info(line)

    def _fail_check(self, what: str, problem: str) -> None:
        self._off(f"{what} cannot be captured: {problem}")

    def _fail(self, where: str, exc: BaseException, key: tuple | None) -> None:
        shape = f" for {_describe(key)}" if key is not None else ""
        self._off(f"whole-step CUDA graph {where} failed{shape}: {_one_line(exc)}")

    def _off(self, reason: str) -> None:
        if self.fallback_reason is not None:
            return
        self.fallback_reason = reason
        log.warning(f"cuda_graph=full: {reason}; training with cuda_graph=true")
        self._micro.clear()
        self._update = None
        if hasattr(self.ctx.model, "static_shapes"):
            self.ctx.model.static_shapes = False  # as cuda_graph=true trains it
        self.backend.release()
        if self.on_fallback is not None:
            self.on_fallback(reason)


@contextlib.contextmanager
def _tensor_hyperparameters(groups: list[dict], lrs: list[Tensor]):
    """The groups' LRs as the device tensors a replay reads, and `capturable` on, for one call:
    the optimizer's groups keep their host floats for everything else (the schedule, the logs,
    checkpoints, eager steps)."""
    saved = [(g["lr"], g.get("capturable")) for g in groups]
    try:
        for g, lr in zip(groups, lrs):
            g["lr"] = lr
            if "capturable" in g:
                g["capturable"] = True
        yield
    finally:
        for g, (lr, capturable) in zip(groups, saved):
            g["lr"] = lr
            if capturable is not None:
                g["capturable"] = capturable


def _compiled(module) -> bool:
    """Whether `module` is torch.compile's wrapper (compile=true), which keeps the plain one as `_orig_mod`."""
    return hasattr(module, "_orig_mod")


def _leaves(targets) -> list[Tensor]:
    if isinstance(targets, Tensor):
        return [targets]
    return [t for t in targets if isinstance(t, Tensor)]


def _describe(key: tuple) -> str:
    """'8x3x640x640 uint8, 64 box slots an image'."""
    (shape, dtype), targets = key
    text = "x".join(map(str, shape)) + " " + str(dtype).removeprefix("torch.")
    if targets and len(targets[0]) == 2 and isinstance(targets[0][1], int):
        text += f", {targets[0][1]} box slots an image"
    return text


@dataclasses.dataclass
class _Bucket:
    """One bucket's static buffers (outside the graphs' pool) and its micro-step replay."""

    images: Tensor
    targets: Any
    replay: Callable[[], None] | None = None
    items: Tensor | None = None

    @classmethod
    def allocate(cls, batch, key: tuple, device: torch.device) -> _Bucket:
        images = torch.empty(batch.images.shape, dtype=batch.images.dtype, device=device)
        t = batch.targets
        if isinstance(t, Targets):
            b, m = key[1][0]
            targets = Targets(torch.zeros((b, m, 4), dtype=t.boxes.dtype, device=device),
                              torch.zeros((b, m), dtype=t.labels.dtype, device=device),
                              torch.zeros((b, m), dtype=torch.bool, device=device))
        elif isinstance(t, Tensor):
            targets = torch.empty(t.shape, dtype=t.dtype, device=device)
        else:
            targets = type(t)(*(torch.empty(x.shape, dtype=x.dtype, device=device) if isinstance(x, Tensor) else x
                                for x in t))
        return cls(images, targets)

    def load(self, batch) -> None:
        """The batch into the static buffers; box slots past its own are left invalid (zeros)."""
        self.images.copy_(batch.images, non_blocking=True)
        t = batch.targets
        if isinstance(t, Targets):
            m = t.boxes.shape[1]
            for static, value in zip(self.targets, t):
                static[:, :m].copy_(value, non_blocking=True)
                if m < static.shape[1]:
                    static[:, m:].zero_()
        else:
            for static, value in zip(_leaves(self.targets), _leaves(t)):
                static.copy_(value, non_blocking=True)


class CudaCapturer:
    """Warm-up on a side stream, then capture into one memory pool shared by every graph.

    Sharing is safe here because the graphs never run concurrently (one stream, replayed one
    after the other), every tensor one graph leaves for later (params, gradients, optimizer and
    EMA state, the loss scale, the static buffers) was allocated outside the pool, and each
    micro-step's loss items are copied out before the next replay."""

    def __init__(self, device: torch.device, warmup_iters: int = 2):
        self.device, self.warmup_iters = device, int(warmup_iters)
        self.stream: torch.cuda.Stream | None = None
        self.pool = None  # a graph lives as long as its replay (a bound method) is referenced

    def _side_stream(self) -> torch.cuda.Stream:
        if self.stream is None:
            self.stream = torch.cuda.Stream(device=self.device)
            self.pool = torch.cuda.graph_pool_handle()
        return self.stream

    def warm_up(self, body: Callable[[], Any]) -> None:
        # On the capture stream, so lazy initialisation (cuDNN autotuning, cuBLAS workspaces)
        # happens before and outside the capture (PyTorch CUDA-graphs notes, "Whole-network capture").
        caller = torch.cuda.current_stream(self.device)
        stream = self._side_stream()
        stream.wait_stream(caller)
        with _stream_restored(caller), torch.cuda.stream(stream):
            for _ in range(self.warmup_iters):
                body()
        caller.wait_stream(stream)
        torch.cuda.synchronize(self.device)

    def capture(self, body: Callable[[], Any]) -> tuple[Callable[[], None], Any]:
        caller = torch.cuda.current_stream(self.device)
        stream = self._side_stream()
        graph = torch.cuda.CUDAGraph()
        gc.collect()  # a collection during capture could free an old graph's memory mid-capture
        enabled = gc.isenabled()
        gc.disable()
        try:
            stream.wait_stream(caller)
            with _stream_restored(caller), markers.suspended(), \
                    torch.cuda.graph(graph, pool=self.pool, stream=stream, **_capture_kwargs()):
                out = body()
        finally:
            if enabled:
                gc.enable()
        caller.wait_stream(stream)
        return graph.replay, out

    def release(self) -> None:
        """After a failure, once the graphs are dropped: let pending work finish, return the memory."""
        release_graph_memory()
