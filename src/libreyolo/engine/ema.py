"""Exponential moving average of the model weights, updated with foreach ops.

`ema = d * ema + (1 - d) * model` with `d = decay * (1 - exp(-updates / tau))`: the ramp lets
the average follow the fast-moving early weights instead of remembering the random init.
`d` is a Python float computed from a host-side counter, so an update never syncs with the GPU
and costs a few fused kernel launches whatever the number of tensors. A captured update
(`cuda_graph=full`) takes `1 - d` as a device scalar instead, which its host writes before each
replay, and counts the update itself.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import Tensor, nn

from ..config import FIELDS

# The ramp's time constant in optimizer steps, the ema_tau key's default (config.py holds the one
# value): YOLOv5's ModelEMA's, which the peer trainer and the YOLOX, RTMDet (mmdet's ExpMomentumEMA,
# gamma 2000) and RT-DETR recipes share.
EMA_TAU: float = FIELDS["ema_tau"].default


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module under DDP/DataParallel (`.module`) and torch.compile (`._orig_mod`)."""
    while True:
        if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
            model = model.module
        elif hasattr(model, "_orig_mod") and isinstance(model._orig_mod, nn.Module):
            model = model._orig_mod
        else:
            return model


class ModelEMA:
    """Holds `self.ema`, an eval-mode, grad-free deep copy of the (unwrapped) model.

    Create it after the model is on its device and in its final memory format: moving a module
    replaces its buffer tensors, which would leave the pre-built tensor lists pointing at the old
    ones. Create it before wrapping the model for CUDA graphs (a graphed module does not copy).
    """

    def __init__(self, model: nn.Module, decay: float = 0.9999, tau: float = EMA_TAU, updates: int = 0):
        self.ema = copy.deepcopy(unwrap(model)).eval().requires_grad_(False)
        self.decay, self.tau, self.updates = float(decay), float(tau), int(updates)
        self._source: nn.Module | None = None
        self._pairs: tuple[list[Tensor], ...] = ()

    def current_decay(self, updates: int | None = None) -> float:
        """`d` for the given (default: current) update count; 0 before the first update."""
        n = self.updates if updates is None else updates
        return self.decay * (1.0 - math.exp(-n / self.tau))

    @torch.no_grad()
    def update(self, model: nn.Module, weight: Tensor | None = None) -> None:
        """Blend the weights of `model` (the one trained) into the average.

        `weight`: `1 - d` as a 0-d device tensor, for a captured update; its caller counts the
        update (`updates`) and writes the weight before each replay (the default: this count's).
        """
        model = unwrap(model)
        if model is not self._source:
            self._pairs = self._pair_tensors(model)
            self._source = model
        ema_float, model_float, ema_other, model_other = self._pairs
        if weight is None:
            self.updates += 1
            weight = 1.0 - self.current_decay()
            if ema_float:
                # lerp: ema += (model - ema) * (1 - d), one fused kernel per device/dtype group.
                torch._foreach_lerp_(ema_float, model_float, weight)
        elif ema_float:
            # The same blend with the weight on the device (foreach lerp takes a host scalar or
            # one weight tensor per tensor): ema += (model - ema) * w.
            step = torch._foreach_sub(model_float, ema_float)
            torch._foreach_mul_(step, weight)
            torch._foreach_add_(ema_float, step)
        if ema_other:
            # Integer buffers (BatchNorm's num_batches_tracked) are counters, not averages.
            torch._foreach_copy_(ema_other, model_other)

    def _pair_tensors(self, model: nn.Module) -> tuple[list[Tensor], ...]:
        """Matching (ema, model) tensors by name, split into floating point and the rest."""
        ema_tensors = {**dict(self.ema.named_parameters()), **dict(self.ema.named_buffers())}
        model_tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
        if ema_tensors.keys() != model_tensors.keys():
            raise ValueError("ModelEMA.update got a model whose parameters differ from the averaged one")
        ema_float, model_float, ema_other, model_other = [], [], [], []
        for name, e in ema_tensors.items():
            if e.is_floating_point():
                ema_float.append(e)
                model_float.append(model_tensors[name])
            else:
                ema_other.append(e)
                model_other.append(model_tensors[name])
        return ema_float, model_float, ema_other, model_other

    def state_dict(self) -> dict[str, Any]:
        return {"ema": self.ema.state_dict(), "updates": self.updates, "decay": self.decay, "tau": self.tau}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # load_state_dict copies in place, so the pre-built tensor lists stay valid.
        self.ema.load_state_dict(state["ema"])
        self.updates = int(state["updates"])
        self.decay = float(state.get("decay", self.decay))
        self.tau = float(state.get("tau", self.tau))
