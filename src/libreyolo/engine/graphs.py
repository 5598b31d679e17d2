"""CUDA graphs for training: the graph manager stands in for `model.capturable` in the step.

The manager counts input shapes; once one (shape, dtype, strides) has been seen `capture_after`
times it captures the module's forward and backward into two CUDA graphs and replays them for
that shape. Loss, optimizer, clipping, EMA and LR stay eager (engine/step.py). Other shapes run
eager. Anything that cannot be captured logs one line and trains eager; any failure during
capture or replay logs one line and turns graphs off for the rest of the run. The run never fails
because of `cuda_graph=True`.

Gradients go straight into `param.grad`. The backward graph captures autograd's own
accumulation (`param.grad += g`, in place) into gradient tensors that exist before the capture, so
a replay leaves every parameter's gradient where the optimizer reads it: no per-parameter copy or
allocation is launched eagerly after the replay (for YOLOv9-t that was 675 extra kernels per
step), and gradient accumulation over micro-batches is the graph's own in-place add. The contract
this needs: a parameter's `.grad` stays that same tensor, zeroed in place between optimizer
steps (the step does that). If something replaced or cleared it anyway, the next replay puts the
captured tensor back (zeroed, or holding the replacement's values) before it runs.

Why a manual pair of `torch.cuda.CUDAGraph`s rather than `torch.cuda.make_graphed_callables`:
- its backward hands AccumulateGrad *detached* static grad buffers, which AccumulateGrad may
  steal as `param.grad`; the next replay then overwrites that gradient, silently corrupting
  gradient accumulation (pytorch issue 181723, open), and our trainer accumulates nbs/batch
  micro-batches. Ours has no buffers to steal: the graph adds into `.grad` itself (above);
- it patches `module.forward` in place, which cannot be undone after a failure or an
  `invalidate()` and would nest for a second shape; we leave the module untouched, so eval,
  checkpoints and EMA see a plain module;
- we need the BN buffer snapshot between warm-up and capture and one private pool per shape.
The rules followed here are those of the PyTorch CUDA-graphs notes (docs: notes/cuda, "CUDA Graphs").
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import logging
import os
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor, nn

log = logging.getLogger("libreyolo")

AutocastFactory = Callable[[], contextlib.AbstractContextManager]
ErrorCallback = Callable[[str, BaseException], None]

# The first sightings of a shape run eager: they let cuDNN autotune and the allocator settle, and
# a shape that appears once or twice (a partial last batch) is not worth a graph's memory.
CAPTURE_AFTER = 3
# Each graph keeps a private pool of about one set of activations alive, so only the dominant
# shape (the full batch at the training size) is captured by default.
MAX_GRAPHS = 1


class Graphed(Protocol):
    """What a capture backend returns for one input shape."""

    pool_mb: float | None

    def __call__(self, images: Tensor) -> tuple[Tensor, ...]: ...


class CaptureBackend(Protocol):
    def capture(self, module: nn.Module, sample: Tensor, autocast: AutocastFactory,
                on_error: ErrorCallback) -> Graphed: ...

    def release(self) -> None: ...


def input_key(images: Tensor) -> tuple:
    """What a replay must match: replay copies into a fixed buffer and checks none of this."""
    return (tuple(images.shape), images.dtype, images.stride(), images.device, images.requires_grad)


def describe_key(key: tuple) -> str:
    shape, dtype, stride = key[0], key[1], key[2]
    text = "x".join(map(str, shape)) + " " + str(dtype).removeprefix("torch.")
    if len(shape) == 4 and stride[1] == 1 and shape[1] > 1:
        text += " channels_last"
    return text


def _one_line(exc: BaseException, limit: int = 200) -> str:
    text = str(exc).strip().splitlines()
    msg = f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."


class GraphManager:
    """Callable like the module it wraps: `manager(images) -> tuple[Tensor, ...]`.

    Build it with `GraphManager.for_run(...)` in the trainer; tests inject a `backend`.
    """

    def __init__(self, module: nn.Module, *, autocast: AutocastFactory | None = None,
                 backend: CaptureBackend | None = None, capture_after: int = CAPTURE_AFTER,
                 max_graphs: int = MAX_GRAPHS, note: str | None = None):
        self.module = module
        self.note = note  # the model's `graph_note` (families/base.py): logged at the first capture, once
        self._autocast = autocast or contextlib.nullcontext
        self.backend = backend if backend is not None else CudaGraphBackend()
        self.capture_after, self.max_graphs = int(capture_after), int(max_graphs)
        self.requested = True            # False: cuda_graph=False, the manager is a pass-through
        # True while cuda_graph=full's whole-step graphs (engine/fullstep.py) stand in: a call runs
        # the module, uncounted, so the same shapes are not captured twice.
        self.hold = False
        self.fallback_reason: str | None = None  # set when graphs are off for the rest of the run
        self._graphs: dict[tuple, Graphed] = {}
        self._seen: dict[tuple, int] = {}
        self.replayed_steps = 0
        self.eager_steps = 0
        self.captures = 0

    # --- construction for a run ------------------------------------------------------------------
    @classmethod
    def for_run(cls, model: nn.Module, cfg: Any, family: Any, device: torch.device, precision: Any,
                *, backend: CaptureBackend | None = None, module: nn.Module | None = None) -> GraphManager:
        """The manager for one training run: armed, or off with one log line saying why.

        `step_callable` is what `StepContext.capturable` should be either way. `module`: what the
        steps run for `model.capturable` (its compiled form under compile=true), else that.
        """
        module = model.capturable if module is None else module
        if getattr(cfg, "cuda_graph", False) not in (True, "full"):  # auto unresolved (bench step, tests): eager
            return cls.off(module, None)
        reason = unsupported_reason(model, family, device)
        asked = "full" if cfg.cuda_graph == "full" else "true"
        if reason == MULTI_PROCESS:
            log.info(f"cuda_graph={asked}: {reason} ({_world_size()} processes); training eager")
            return cls.off(module, reason)
        if reason is not None:
            log.info(f"cuda_graph={asked} ignored: {reason}; training eager")
            return cls.off(module, reason)
        if getattr(cfg, "multi_scale", False):
            log.info(f"cuda_graph={asked} with multi_scale=true: a batch of a size seen fewer than {CAPTURE_AFTER} "
                     f"times runs eager and only {MAX_GRAPHS} size is captured, so a short run may never "
                     "capture; multi_scale=false trains every step graphed")
        return cls(module, autocast=precision.autocast, backend=backend, note=getattr(model, "graph_note", None))

    @classmethod
    def off(cls, module: nn.Module, reason: str | None) -> GraphManager:
        """A pass-through manager; `reason` None means graphs were not requested."""
        manager = cls(module)  # never captures: `enabled` is False
        manager.requested = reason is not None
        manager.fallback_reason = reason
        return manager

    @property
    def enabled(self) -> bool:
        return self.requested and self.fallback_reason is None

    @property
    def step_callable(self) -> Callable[[Tensor], tuple]:
        """The manager when graphs may be used, else the plain module (no indirection at all)."""
        return self if self.enabled else self.module

    # --- the call --------------------------------------------------------------------------------
    def __call__(self, images: Tensor) -> tuple[Tensor, ...]:
        # Graphs hold the training-mode, grad-enabled computation only; eval and no_grad (and
        # inference_mode) calls are plain module calls and are not counted.
        if self.hold or not (self.requested and self.module.training and torch.is_grad_enabled()):
            return self.module(images)
        if self.fallback_reason is None:
            key = input_key(images)
            graph = self._graphs.get(key)
            if graph is None and self._count(key):
                graph = self._capture(key, images)
            if graph is not None and not _pending_backward(graph):
                try:
                    with self._autocast():
                        out = graph(images)
                    self.replayed_steps += 1
                    return out
                except Exception as exc:  # the run must never fail because of the flag
                    self._fail("replay", exc, key)
        self.eager_steps += 1
        return self.module(images)

    def _count(self, key: tuple) -> bool:
        """Count one sighting of `key`; True when it should be captured now."""
        if len(self._graphs) >= self.max_graphs:
            return False
        self._seen[key] = self._seen.get(key, 0) + 1
        return self._seen[key] >= self.capture_after

    def _capture(self, key: tuple, images: Tensor) -> Graphed | None:
        t0 = time.perf_counter()
        # A clone, not the batch itself: the batch's memory goes back to the allocator after
        # the step, while the graph reads its input from this address on every replay.
        sample = images.detach().clone(memory_format=torch.preserve_format)
        try:
            graph = self.backend.capture(self.module, sample, self._autocast, self._on_backward_error)
        except Exception as exc:
            self._fail("capture", exc, key)
            return None
        self._graphs[key] = graph
        self.captures += 1
        pool = "size unknown" if graph.pool_mb is None else f"{graph.pool_mb:.0f} MB"
        log.info(f"CUDA graph captured for input {describe_key(key)} in "
                 f"{time.perf_counter() - t0:.2f} s; memory pool {pool}")
        if self.note:
            log.info(f"CUDA graphs: {self.note}")
            self.note = None  # once per run, re-captures included
        return graph

    def _on_backward_error(self, where: str, exc: BaseException) -> None:
        self._fail(where, exc, None)

    def _fail(self, where: str, exc: BaseException, key: tuple | None) -> None:
        if self.fallback_reason is not None:
            return  # already off and already said so
        shape = f" for input {describe_key(key)}" if key is not None else ""
        self.fallback_reason = f"CUDA graph {where} failed{shape}: {_one_line(exc)}"
        log.warning(f"{self.fallback_reason}; graphs off, training eager for the rest of the run")
        self._drop()

    def _drop(self) -> None:
        self._graphs.clear()
        self._seen.clear()
        self.backend.release()

    # --- lifecycle -------------------------------------------------------------------------------
    def invalidate(self, reason: str) -> None:
        """The captured computation changed (e.g. a loss branch turned on): discard and re-arm."""
        if not self.enabled:
            return  # nothing captured, and the reason graphs are off was already logged
        dropped = len(self._graphs)
        self._drop()
        log.info(f"CUDA graphs invalidated ({reason}): {dropped} graph(s) discarded; "
                 f"re-capturing once a shape is seen {self.capture_after} times")

    def stats(self) -> dict[str, Any]:
        pools = [g.pool_mb for g in self._graphs.values()]
        known = [p for p in pools if p is not None]
        return {"requested": self.requested, "enabled": self.enabled,
                "replayed_steps": self.replayed_steps,
                "eager_steps": self.eager_steps,
                "captured_shapes": [list(key[0]) for key in self._graphs],
                "pool_mb": sum(known) if known else None,
                "fallback_reason": self.fallback_reason}


# cuda_graph=auto, the default: the trainer decides it once per run (resolve_auto below); a step
# context built outside a training run (bench step's arms, tests) trains eager unless it asks.
AUTO = "auto"
_REGION = {"network": "the network's forward and backward", "encoder": "the backbone and encoder's forward and backward"}


def resolve_auto(cfg: Any, model: nn.Module, family: Any, device: torch.device) -> tuple[bool | str, str | None]:
    """What `cuda_graph=auto` trains with in this run, and the line that says so (None on a CPU,
    where no graph can be asked for): true on one CUDA device for batches of one size, else false.

    Graphed = eager within each family's numerics (tests/gpu), the capture costs a few eager steps
    and one pool of activations, and a failed capture trains on eager with one line, so a default
    of eager left the step slower than it needs to be: graphed is 1.9-4.7x faster for YOLOv9 and
    1.0-3.8x for the DETRs' encoders on an H200 (docs/training-performance.md).
    multi_scale=true varies the batch's size and only one size is captured (MAX_GRAPHS): most
    steps would run eager beside the graph's memory, so auto leaves it off there."""
    asked = getattr(cfg, "cuda_graph", False)
    if asked != AUTO:
        return asked, None
    if device.type != "cuda":
        return False, None
    reason = unsupported_reason(model, family, device)
    if reason is not None:
        return False, f"cuda_graph=auto: off, {reason}"
    if getattr(cfg, "multi_scale", False):
        return False, ("cuda_graph=auto: off, multi_scale=true changes the batch's size from step to step "
                       f"(cuda_graph=true captures the first size seen {CAPTURE_AFTER} times)")
    return True, (f"cuda_graph=auto: on, {_REGION[family.capture.region]} replay from a CUDA graph once a batch "
                  f"size is seen {CAPTURE_AFTER} times (cuda_graph=false trains eager)")


# Under DDP the reference we follow trains eager: capture would have to happen before DDP wraps the
# model, inside a side-stream warm-up, with DDP's bucket hooks and all-reduces in the graph
# (PyTorch CUDA-graphs notes). Checked first, so a CPU DDP run says the same line as a GPU one.
MULTI_PROCESS = "not available under multi-GPU training"


def unsupported_reason(model: nn.Module, family: Any, device: torch.device) -> str | None:
    """Why this run cannot use CUDA graphs, or None."""
    if isinstance(model, nn.parallel.DistributedDataParallel) or _world_size() > 1:
        return MULTI_PROCESS
    plan = family.capture
    if plan.region not in ("network", "encoder"):
        return f"{family.display} has no capturable region ({plan.reason or plan.region})"
    if device.type != "cuda":
        return f"CUDA graphs need a CUDA device (training on {device.type})"
    return None


def _world_size() -> int:
    """Processes in the run: the process group's, else torchrun's WORLD_SIZE (graphs are decided
    before or after the group exists, the same way)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    try:
        return int(os.environ.get("WORLD_SIZE") or 1)
    except ValueError:
        return 1


def _pending_backward(graph: Graphed) -> bool:
    """True while the graph's last forward replay still waits for its backward.

    A second replay would overwrite the activations that backward needs, so that call runs
    eager instead. Backends without this notion (test fakes) never block.
    """
    check = getattr(graph, "pending_backward", None)
    return bool(check and check())


# --- the real capture --------------------------------------------------------------------------
class _GraphedRegion(torch.autograd.Function):
    """One autograd node whose forward and backward are graph replays.

    The backward replay adds the parameters' gradients into their `.grad` itself, so autograd
    needs no edge to the parameters: the node's one differentiable input is `anchor`, a scalar
    that only makes the outputs require grad. (With every parameter as an input, applying the
    node and running its backward cost 1.7 ms of host time per step for YOLOv9-t's 675
    parameters on a 2-core CPU, against 25 us with the anchor: benchmarks/autograd_inputs.py.)
    """

    @staticmethod
    def forward(ctx, shape: CapturedShape, images: Tensor, anchor: Tensor) -> tuple[Tensor, ...]:
        ctx.shape, ctx.images, ctx.done = shape, images, False
        out = shape.replay_forward(images)
        shape.last_ctx = weakref.ref(ctx)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads: Tensor) -> tuple[Tensor | None, ...]:
        shape = ctx.shape
        try:
            shape.replay_backward(grads)
        except Exception as exc:
            # The forward already ran as a graph; recompute it eagerly so this step still gets
            # its true gradients, and turn graphs off from here on.
            shape.on_error("backward replay", exc)
            shape.eager_accumulate(ctx.images, grads)
        ctx.done = True
        # The parameters' gradients are already in their `.grad`: nothing for autograd to add.
        return None, None, None


@dataclass(eq=False)
class CapturedShape:
    """The graphs and static buffers of one input shape (the real backend's `Graphed`)."""

    module: nn.Module
    params: tuple[Tensor, ...]
    autocast: AutocastFactory
    on_error: ErrorCallback
    forward_graph: Any               # torch.cuda.CUDAGraph (anything with .replay())
    backward_graph: Any
    static_input: Tensor
    static_outputs: tuple[Tensor, ...]              # detached; overwritten by every replay
    static_grad_outputs: tuple[Tensor | None, ...]  # None for outputs that need no gradient
    grad_buffers: tuple[Tensor, ...]                # each param's `.grad` at capture, one per param
    pool_mb: float | None = None
    last_ctx: Any = None
    anchor: Tensor = field(init=False)  # _GraphedRegion's differentiable input

    def __post_init__(self) -> None:
        self.anchor = torch.zeros((), device=self.static_input.device, requires_grad=bool(self.params))

    def __call__(self, images: Tensor) -> tuple[Tensor, ...]:
        return _GraphedRegion.apply(self, images, self.anchor)

    def pending_backward(self) -> bool:
        ctx = self.last_ctx() if self.last_ctx is not None else None
        return ctx is not None and not ctx.done

    def replay_forward(self, images: Tensor) -> tuple[Tensor, ...]:
        if images.data_ptr() != self.static_input.data_ptr():
            self.static_input.copy_(images)
        self.forward_graph.replay()
        # Fresh aliases each call: autograd attaches this step's node to them.
        return tuple(o.detach() for o in self.static_outputs)

    def replay_backward(self, grads: tuple[Tensor, ...]) -> None:
        """Replay the backward graph: it adds this micro-batch's gradients into `param.grad`."""
        self.reattach_grads()
        for buf, grad in zip(self.static_grad_outputs, grads):
            if buf is not None and grad is not None and buf.data_ptr() != grad.data_ptr():
                buf.copy_(grad)
        self.backward_graph.replay()

    def reattach_grads(self) -> None:
        """Make every param's `.grad` the tensor the graph accumulates into again.

        Identity checks only, unless something replaced a gradient since the last replay: a
        cleared one (None, i.e. zero) zeroes the captured tensor, a replaced one is copied in.
        """
        for p, buf in zip(self.params, self.grad_buffers):
            if p.grad is not buf:
                with torch.no_grad():
                    buf.zero_() if p.grad is None else buf.copy_(p.grad)
                p.grad = buf

    def eager_accumulate(self, images: Tensor, grads: tuple[Tensor, ...]) -> None:
        """Add this step's parameter gradients, recomputed without graphs (failure path only)."""
        self.reattach_grads()
        # Restore the buffers only after the backward: BN saves them for it, and restoring
        # them in place earlier would trip autograd's version check.
        with _buffers_restored(self.module):
            with torch.enable_grad(), self.autocast():
                outputs = self.module(images)
            pairs = [(o, g) for o, g in zip(outputs, grads) if o.requires_grad]
            with _autocast_off(images.device):
                torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs], inputs=list(self.params))


@contextlib.contextmanager
def _buffers_restored(module: nn.Module):
    """Run a forward whose BN running-stat updates must not count (warm-up, recomputation)."""
    saved = [b.detach().clone() for b in module.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for buf, value in zip(module.buffers(), saved):
                buf.copy_(value)


def _autocast_off(device: torch.device) -> contextlib.AbstractContextManager:
    """Eager backward runs outside autocast (the step calls it after the forward's autocast has
    exited), but capture happens inside the step's autocast: backward ops must not see it."""
    return torch.autocast(device.type, enabled=False)


@contextlib.contextmanager
def _stream_restored(stream):
    """torch.cuda.graph leaves its capture stream current when capture_end raises: undo that."""
    try:
        yield
    finally:
        torch.cuda.set_stream(stream)


def _capture_kwargs() -> dict[str, Any]:
    """Newer torch.cuda.graph arguments we use when this torch has them."""
    params = inspect.signature(torch.cuda.graph.__init__).parameters
    # The DataLoader's pin-memory thread makes CUDA calls while we capture; in the default
    # 'global' mode any of them would invalidate the capture.
    return {"capture_error_mode": "thread_local"} if "capture_error_mode" in params else {}


class CudaGraphBackend:
    """Warm up on a side stream, then capture forward and backward sharing one private pool."""

    def __init__(self, warmup_iters: int = 3):
        self.warmup_iters = int(warmup_iters)

    def capture(self, module: nn.Module, sample: Tensor, autocast: AutocastFactory,
                on_error: ErrorCallback) -> CapturedShape:
        device = sample.device
        params = tuple(p for p in module.parameters() if p.requires_grad)
        caller_stream = torch.cuda.current_stream(device)
        stream = torch.cuda.Stream(device=device)
        # A collection during capture could free an old graph mid-capture (PyTorch CUDA-graphs notes).
        gc.collect()
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            # Warm-up updates BN running stats (and num_batches_tracked) three times: undo that,
            # so the step's own replay is the only update, as in eager training.
            with _buffers_restored(module), _stream_restored(caller_stream):
                self._warm_up(module, sample, params, autocast, stream, caller_stream)
                torch.cuda.empty_cache()
                reserved = torch.cuda.memory_reserved(device)
                shape = self._record(module, sample, params, autocast, stream, on_error)
            shape.pool_mb = (torch.cuda.memory_reserved(device) - reserved) / 2**20
            return shape
        finally:
            if gc_was_enabled:
                gc.enable()

    def _warm_up(self, module, sample, params, autocast, stream, caller_stream) -> None:
        # On the capture stream, so lazy init (cuDNN autotune, cuBLAS handles) happens outside
        # the capture and on the stream the capture will use.
        stream.wait_stream(caller_stream)
        with torch.cuda.stream(stream):
            for _ in range(self.warmup_iters):
                with autocast():
                    outputs = _as_outputs(module(sample))
                needs = [o for o in outputs if o.requires_grad]
                with _autocast_off(sample.device):
                    torch.autograd.grad(needs, params, [torch.zeros_like(o) for o in needs], allow_unused=True)
                del outputs, needs
        caller_stream.wait_stream(stream)
        torch.cuda.synchronize(sample.device)

    def _record(self, module, sample, params, autocast, stream, on_error) -> CapturedShape:
        kwargs = _capture_kwargs()
        # The gradients must exist before the capture, outside its pool: the captured
        # AccumulateGrad then adds into them in place instead of making (stealing) new ones.
        with torch.no_grad():
            for p in params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p, memory_format=torch.preserve_format)
        grad_buffers = tuple(p.grad for p in params)
        forward_graph, backward_graph = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.cuda.graph(forward_graph, stream=stream, **kwargs):
            with autocast():
                outputs = _as_outputs(module(sample))
        grad_outputs = tuple(torch.empty_like(o) if o.requires_grad else None for o in outputs)
        needs = [(o, g) for o, g in zip(outputs, grad_outputs) if g is not None]
        # Capturing records kernels without running them: the gradients' values are unchanged.
        with torch.cuda.graph(backward_graph, pool=forward_graph.pool(), stream=stream, **kwargs), \
                _autocast_off(sample.device):
            torch.autograd.backward([o for o, _ in needs], [g for _, g in needs], inputs=list(params))
        # Keep detached outputs only: holding `outputs` would keep their autograd graph alive.
        return CapturedShape(module=module, params=params, autocast=autocast, on_error=on_error,
                             forward_graph=forward_graph, backward_graph=backward_graph,
                             static_input=sample, static_outputs=tuple(o.detach() for o in outputs),
                             static_grad_outputs=grad_outputs, grad_buffers=grad_buffers)

    def release(self) -> None:
        """After a failure or an invalidation: let pending work finish and return pool memory."""
        release_graph_memory()


def release_graph_memory() -> None:
    """Once dropped graphs are unreferenced: let pending work finish and return their pools' memory."""
    for step in (torch.cuda.synchronize, gc.collect, torch.cuda.empty_cache):
        try:
            step()
        except Exception:  # a failed capture can leave a sticky CUDA error; eager carries on
            pass


def _as_outputs(out: Any) -> tuple[Tensor, ...]:
    if not (isinstance(out, (tuple, list)) and all(isinstance(t, Tensor) for t in out)):
        raise TypeError(f"capturable must return a tuple of tensors, got {type(out).__name__}")
    return tuple(out)
