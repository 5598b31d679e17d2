"""One training step, as named phases in order: h2d, forward, loss, backward, optimizer, ema.

(`data`, the wait for the batch, is measured by the trainer.) The step performs no host
synchronisation: the loss items it returns stay on the device and are read once per log interval.
Levers wrap the step instead of forking it: `precision` supplies autocast and the scaler; a CUDA
graph manager, when present, stands in for `model.capturable`; under multi-process training the
DDP wrapper (engine/distributed.py) runs the forward, so backward all-reduces the gradients; under
`cuda_graph=full` the whole-step graphs (engine/fullstep.py) capture these same functions
(`prepare_images`, `forward_loss`, the scaled backward, `apply_update`) and replay them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..markers import phase
from .ema import ModelEMA
from .precision import Precision


@dataclass
class StepContext:
    """What a step needs; built once by the trainer."""

    model: nn.Module
    capturable: Callable[[torch.Tensor], tuple]  # model.capturable, or the graph manager around it
    criterion: Callable
    optimizer: torch.optim.Optimizer
    precision: Precision
    params: list[torch.Tensor]
    clip_grad: float
    ema: ModelEMA | None
    device: torch.device
    channels_last: bool = False
    graphs: Any = None  # the GraphManager behind `capturable` (stats, invalidate)
    ddp: Any = None     # DistributedDataParallel around the training forward, under multi-process training
    whole: Any = None   # cuda_graph=full: the WholeStep (engine/fullstep.py) that replays captured steps
    handoff: Any = None  # optim.GradHandoff: the eager backward's gradients added in one call (no graphs)


def train_step(ctx: StepContext, batch, update: bool) -> torch.Tensor:
    """Run one step on `batch`; apply the optimizer when `update` (gradient accumulation).

    Returns the detached loss items (device tensor). Under `cuda_graph=full` (engine/fullstep.py)
    a batch of a captured shape replays the whole step instead; any other runs the code below.
    """
    if ctx.whole is not None:
        items = ctx.whole(batch, update)
        if items is not None:
            return items
    with phase("h2d"):
        # uint8 over the bus (4x fewer bytes), pinned memory + non_blocking so the copy overlaps.
        images = prepare_images(ctx, batch.images.to(ctx.device, non_blocking=True))
        targets = batch.targets.to(ctx.device, non_blocking=True)
    # Under DDP a micro-batch that does not step the optimizer keeps its gradients local
    # (no_sync); the one that steps all-reduces the accumulated sum during its backward.
    local = ctx.ddp.no_sync() if ctx.ddp is not None and not update else contextlib.nullcontext()
    handoff = ctx.handoff if ctx.ddp is None else None
    with local:
        loss, loss_items = forward_loss(ctx, images, targets)
        with phase("backward"):
            if handoff is None:
                ctx.precision.backward(loss)
            else:
                handoff.release()
                try:
                    ctx.precision.backward(loss)
                finally:
                    handoff.collect()
    if update:
        apply_update(ctx)
    return loss_items


def prepare_images(ctx: StepContext, images: torch.Tensor) -> torch.Tensor:
    """uint8 images on the device -> the network's float input in [0, 1] (channels_last if set)."""
    if ctx.channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    return images.float().div_(255.0)


def forward_loss(ctx: StepContext, images: torch.Tensor, targets) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward under the step's autocast, then the criterion: (loss, detached loss items)."""
    with phase("forward"):
        with ctx.precision.autocast():
            if ctx.ddp is not None:
                preds = ctx.ddp(images, targets)
            else:
                preds = ctx.model.forward_train(ctx.capturable(images), targets)
    with phase("loss"):
        # Outside autocast: the criterion works in float32 whatever the autocast dtype.
        return ctx.criterion(preds, targets)


def apply_update(ctx: StepContext, ema_weight: torch.Tensor | None = None) -> None:
    """The optimizer step (unscale, clip, step, scale update, zeroed gradients), then the EMA.

    `ema_weight`: the EMA's blend weight as a device scalar (the captured update's, which the host
    writes before each replay) instead of the EMA's own host-side count.
    """
    with phase("optimizer"):
        ctx.precision.step(ctx.optimizer, ctx.params, ctx.clip_grad)
    if ctx.ema is not None:
        with phase("ema"):
            ctx.ema.update(ctx.model, ema_weight)
