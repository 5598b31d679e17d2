"""Mixed precision: one object, resolved once from config + device, that wraps the step.

It owns the autocast context for the forward pass, the GradScaler (live dynamic loss scaling only
for float16 on CUDA), unscale-before-clip, and its own state_dict for checkpoints. There is no
second step function for AMP: the step calls `autocast()`, `backward()`, `step()`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from ..errors import CheckpointError, ConfigError

_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Resolution:
    """The outcome of the precision rules for one (amp, amp_dtype, device) request."""

    dtype: torch.dtype | None  # autocast dtype; None = plain float32
    scaler: bool               # live GradScaler
    message: str | None        # one log line when the request was changed


def resolve(amp: bool, amp_dtype: str, device_type: str, bf16_native: bool) -> Resolution:
    """The precision rules (docs/hyperparameters.md, "Precision"), as a pure function."""
    if amp_dtype not in _DTYPES:
        raise ConfigError(f"bad value for 'amp_dtype': {amp_dtype!r} (allowed: float16|bfloat16)")
    if not amp:
        return Resolution(None, False, None)
    if device_type != "cuda":
        return Resolution(None, False, f"amp=True needs a CUDA device; training in float32 on {device_type}")
    if amp_dtype == "bfloat16" and not bf16_native:
        # Emulated bf16 (T4/V100) runs slower than float32: fall back to float16 + live scaler.
        return Resolution(torch.float16, True,
                          "amp_dtype=bfloat16 is not native on this GPU; using float16 with loss scaling")
    dtype = _DTYPES[amp_dtype]
    return Resolution(dtype, dtype is torch.float16, None)


def bf16_native(device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    # The default is_bf16_supported() is True on pre-Ampere GPUs through emulation (torch.cuda.is_bf16_supported's including_emulation).
    major, _ = torch.cuda.get_device_capability(device)
    return major >= 8


class Precision:
    """Autocast + GradScaler for one run. Create with `Precision.create(cfg.amp, cfg.amp_dtype, device)`."""

    def __init__(self, device: torch.device, resolution: Resolution):
        self.device = device
        self.dtype = resolution.dtype
        self.message = resolution.message
        self.scaler = torch.amp.GradScaler(device.type, enabled=resolution.scaler)
        # Steps the scaler skipped (overflow), counted on the device so counting never syncs; and
        # the current and the longest run of skips in a row (engine/diverge.SkipWatch reads it).
        self._skipped = torch.zeros((), dtype=torch.int64, device=device) if resolution.scaler else None
        self._streak = torch.zeros((), dtype=torch.int64, device=device) if resolution.scaler else None
        self.skip_streak = torch.zeros((), dtype=torch.int64, device=device) if resolution.scaler else None

    @classmethod
    def create(cls, amp: bool, amp_dtype: str, device: torch.device) -> Precision:
        return cls(device, resolve(amp, amp_dtype, device.type, bf16_native(device)))

    @property
    def scaler_enabled(self) -> bool:
        return self.scaler.is_enabled()

    def describe(self) -> str:
        """One line for the run log: 'bfloat16 autocast, scaler off' or 'float32'."""
        if self.dtype is None:
            return "float32"
        name = "float16" if self.dtype is torch.float16 else "bfloat16"
        return f"{name} autocast, scaler {'on' if self.scaler_enabled else 'off'}"

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.dtype is None:
            return contextlib.nullcontext()
        # cache_enabled=False: autocast's weight-cast cache is incompatible with graph capture.
        return torch.autocast(self.device.type, dtype=self.dtype, cache_enabled=False)

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def step(self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor], clip_grad: float) -> None:
        """Unscale (so clipping sees true gradients), clip, step, update the scale, zero grads."""
        if clip_grad > 0:
            self.scaler.unscale_(optimizer)
            # error_if_nonfinite=False: the True form syncs to check (torch.nn.utils.clip_grad_norm_).
            torch.nn.utils.clip_grad_norm_(params, clip_grad, error_if_nonfinite=False, foreach=True)
        if self._skipped is not None:
            before = self.scaler._scale.clone()  # device tensor; get_scale() would sync
            self.scaler.step(optimizer)
            self.scaler.update()
            # The scale only shrinks when the step was skipped for an overflow.
            skipped = (self.scaler._scale < before).to(torch.int64).reshape(())
            self._skipped += skipped
            self._streak.mul_(skipped).add_(skipped)  # +1 on a skip, back to 0 on a step
            torch.maximum(self.skip_streak, self._streak, out=self.skip_streak)
        else:
            self.scaler.step(optimizer)
            self.scaler.update()
        # In place, never None: a CUDA graph's backward accumulates into these very tensors
        # (engine/graphs.py), and eager training gets the same values (0 + g is exactly g).
        optimizer.zero_grad(set_to_none=False)

    def reset_step_stage(self) -> None:
        """Forget a step that did not finish (a CUDA graph capture cut short between unscale and
        update): the scaler's per-optimizer record is what `update()` clears at a step's end."""
        if self.scaler.is_enabled():
            self.scaler._per_optimizer_states.clear()

    def skipped_steps(self) -> int:
        """Steps skipped by the scaler so far (syncs: call at epoch end only)."""
        return 0 if self._skipped is None else int(self._skipped)

    def state_dict(self) -> dict:
        # The enabled flag is stored because loading a disabled scaler's {} into an enabled one
        # raises (torch.amp.GradScaler.load_state_dict).
        return {"dtype": None if self.dtype is None else str(self.dtype).removeprefix("torch."),
                "scaler_enabled": self.scaler_enabled,
                "scaler": self.scaler.state_dict(),
                "skipped": self.skipped_steps()}

    def load_state_dict(self, state: dict) -> None:
        try:
            was_enabled = bool(state["scaler_enabled"])
            scaler_state = state["scaler"]
        except (KeyError, TypeError):
            raise CheckpointError("checkpoint has no usable precision state") from None
        if was_enabled and self.scaler_enabled:
            self.scaler.load_state_dict(scaler_state)
        # Otherwise the precision changed between runs (e.g. float16 -> bfloat16): the scaler
        # starts fresh, which is what the new precision needs.
        if self._skipped is not None and was_enabled:
            self._skipped.fill_(int(state.get("skipped", 0)))
