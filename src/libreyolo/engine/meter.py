"""The loss meter: device-side sums of the loss items, read back once per log interval.

The read-back is the only place the training loop meets the device's results. A float16 step
that the loss scaler skipped (inf/NaN items) must neither poison the logged mean nor go
unnoticed: each step adds its items only when all are finite and counts the finite steps; the
read-back decides what a non-finite step means (without a scaler, the run stops with one line).

On CUDA the read-back within an epoch is deferred, so the loop does not wait for the device to
catch up: at an interval's end the sums are copied into pinned host memory behind the step's
kernels (an event marks the copy) and the device sums start again; the copy is read at the next
interval's end, when the device has normally finished it (the read waits at most for that
copy). A synchronous read once per interval made the device idle while the host caught up: on
the H200, a graphed YOLOv9-t batch-8 step took 27.5 ms at the read and 25.2 ms the step after,
against 19.9 ms for the others. The epoch's last interval is read at once (`final`): the
epoch's time and its losses are then complete. So the progress figures trail by one interval,
and a non-finite loss without a scaler is caught one interval later, still named by the
interval it happened in.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import LibreYOLOError


class NonFiniteLossError(LibreYOLOError):
    """The loss became NaN/inf without a loss scaler to absorb it."""


@dataclass
class _Interval:
    """One interval's sums on their way to the host."""
    host: torch.Tensor               # [items..., finite steps], filled by the copy
    event: torch.cuda.Event | None   # the copy's completion (None: the copy was synchronous)
    where: str                       # epoch and step of the interval's end, for an error
    steps: int
    images: int
    t0: float                        # host time (perf_counter) of the interval's start ...
    t_end: float                     # ... and of its end, when the copy was queued


class LossMeter:
    def __init__(self, item_names: tuple[str, ...], device: torch.device, deferred: bool | None = None):
        self.item_names, self.device = tuple(item_names), device
        self.deferred = device.type == "cuda" if deferred is None else deferred
        n = len(self.item_names) + 1
        self._acc = torch.zeros(n, device=device)  # device-side loss sums, then the finite-step count
        # Two host buffers: one interval's copy in flight while the previous one is read.
        pin = device.type == "cuda"
        self._host = [torch.zeros(n, pin_memory=pin) for _ in range(2)]
        self._next_host = 0
        self._pending: _Interval | None = None
        self.last_log: dict[str, float] | None = None                 # img/s, GPU memory of the last read
        self.start_epoch()

    def start_epoch(self) -> None:
        self._epoch_sum, self._epoch_count = [0.0] * len(self.item_names), 0
        self._pending = None  # an epoch ends on a final read; only a failed one can leave one here
        self._reset_interval()

    def _reset_interval(self) -> None:
        self._acc.zero_()
        self.interval_steps, self._interval_images, self._interval_t0 = 0, 0, time.perf_counter()

    def add(self, items: torch.Tensor, images: int) -> None:
        """One step's detached items: four tiny device ops, no sync."""
        ok = torch.isfinite(items).all()
        self._acc[:-1] += torch.where(ok, items, 0.0)
        self._acc[-1] += ok
        self.interval_steps += 1
        self._interval_images += images

    def read(self, scaler_enabled: bool, where: str, last_good: Callable[[], str], final: bool = False) -> None:
        """End the interval (`where`: its epoch and step) and read back the sums: at once when not
        deferred or `final` (the sync), else only the previous interval's, whose copy is normally
        done by now. Non-finite steps without a loss scaler raise NonFiniteLossError naming the
        interval and `last_good()` (what to resume from, asked only then: it waits for the
        checkpoint thread)."""
        current = self._copy_out(where) if self.interval_steps else None
        previous, self._pending = self._pending, None
        if previous is not None:
            self._settle(previous, scaler_enabled, last_good)
        if current is not None and self.deferred and not final:
            self._pending = current
        elif current is not None:
            self._settle(current, scaler_enabled, last_good, timed_at_sync=True)

    def _copy_out(self, where: str) -> _Interval:
        host = self._host[self._next_host]
        self._next_host ^= 1
        event = None
        if self.device.type == "cuda":
            host.copy_(self._acc, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        else:
            host.copy_(self._acc)
        interval = _Interval(host, event, where, self.interval_steps, self._interval_images, self._interval_t0,
                             time.perf_counter())
        self._reset_interval()  # the zeroing is queued behind the copy on the same stream
        return interval

    def _settle(self, interval: _Interval, scaler_enabled: bool, last_good: Callable[[], str],
                timed_at_sync: bool = False) -> None:
        """Count an interval's copied sums. `timed_at_sync`: read at once, so the interval ends when
        the device has finished it (the host may have queued it well before)."""
        if interval.event is not None:
            interval.event.synchronize()  # normally done already, unless this is a read at once
        seconds = max((time.perf_counter() if timed_at_sync else interval.t_end) - interval.t0, 1e-9)
        *sums, finite = interval.host.tolist()
        bad = interval.steps - int(finite)
        if bad and not scaler_enabled:
            means = " ".join(f"{k}={v:.4g}" for k, v in self.epoch_means().items())
            raise NonFiniteLossError(f"non-finite loss at {interval.where} ({bad} of the last {interval.steps} "
                                     f"steps); epoch mean so far {means}; {last_good()}")
        self._epoch_sum = [a + b for a, b in zip(self._epoch_sum, sums)]
        self._epoch_count += int(finite)
        self.last_log = {"img_s": interval.images / seconds}
        if self.device.type == "cuda":
            self.last_log["mem_gb"] = torch.cuda.max_memory_reserved(self.device) / 2**30

    def state_dict(self) -> dict[str, Any]:
        """The epoch's sums so far, as a mid-epoch checkpoint keeps them (after a `final` read:
        nothing is left on the device), so the resumed epoch's means are the whole epoch's."""
        return {"sums": list(self._epoch_sum), "count": self._epoch_count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        sums = [float(v) for v in state["sums"]]
        if len(sums) != len(self.item_names):
            raise ValueError(f"the checkpoint's loss meter has {len(sums)} items, this loss {len(self.item_names)}")
        self._epoch_sum, self._epoch_count = sums, int(state["count"])

    def epoch_means(self) -> dict[str, float]:
        """Mean loss items over this epoch's finite steps read back so far."""
        count = max(self._epoch_count, 1)
        return {k: v / count for k, v in zip(self.item_names, self._epoch_sum)}
