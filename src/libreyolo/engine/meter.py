"""The loss meter: device-side sums of the loss items, read back once per log interval.

The read-back is the training loop's one host synchronisation. A float16 step that the loss
scaler skipped (inf/NaN items) must neither poison the logged mean nor go unnoticed: each step
adds its items only when all are finite and counts the finite steps; the read-back decides what
a non-finite step means (without a scaler, the run stops with one line).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from ..errors import LibreYOLOError


class NonFiniteLossError(LibreYOLOError):
    """The loss became NaN/inf without a loss scaler to absorb it."""


class LossMeter:
    def __init__(self, item_names: tuple[str, ...], device: torch.device):
        self.item_names, self.device = tuple(item_names), device
        self._acc = torch.zeros(len(self.item_names), device=device)  # device-side loss sums
        self._finite = torch.zeros((), device=device)                 # finite steps in the interval
        self.last_log: dict[str, float] | None = None                 # img/s, GPU memory of the last read
        self.start_epoch()

    def start_epoch(self) -> None:
        self._epoch_sum, self._epoch_count = [0.0] * len(self.item_names), 0
        self._reset_interval()

    def _reset_interval(self) -> None:
        self._acc.zero_()
        self._finite.zero_()
        self.interval_steps, self._interval_images, self._interval_t0 = 0, 0, time.perf_counter()

    def add(self, items: torch.Tensor, images: int) -> None:
        """One step's detached items: four tiny device ops, no sync."""
        ok = torch.isfinite(items).all()
        self._acc += torch.where(ok, items, 0.0)
        self._finite += ok
        self.interval_steps += 1
        self._interval_images += images

    def read(self, scaler_enabled: bool, where: str, last_good: Callable[[], str]) -> None:
        """Fetch the interval's sums (the sync). Non-finite steps without a loss scaler raise
        NonFiniteLossError naming `where` (epoch, step) and `last_good()` (what to resume from,
        asked only then: it waits for the checkpoint thread)."""
        values = torch.cat([self._acc, self._finite.reshape(1)]).tolist()
        *sums, finite = values
        bad = self.interval_steps - int(finite)
        if bad and not scaler_enabled:
            means = " ".join(f"{k}={v:.4g}" for k, v in self.epoch_means().items())
            raise NonFiniteLossError(f"non-finite loss at {where} ({bad} of the last {self.interval_steps} steps); "
                                     f"epoch mean so far {means}; {last_good()}")
        self._epoch_sum = [a + b for a, b in zip(self._epoch_sum, sums)]
        self._epoch_count += int(finite)
        elapsed = max(time.perf_counter() - self._interval_t0, 1e-9)
        self.last_log = {"img_s": self._interval_images / elapsed}
        if self.device.type == "cuda":
            self.last_log["mem_gb"] = torch.cuda.max_memory_reserved(self.device) / 2**30
        self._reset_interval()

    def epoch_means(self) -> dict[str, float]:
        """Mean loss items over this epoch's finite steps read back so far."""
        count = max(self._epoch_count, 1)
        return {k: v / count for k, v in zip(self.item_names, self._epoch_sum)}
