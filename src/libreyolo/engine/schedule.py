"""Learning rate and momentum schedule: linear warmup, then per-epoch cosine or linear decay.

Everything is a pure function of (epoch, batch index), counted in *batches* (not optimizer
steps), so a run resumed at epoch k recomputes exactly the values it would have had; the object
holds no state that matters beyond the configuration. All values are host-side Python floats.

- Decay: epoch e trains at lr0 * f(e / epochs), f falling from 1 to `lrf` along a straight line
  or a half cosine (`lr_schedule`), constant within an epoch; `flat_cosine` holds lr0 for the
  first `lr_flat` of the epochs and then falls along the half cosine (DEIM's FlatCosine); or `step`: three equal stages at lr0,
  lr0 * sqrt(lrf) and lr0 * lrf (with lrf 0.01, torchvision's ResNet recipe: x0.1 at epochs 30 and
  60 of 90); or `poly`: lr0 * (lrf + (1 - lrf) * (1 - e / epochs) ** lr_power), mmsegmentation's
  PolyLR with eta_min = lr0 * lrf (power 1 is `linear`). The run ends where lr0 * lrf would
  begin: the last epoch still trains at lr0 * f((E - 1) / E), as the YOLOv5-8 trainers do. (Ending
  *at* lrf wasted a short run's last epoch: a 5-epoch run's last epoch trained at 0.01 lr0, and
  its mean LR was 16 % lower; docs/training-performance.md has the measured effect.)
- Warmup, over the first `round(warmup_epochs * steps_per_epoch)` batches (at least one), or
  exactly `warmup_iters` batches when that is > 0 (recipes that count iterations), but never
  past the start of the last epoch (none when `warmup_epochs == 0` and `warmup_iters == 0`, or in a
  one-epoch run). Warmup counts epochs, not a floor of batches: a floor of 100 batches (the
  YOLOv5-8 trainers' before Ultralytics 8.4) warmed a 48-image run of batch 16 (3 batches an
  epoch) up for a third of its 100 epochs, at a fraction of the LR and with small accumulations
  (benchmarks/trajectory.py shows both rules, iteration by iteration). The
  "bias" group's LR goes linearly from `warmup_bias_lr` to the target, the other groups' from 0
  to the target; SGD momentum from `warmup_momentum` to `momentum` (AdamW's beta1 stays at
  `momentum`: it is an averaging constant, not a step size); the batches accumulated per
  optimizer step from 1 to `accumulate`, so early updates are small and frequent.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from libreyolo.errors import ConfigError

SCHEDULES = ("cosine", "linear", "step", "flat_cosine", "poly")


def _interp(x: float, length: int, start: float, end: float) -> float:
    return start + (end - start) * min(max(x / length, 0.0), 1.0)


class LRSchedule:
    """Sets `lr` and momentum of every param group of `optimizer`; call `step(iteration)`.

    `iteration` = `epoch * steps_per_epoch + batch_index`, the global batch index: call it before
    each optimizer step with the index of the batch that completes it (calling it every batch is
    harmless: the values depend on the index only). Groups are told apart by their `name` key
    (`engine/optim.py`): one whose name ends in "bias" gets the bias warmup; a group's `lr_scale`
    (the backbone's `backbone_lr`) multiplies everything it is given.
    """

    def __init__(
        self, optimizer: torch.optim.Optimizer, cfg: Any, steps_per_epoch: int, accumulate: int = 1
    ):
        if cfg.lr_schedule not in SCHEDULES:
            raise ConfigError(
                f"lr_schedule={cfg.lr_schedule!r} is not supported; use one of {', '.join(SCHEDULES)}"
            )
        if steps_per_epoch < 1:
            raise ConfigError("the training loader yields no batches: fewer images than one batch")
        self.optimizer = optimizer
        self.steps_per_epoch = int(steps_per_epoch)
        self.accumulate = max(int(accumulate), 1)
        self.lr0, self.lrf, self.epochs = float(cfg.lr0), float(cfg.lrf), int(cfg.epochs)
        self.kind = cfg.lr_schedule
        self.flat = float(getattr(cfg, "lr_flat", 0.5))
        self.power = float(getattr(cfg, "lr_power", 1.0))
        self.momentum, self.warmup_momentum = float(cfg.momentum), float(cfg.warmup_momentum)
        self.warmup_bias_lr = float(cfg.warmup_bias_lr)
        iters = int(getattr(cfg, "warmup_iters", 0))
        warm = iters or max(round(cfg.warmup_epochs * self.steps_per_epoch), 1)
        last_epoch_start = (self.epochs - 1) * self.steps_per_epoch
        self.warmup_batches = min(warm, last_epoch_start) if iters or cfg.warmup_epochs > 0 else 0
        self.is_bias = [g.get("name", "").endswith("bias") for g in optimizer.param_groups]
        self.scales = [float(g.get("lr_scale", 1.0)) for g in optimizer.param_groups]
        self.last_iteration = -1

    def epoch_lr(self, epoch: int) -> float:
        """The decayed target LR of `epoch` (lr0 at epoch 0, reaching lr0 * lrf after the last)."""
        progress = min(max(epoch / self.epochs, 0.0), 1.0)
        if self.kind == "step":
            return self.lr0 * self.lrf ** (min(int(3 * progress), 2) / 2)
        if self.kind == "poly":  # mmsegmentation's PolyLR, eta_min = lr0 * lrf
            return self.lr0 * (self.lrf + (1.0 - self.lrf) * (1.0 - progress) ** self.power)
        if self.kind == "flat_cosine":  # DEIM's FlatCosine: lr0 until lr_flat, then the cosine
            progress = max(progress - self.flat, 0.0) / (1.0 - self.flat) if self.flat < 1.0 else 0.0
        if self.kind in ("cosine", "flat_cosine"):
            progress = (1.0 - math.cos(math.pi * progress)) / 2.0
        return self.lr0 * (1.0 + (self.lrf - 1.0) * progress)

    def lr_at(self, epoch: int, batch_index: int) -> list[float]:
        """LR of each param group, in optimizer order, for this batch of this epoch."""
        target = self.epoch_lr(epoch)
        i = self._global(epoch, batch_index)
        if i >= self.warmup_batches:
            return [target * scale for scale in self.scales]
        return [
            _interp(i, self.warmup_batches, self.warmup_bias_lr * scale if bias else 0.0, target * scale)
            for bias, scale in zip(self.is_bias, self.scales)
        ]

    def momentum_at(self, epoch: int, batch_index: int) -> float:
        i = self._global(epoch, batch_index)
        if i >= self.warmup_batches:
            return self.momentum
        return _interp(i, self.warmup_batches, self.warmup_momentum, self.momentum)

    def momentum_settled(self, iteration: int) -> bool:
        """Whether SGD's momentum stays what it is at global batch `iteration` for the rest of the
        run: always for AdamW (its beta1 is not scheduled), after the warmup for SGD."""
        ramped = any("momentum" in g and "betas" not in g for g in self.optimizer.param_groups)
        return not ramped or self.warmup_momentum == self.momentum or int(iteration) >= self.warmup_batches

    def accumulate_at(self, epoch: int, batch_index: int) -> int:
        """Batches to accumulate per optimizer step: ramps from 1 to `accumulate` during warmup."""
        i = self._global(epoch, batch_index)
        if i >= self.warmup_batches:
            return self.accumulate
        return max(1, round(_interp(i, self.warmup_batches, 1.0, self.accumulate)))

    def steps_optimizer(self, epoch: int, batch_index: int, accumulated: int) -> bool:
        """Whether the batch that brings the accumulation to `accumulated` batches steps the
        optimizer: once `accumulate_at` batches have contributed, and at every epoch's end, so an
        epoch ends on a clean update and a resume from last.pt is exact. (Ultralytics carries an
        accumulation across epoch ends instead: with fewer batches an epoch than one accumulation,
        40 epochs of one batch gave it 5 optimizer steps and us 40; benchmarks/trajectory.py.)"""
        return accumulated >= self.accumulate_at(epoch, batch_index) or batch_index + 1 == self.steps_per_epoch

    def step(self, iteration: int) -> None:
        """Write the LRs and momentum of global batch `iteration` into the optimizer."""
        epoch, batch_index = divmod(int(iteration), self.steps_per_epoch)
        momentum = self.momentum_at(epoch, batch_index)
        for group, lr in zip(self.optimizer.param_groups, self.lr_at(epoch, batch_index)):
            group["lr"] = lr
            if "momentum" in group and "betas" not in group:
                group["momentum"] = momentum
        self.last_iteration = int(iteration)

    def state_dict(self) -> dict[str, int]:
        return {"last_iteration": self.last_iteration, "steps_per_epoch": self.steps_per_epoch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restore and re-apply the last values (the schedule itself comes from the config).

        A resume with another batch size has another `steps_per_epoch`; the position is kept as
        (epoch, batch index), which is what the schedule depends on.
        """
        last = int(state["last_iteration"])
        if last < 0:
            self.last_iteration = -1
            return
        epoch, batch_index = divmod(last, int(state.get("steps_per_epoch", self.steps_per_epoch)))
        self.step(self._global(epoch, min(batch_index, self.steps_per_epoch - 1)))

    def _global(self, epoch: int, batch_index: int) -> int:
        return epoch * self.steps_per_epoch + batch_index
