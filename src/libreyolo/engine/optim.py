"""The optimizer: SGD (Nesterov) or AdamW over three parameter groups.

Groups, in this order, each with a `name` key (the LR schedule finds the bias group by name):
  0 "weights": conv/linear weights (ndim >= 2, not in a norm layer), weight decay on;
  1 "norm":    norm-layer weights and any other non-bias parameter with ndim < 2, no decay;
  2 "bias":    every parameter called `bias`, no decay, own group so warmup can give it its own LR.
With a `backbone` module and `backbone_lr != 1` the backbone's parameters form their own groups
with `lr_scale = backbone_lr` (the LR schedule multiplies by it), each after the model's group of
the same kind: weights, backbone.weights, norm, backbone.norm, bias, backbone.bias ([0] stays
"weights"). Empty groups are left out. Each group holds one flat tensor of which its parameters and their
gradients are views (`flatten`), so the optimizer, unscaling, clipping and zeroing launch per
group, not per parameter. Build the optimizer after the model is on its device and in its memory
format: moving the model afterwards would detach the parameters from the flat tensors.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Collection
from typing import Any

import torch
from torch import nn

from libreyolo.errors import ConfigError

OPTIMIZERS = ("sgd", "adamw")
# optimizer=auto: a run of at most this many optimizer steps trains with AdamW, a longer one with
# SGD. The rule, the threshold and the AdamW learning rate below are the peer trainer's
# (Ultralytics 8.x `optimizer=auto`): on the 5-epoch benchmark of docs/training-performance.md its
# AdamW beat its SGD arm, as ours did.
AUTO_MAX_ADAMW_STEPS = 10_000

# Layers whose weight is a per-channel scale: decaying it towards 0 fights the normalisation.
_NORMS = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm, nn.LocalResponseNorm)


def resolve_auto(cfg: Any, num_classes: int, optimizer_steps: int,
                 explicit: Collection[str] = ()) -> tuple[Any, str | None]:
    """`optimizer=auto` made concrete for this run: (cfg with optimizer/lr0/momentum set, log line).

    Short runs (fine-tunes) get AdamW with lr0 = 0.002 * 5 / (4 + num_classes) (rounded to 6
    decimals), beta1 0.9 and no bias warmup LR; long ones SGD with the configured lr0 and
    momentum. A value the user gave (`explicit`) that AdamW's replaces is named in the line, with
    how to keep it. Any other optimizer passes through unchanged (line None).
    """
    if str(cfg.optimizer).lower() != "auto":
        return cfg, None
    if optimizer_steps > AUTO_MAX_ADAMW_STEPS:
        return dataclasses.replace(cfg, optimizer="sgd"), (
            f"optimizer=auto: SGD lr0={cfg.lr0:g} momentum={cfg.momentum:g} ({optimizer_steps} optimizer "
            f"steps > {AUTO_MAX_ADAMW_STEPS}; optimizer=sgd|adamw chooses yourself)")
    lr0 = round(0.002 * 5 / (4 + num_classes), 6)
    chosen = {"lr0": lr0, "momentum": 0.9, "warmup_bias_lr": 0.0}
    replaced = [f"{k}={getattr(cfg, k):g}" for k, v in chosen.items() if k in explicit and getattr(cfg, k) != v]
    line = (f"optimizer=auto: AdamW lr0={lr0:g} momentum=0.9 warmup_bias_lr=0 ({optimizer_steps} optimizer "
            f"steps <= {AUTO_MAX_ADAMW_STEPS}, {num_classes} classes; optimizer=sgd|adamw chooses yourself)")
    if replaced:
        line += f"; replaced your {' '.join(replaced)} (optimizer=adamw keeps them)"
    return dataclasses.replace(cfg, optimizer="adamw", **chosen), line


def accumulate_steps(batch: int, nbs: int) -> int:
    """Batches to accumulate per optimizer step so each step sees about `nbs` images."""
    return max(round(nbs / batch), 1)


def accumulation(cfg: Any) -> int:
    """The run's batches per optimizer step: `accumulate` once resolved, else round(nbs/batch)."""
    return cfg.accumulate if isinstance(cfg.accumulate, int) else accumulate_steps(cfg.batch, cfg.nbs)


def resolve_accumulate(cfg: Any, steps_per_epoch: int, explicit: Collection[str] | None) -> tuple[Any, str | None]:
    """`accumulate=auto` made concrete for this run: (cfg with an int `accumulate`, log line or None).

    Summing round(nbs/batch) batches per optimizer step buys a less noisy gradient with steps. A
    COCO schedule has 10^5 steps to spare; a fine-tune on a few hundred images at nbs=64 has a few
    dozen (64 tiles at batch 8 over 50 epochs: 50 steps), and its length, not the gradient noise,
    limits it: on the five generated regimes (docs/accuracy.md) training without accumulation
    raised mAP50-95 by 0.16 to 0.29 over the nbs=64 default, three seeds each. So a run of at most
    `AUTO_MAX_ADAMW_STEPS` optimizer steps at round(nbs/batch), the threshold and the step count
    optimizer=auto decides by, accumulates only as many batches as keep it at that many steps, down
    to 1; weight decay stays scaled per image (build_optimizer). A given `nbs` or `accumulate`
    is kept, and `explicit` None (a resume of a run from before this key) keeps round(nbs/batch).
    """
    if isinstance(cfg.accumulate, int):
        return cfg, None
    nominal = accumulate_steps(cfg.batch, cfg.nbs)
    batches = cfg.epochs * steps_per_epoch
    steps = cfg.epochs * math.ceil(steps_per_epoch / nominal)
    if explicit is None or "nbs" in explicit or steps > AUTO_MAX_ADAMW_STEPS:
        return dataclasses.replace(cfg, accumulate=nominal), None
    chosen = max(1, min(nominal, batches // AUTO_MAX_ADAMW_STEPS))
    cfg = dataclasses.replace(cfg, accumulate=chosen)
    if chosen == nominal:
        return cfg, None
    return cfg, (f"accumulate=auto: {chosen} batch{'es' if chosen > 1 else ''} per optimizer step instead of "
                 f"round(nbs/batch) = {nominal}: {cfg.epochs * math.ceil(steps_per_epoch / chosen)} optimizer "
                 f"steps instead of {steps} (<= {AUTO_MAX_ADAMW_STEPS}: a short run, limited by its steps; "
                 f"accumulate=N or nbs=N chooses yourself)")


def param_groups(model: nn.Module) -> dict[str, list[nn.Parameter]]:
    """Trainable parameters split into "weights", "norm" and "bias" (shared ones counted once)."""
    groups: dict[str, list[nn.Parameter]] = {"weights": [], "norm": [], "bias": []}
    seen: set[int] = set()
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            if not p.requires_grad or id(p) in seen:
                continue
            seen.add(id(p))
            if name == "bias":
                groups["bias"].append(p)
            elif isinstance(module, _NORMS) or p.ndim < 2:
                groups["norm"].append(p)
            else:
                groups["weights"].append(p)
    return groups


def build_optimizer(model: nn.Module, cfg: Any, *, device_type: str,
                    backbone: nn.Module | None = None) -> torch.optim.Optimizer:
    """SGD or AdamW from `cfg` (optimizer, lr0, momentum, weight_decay, batch, nbs, accumulate).

    Weight decay is scaled by `batch * accumulate / nbs`, so it stays the same per image whatever
    the batch size. On CUDA the fused implementation is used where this torch has one (one kernel
    per step, and GradScaler can skip its `.item()` sync), else foreach.
    """
    name = str(cfg.optimizer).lower()
    if name not in OPTIMIZERS:  # `auto` is resolved before (resolve_auto)
        raise ConfigError(
            f"optimizer={cfg.optimizer!r} is not supported; use one of {', '.join(OPTIMIZERS)}"
        )
    decay = cfg.weight_decay * cfg.batch * accumulation(cfg) / cfg.nbs
    scale = float(getattr(cfg, "backbone_lr", 1.0))
    slow = {id(p) for p in backbone.parameters()} if backbone is not None and scale != 1.0 else set()
    groups = []
    for group, params in param_groups(model).items():  # the model's own groups first: [0] is "weights"
        for prefix, lr_scale, members in (("", 1.0, [p for p in params if id(p) not in slow]),
                                          ("backbone.", scale, [p for p in params if id(p) in slow])):
            if members:
                groups.append({"name": prefix + group, "params": [flatten(members)], "lr_scale": lr_scale,
                               "weight_decay": decay if group == "weights" else 0.0})
    if not groups:
        raise ConfigError("the model has no trainable parameters")
    if name == "sgd":
        cls = torch.optim.SGD
        # torch rejects nesterov without momentum; momentum=0 is plain SGD.
        kwargs = {"momentum": cfg.momentum, "nesterov": cfg.momentum > 0}
    else:
        cls = torch.optim.AdamW
        kwargs = {"betas": (cfg.momentum, 0.999)}
    optimizer = cls(groups, lr=cfg.lr0, **kwargs, **implementation_kwargs(cls, device_type))
    if name == "sgd" and cfg.momentum > 0:
        zero_momentum_buffers(optimizer)
    return optimizer


# The CUDA caching allocator hands out blocks rounded to 512 bytes (kMinBlockSize in
# c10/cuda/CUDACachingAllocator.cpp): kernels may assume at least that of a tensor they were given.
VIEW_ALIGN_BYTES = 512


def flatten(params: list[nn.Parameter]) -> nn.Parameter:
    """One parameter holding `params` back to back, and one gradient buffer holding their `.grad`.

    Each parameter becomes a view of the flat tensor (same shape, strides and memory format) and
    its `.grad` a view of the flat gradient, so autograd accumulates straight into the flat buffer
    and the optimizer, gradient unscaling, clipping and zeroing each work on one tensor per group
    instead of hundreds: their host cost, not their kernels, dominated the optimizer phase
    (docs/training-performance.md). The element-wise updates are the same numbers either way.
    Every view starts on a `VIEW_ALIGN_BYTES` boundary, like a fresh CUDA allocation: cuDNN
    refuses (or faults on) misaligned weights, which the H200 showed when the views were packed
    tight. The gaps hold zeros that the optimizer leaves at zero (no gradient, no decay to apply).
    The flat tensors must stay the storage: move the model (`.to()`) before building the
    optimizer, never after.
    """
    first = params[0]
    align = max(1, VIEW_ALIGN_BYTES // first.element_size())
    starts, end = [], 0
    for p in params:
        starts.append(end)
        end += -(-p.numel() // align) * align
    flat = torch.zeros(end, dtype=first.dtype, device=first.device)
    flat_grad = torch.zeros_like(flat)
    with torch.no_grad():
        for p, start in zip(params, starts):
            n = p.numel()
            view, grad = _view_like(flat[start:start + n], p), _view_like(flat_grad[start:start + n], p)
            view.copy_(p)
            if p.grad is not None:
                grad.copy_(p.grad)
            p.data, p.grad = view, grad
    merged = nn.Parameter(flat)
    merged.grad = flat_grad
    merged.members = tuple(params)  # the parameters it holds, for GradHandoff
    return merged


class GradHandoff:
    """An eager backward's gradients, taken over by autograd and added into the flat ones at once.

    With every parameter's `.grad` a view of its group's flat gradient, autograd adds each new
    gradient into it with one in-place add per parameter: 675 launches a step for YOLOv9-t, a
    sixth of its eager step's (benchmarks/results/op_count_cpu_b8_256.json). With `.grad` None
    autograd hands the new gradient over instead (no kernel), and `collect` adds them all into the
    flat gradients with one foreach add, then puts the views back, so between steps every
    parameter's `.grad` is its view as before. The sums are the same numbers (acc + g either way).
    Only for the eager step without DDP (whose reducer reads the gradients itself) and without
    CUDA graphs (whose backward graph adds into the views)."""

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.params: list[nn.Parameter] = []
        self.views: list[torch.Tensor] = []
        for group in optimizer.param_groups:
            for merged in group["params"]:
                for p in getattr(merged, "members", ()):
                    self.params.append(p)
                    self.views.append(p.grad)

    def release(self) -> None:
        """Before a backward: let autograd hand each new gradient over."""
        for p in self.params:
            p.grad = None

    def collect(self) -> None:
        """After it (or after it failed): the handed-over gradients added into the flat ones."""
        views, grads = [], []
        for p, view in zip(self.params, self.views):
            g = p.grad
            if g is not None and g is not view:
                views.append(view)
                grads.append(g)
            p.grad = view
        if grads:
            torch._foreach_add_(views, grads)


def _view_like(chunk: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """`chunk` (1-D, p.numel() long) seen with p's shape and strides (channels_last stays so)."""
    return chunk.as_strided(p.shape, p.stride()) if _dense(p) else chunk.view(p.shape)


def _dense(t: torch.Tensor) -> bool:
    """True when t's strides are some permutation of a contiguous layout (no gaps, no overlap)."""
    expected = 1
    for size, stride in sorted(zip(t.shape, t.stride()), key=lambda d: (d[1], d[0])):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def zero_momentum_buffers(optimizer: torch.optim.SGD) -> None:
    """Start every SGD momentum buffer at zero instead of letting the first step create it.

    Fused SGD creates the buffers with `empty_like` on its first step and fills them in the
    kernel; when GradScaler skips that first step for an overflow (usual with float16: the scale
    starts at 2**16), the kernel returns early and the buffers keep uninitialised memory (NaN,
    1e38), which the next real step writes into the weights. A zero buffer gives the same first
    update as torch's own first step (buf = momentum * 0 + grad = grad).
    """
    for group in optimizer.param_groups:
        for p in group["params"]:
            optimizer.state[p]["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def implementation_kwargs(cls: type, device_type: str) -> dict[str, bool]:
    """`fused=True` on CUDA when `cls` accepts it, else `foreach=True`; torch's default on CPU."""
    if device_type != "cuda":
        return {}
    accepted = inspect.signature(cls).parameters
    if "fused" in accepted:
        return {"fused": True}
    return {"foreach": True} if "foreach" in accepted else {}
