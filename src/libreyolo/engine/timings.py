"""Where a training run's wall clock goes: set-up, the first step, epochs, validation, checkpoints.

A user buys time to accuracy, and a short fine-tune spends a large share of it outside the steady
steps. `RunClock` records host wall-clock marks (no device sync of its own: the loop's epoch ends
already wait for the device through the loss read-back) and `summary()` turns them into the
figures the train summary prints and `timings.json` holds:

- `setup_s`: trainer construction (loaders, model to device, optimizer, EMA, graph manager);
- `first_batch_wait_s`: the first batch's wait (worker start-up and their first decode);
- `first_epoch_s`, `steady_epoch_s` (median of the later epochs' step loops) and
  `first_epoch_overhead_s` = first - steady: warm-up costs (cuDNN autotuning, graph capture,
  worker start) that only the first epoch pays (none when the first epoch was the rest of an
  epoch that a mid-epoch checkpoint resumed: it is not comparable);
- `validation_s`, `val_img_s`, `checkpoint_s`: totals of the validation and checkpoint hooks
  (the checkpoint figure is the training thread's share: the state's detached copy each epoch and
  the wait for the checkpoint thread at the end);
- `*_unix` marks, so a harness that knows when it started the process can compute the time to
  the first step (imports and model build included).
"""

from __future__ import annotations

import statistics
import time
from typing import Any


class RunClock:
    def __init__(self) -> None:
        self.created_unix = time.time()
        self._created = time.perf_counter()
        self.train_start: float | None = None
        self.first_step_unix: float | None = None
        self.first_batch_wait_s: float | None = None
        self.epochs: list[float] = []          # seconds of each epoch's step loop
        self.first_whole = True                # False: the first was a resumed epoch's rest
        self.hooks: dict[str, float] = {}      # seconds per hook class, epoch-level events
        self.val_images = 0
        self.end: float | None = None

    def start_train(self) -> None:
        self.train_start = time.perf_counter()

    def first_step(self, batch_wait_s: float) -> None:
        if self.first_step_unix is None:
            self.first_step_unix = time.time()
            self.first_batch_wait_s = batch_wait_s

    def add_epoch(self, seconds: float, whole: bool = True) -> None:
        if not self.epochs:
            self.first_whole = whole
        self.epochs.append(seconds)

    def add_hook(self, name: str, seconds: float) -> None:
        self.hooks[name] = self.hooks.get(name, 0.0) + seconds

    def finish(self) -> None:
        self.end = time.perf_counter()

    def summary(self) -> dict[str, Any]:
        end = self.end if self.end is not None else time.perf_counter()
        start = self.train_start if self.train_start is not None else end
        steady = statistics.median(self.epochs[1:]) if len(self.epochs) > 1 else None
        first = self.epochs[0] if self.epochs else None
        validation = self.hooks.get("ValidationHook", 0.0)
        return {
            "setup_s": _r(start - self._created),
            "first_batch_wait_s": _r(self.first_batch_wait_s),
            "first_epoch_s": _r(first),
            "steady_epoch_s": _r(steady),
            "first_epoch_overhead_s": (_r(first - steady) if first is not None and steady is not None
                                       and self.first_whole else None),
            "epochs_s": [_r(e) for e in self.epochs],
            "validation_s": _r(validation),
            "val_img_s": _r(self.val_images / validation) if validation > 0 and self.val_images else None,
            "checkpoint_s": _r(self.hooks.get("CheckpointHook", 0.0)),
            "other_hooks_s": _r(sum(v for k, v in self.hooks.items()
                                    if k not in ("ValidationHook", "CheckpointHook"))),
            "train_s": _r(end - start),
            "created_unix": round(self.created_unix, 3),
            "first_step_unix": None if self.first_step_unix is None else round(self.first_step_unix, 3),
        }


def describe(t: dict[str, Any]) -> str:
    """One log line: where the run's time went."""
    parts = [f"set-up {t['setup_s']:.1f} s"]
    if t["first_epoch_s"] is not None:
        first = f"first epoch {t['first_epoch_s']:.1f} s"
        if t["first_epoch_overhead_s"] is not None:
            first += f" ({t['first_epoch_overhead_s']:+.1f} s against a steady {t['steady_epoch_s']:.1f} s)"
        parts.append(first)
    if t["validation_s"]:
        rate = f", {t['val_img_s']:.0f} img/s" if t["val_img_s"] else ""
        parts.append(f"validation {t['validation_s']:.1f} s{rate}")
    parts.append(f"checkpoints {t['checkpoint_s']:.1f} s")
    return f"time: {', '.join(parts)}; {t['train_s']:.1f} s in all"


def _r(x: float | None) -> float | None:
    return None if x is None else round(float(x), 4)
