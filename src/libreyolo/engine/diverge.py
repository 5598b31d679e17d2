"""Divergence: weights that went non-finite, a loss scaler that skips every step, and the last
checkpoint whose weights are finite.

A loss that goes NaN/inf without a loss scaler stops the run at the next loss read-back
(engine/meter.py, naming the epoch and step). The weights can go first: an update whose loss was
still finite (the last step of an epoch, say) leaves inf/NaN weights, and the next loss is NaN
only in the next epoch. So every checkpoint is checked before it is written (`check_weights`):
non-finite weights end the run instead of replacing a good last.pt, and the line names the
epoch. A failed run names its last good state only after reading that checkpoint back and
finding its weights finite (`last_good_state`); when last.pt is not, the newest finite one of
best.pt and epochN.pt is named, or none.

With a float16 loss scaler, a non-finite step is skipped (the scaler lowers its scale) and
counted (results.csv's skipped_steps). A few in a row are normal early in a run; a long run of
them means the loss itself is non-finite at every step: after MAX_SKIPS_IN_A_ROW the run stops
and says so (`SkipWatch`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .checkpoint import map_tensors
from .meter import NonFiniteLossError

# A fresh GradScaler (scale 2^16) meets its first overflows with a handful of skips in a row; 50
# in a row lower the scale by 2^50, past any gradient float16 can hold: the loss is broken.
MAX_SKIPS_IN_A_ROW = 50


def nonfinite(state: dict[str, Any] | None) -> list[str]:
    """The names of the floating-point tensors of a state dict that hold a NaN or an inf."""
    if not state:
        return []
    return [k for k, v in state.items()
            if isinstance(v, torch.Tensor) and v.is_floating_point() and not bool(torch.isfinite(v).all())]


def check_weights(state: dict[str, Any], where: str, last_good: Callable[[], str]) -> None:
    """A checkpoint's content before it is written: its model and EMA weights must be finite,
    else the run stops in one NonFiniteLossError line (and last.pt stays the previous one). One
    check per buffer first (`finite_storages`); only a buffer that is not finite is searched tensor
    by tensor, for the names."""
    if finite_storages(state.get("model"), state.get("ema")):
        return
    bad = nonfinite(state.get("model")) + nonfinite(state.get("ema"))
    if bad:
        raise NonFiniteLossError(f"the weights became non-finite by {where} ({len(set(bad))} tensors, e.g. "
                                 f"'{bad[0]}') while every loss read back was finite: not saved; {last_good()}")


def finite_storages(*states: Any) -> bool:
    """True when every floating-point tensor in `states` is finite, from one check per storage.

    A detached training state holds each part's tensors as views of one buffer per dtype
    (engine/state.py): YOLOv9-t's weights and EMA, 2,234 tensors, are then two checks instead of
    2,234 small ones. A storage is checked whole, so a NaN or an inf anywhere in it, even in bytes
    no tensor covers, gives False: `check_weights` then checks tensor by tensor (`nonfinite`),
    and only that check decides."""
    whole: dict[tuple[int, torch.device, torch.dtype], torch.Tensor] = {}

    def note(t: torch.Tensor) -> None:
        if not t.is_floating_point():
            return
        storage = t.untyped_storage()
        key = (storage.data_ptr(), t.device, t.dtype)
        if key not in whole:
            whole[key] = t.new_empty(0).set_(storage, 0, (storage.nbytes() // t.element_size(),))

    for state in states:
        map_tensors(state, note)
    return all(bool(torch.isfinite(t).all()) for t in whole.values())


def finite_position(path: Path) -> tuple[int, int | None] | None:
    """(0-based epoch, batches of it done or None at its end) of checkpoint `path` when its
    weights (model, EMA) are all finite; None when they are not, or the file cannot be read as a
    checkpoint."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:
        return None
    if not isinstance(ckpt, dict) or nonfinite(ckpt.get("model")) or nonfinite(ckpt.get("ema")):
        return None
    epoch, step = ckpt.get("epoch"), ckpt.get("step")
    if not isinstance(epoch, int):
        return None
    return epoch, step if isinstance(step, int) and step > 0 else None


def _where(position: tuple[int, int | None]) -> str:
    epoch, step = position
    return f"end of epoch {epoch + 1}" if step is None else f"epoch {epoch + 1}, after its step {step}"


def last_good_state(run_dir: Path | None, written: dict[Path, Any], resumed: bool = False) -> str:
    """What a failed run can resume from, in words, checked: the run's last.pt when its weights
    are finite, else the newest finite epochN.pt or best.pt, else none. `written` maps the paths
    this process wrote to their epoch (BackgroundWriter.written); a checkpoint it did not write
    counts only for a resumed run (a fresh run in a reused directory finds another run's files)."""
    none = "no checkpoint was saved yet (the first epoch did not end)"
    if run_dir is None:
        return none
    weights = Path(run_dir) / "weights"
    last = weights / "last.pt"
    if not last.exists() or not (resumed or last in written):
        return none
    position = finite_position(last)
    if position is not None:
        return f"the last good state is {last} ({_where(position)})"
    others = sorted(weights.glob("epoch*.pt"), key=_number, reverse=True) + [weights / "best.pt"]
    found = [(e, p) for p in others if p.is_file() and (resumed or p in written)
             and (e := finite_position(p)) is not None]
    if found:
        position, path = max(found, key=lambda t: t[0][0])  # epoch-end checkpoints: by epoch
        return f"{last} holds non-finite weights; the last good state is {path} ({_where(position)})"
    return f"{last} holds non-finite weights and no other checkpoint of the run has finite ones"


def _number(path: Path) -> int:
    m = re.search(r"(\d+)", path.stem)
    return int(m[1]) if m else -1


class SkipWatch:
    """Reads the loss scaler's longest run of skipped steps at each loss read-back and stops the
    run at MAX_SKIPS_IN_A_ROW. On CUDA the count is copied behind the step's kernels and read at
    the next read-back (as the loss meter defers its own), so it adds no wait for the device."""

    def __init__(self, precision, limit: int = MAX_SKIPS_IN_A_ROW):
        self.precision, self.limit = precision, limit
        self.enabled = precision.scaler_enabled and getattr(precision, "skip_streak", None) is not None
        cuda = precision.device.type == "cuda"
        self._host = torch.zeros((), dtype=torch.int64, pin_memory=cuda) if self.enabled else None
        self._pending: tuple[str, Any] | None = None

    def read(self, where: str, last_good: Callable[[], str], final: bool = False) -> None:
        if not self.enabled:
            return
        previous, self._pending = self._pending, None
        if previous is not None:
            self._settle(*previous, last_good)
        self._host.copy_(self.precision.skip_streak, non_blocking=True)
        event = None
        if self.precision.device.type == "cuda" and not final:
            event = torch.cuda.Event()
            event.record()
            self._pending = (where, event)
        else:
            self._settle(where, event, last_good)

    def _settle(self, where: str, event, last_good: Callable[[], str]) -> None:
        if event is not None:
            event.synchronize()
        longest = int(self._host)
        if longest >= self.limit:
            raise NonFiniteLossError(f"the float16 loss scaler skipped {longest} steps in a row (by {where}): the "
                                     f"loss or its gradients are non-finite at every step, not a passing overflow; "
                                     f"{last_good()}")
