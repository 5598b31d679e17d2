"""Device selection from the `device` key: cpu, cuda, cuda:N, N, or auto."""

from __future__ import annotations

import re

import torch

from ..errors import ConfigError


def select_device(spec: str) -> torch.device:
    text = str(spec).strip().lower()
    if text in ("", "auto"):
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    if text == "cpu":
        return torch.device("cpu")
    if "," in text:
        raise ConfigError(f"bad value for 'device': '{spec}' (multi-GPU training is not available in this "
                          "version; pick one device)")
    match = re.fullmatch(r"(?:cuda)?:?(\d*)", text)
    if not match:
        raise ConfigError(f"bad value for 'device': '{spec}' (allowed: auto, cpu, cuda, cuda:N, N)")
    if not torch.cuda.is_available():
        raise ConfigError(f"device '{spec}' requested but CUDA is not available here (use device=cpu)")
    index = int(match.group(1) or 0)
    if index >= torch.cuda.device_count():
        raise ConfigError(f"device '{spec}' does not exist ({torch.cuda.device_count()} CUDA device(s) found)")
    return torch.device("cuda", index)
