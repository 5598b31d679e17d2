"""Device selection from the `device` key: cpu, cuda, cuda:N, N, a GPU list (0,1), or auto.

A GPU list means multi-GPU training, one process per GPU (engine/distributed.py): the CLI starts
those processes under torchrun itself, and each of torchrun's processes takes its own entry
(LOCAL_RANK). Under torchrun, `auto` and `cuda` also mean cuda:LOCAL_RANK and `cpu` means CPU
processes talking over gloo.
"""

from __future__ import annotations

import contextlib
import os
import re

import torch

from ..errors import ConfigError, LibreYOLOError


def device_list(spec: str) -> list[int] | None:
    """The GPU indices of a multi-GPU value (`0,1`, `cuda:0,cuda:1`), else None."""
    text = str(spec).strip().lower()
    if "," not in text:
        return None
    parts = [p.strip().removeprefix("cuda:") for p in text.split(",")]
    if not all(p.isdigit() for p in parts) or len(set(parts)) != len(parts):
        raise ConfigError(f"bad value for 'device': '{spec}' (a GPU list names distinct indices: device=0,1)")
    return [int(p) for p in parts]


def _torchrun() -> tuple[int, int, int]:
    """(LOCAL_RANK, LOCAL_WORLD_SIZE, WORLD_SIZE) of a torchrun process; (0, 1, 1) otherwise."""
    def number(name: str, default: int) -> int:
        try:
            return int(os.environ.get(name) or default)
        except ValueError:
            return default

    size = number("WORLD_SIZE", 1)
    if size <= 1:
        return 0, 1, 1
    return number("LOCAL_RANK", 0), number("LOCAL_WORLD_SIZE", size), size


def select_device(spec: str) -> torch.device:
    text = str(spec).strip().lower()
    local_rank, local_size, size = _torchrun()
    ids = device_list(text)
    if ids is not None:
        if size == 1:
            n = len(ids)
            raise ConfigError(f"device={spec} trains on {n} GPUs, one process each: `libreyolo train ... "
                              f"device={spec}` starts them itself; from Python, run your script under "
                              f"`torchrun --nproc_per_node {n} script.py`")
        if len(ids) != local_size:
            raise ConfigError(f"device={spec} names {len(ids)} GPUs but torchrun started {local_size} processes "
                              "on this machine (--nproc_per_node must match the list)")
        return _cuda(ids[local_rank], spec)
    if text in ("", "auto"):
        return torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    if text == "cpu":
        return torch.device("cpu")
    match = re.fullmatch(r"(?:cuda)?:?(\d*)", text)
    if not match:
        raise ConfigError(f"bad value for 'device': '{spec}' (allowed: auto, cpu, cuda, cuda:N, N, or a GPU list 0,1)")
    if match.group(1) and local_size > 1:
        raise ConfigError(f"device={spec} names one GPU but torchrun started {local_size} processes on this machine: "
                          "leave device out (each process takes cuda:LOCAL_RANK) or list one per process (device=0,1)")
    return _cuda(int(match.group(1) or local_rank), spec)


def _cuda(index: int, spec: str) -> torch.device:
    if not torch.cuda.is_available():
        raise ConfigError(f"device '{spec}' requested but CUDA is not available here (use device=cpu)")
    if index >= torch.cuda.device_count():
        raise ConfigError(f"device '{spec}' does not exist ({torch.cuda.device_count()} CUDA device(s) found)")
    return torch.device("cuda", index)


class OutOfMemory(LibreYOLOError):
    """A batch the device cannot hold."""

    per_rank = True  # under DDP each process says it for its own device (cli/common.py)


def is_out_of_memory(exc: BaseException) -> bool:
    """CUDA's OutOfMemoryError, or the CPU allocator's RuntimeError ("can't allocate memory")."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text)


@contextlib.contextmanager
def out_of_memory_as_error(cfg, device: torch.device):
    """Turn running out of memory into one line naming what to lower, instead of a traceback."""
    try:
        yield
    except (torch.OutOfMemoryError, RuntimeError) as exc:
        if not is_out_of_memory(exc):
            raise
        half = max(cfg.batch // 2, 1)
        lower = f"lower batch (e.g. batch={half}) or imgsz" if cfg.batch > 1 else "lower imgsz"
        raise OutOfMemory(f"out of memory on {device} at batch={cfg.batch} imgsz={cfg.imgsz}: {lower}"
                          + (", or set cuda_graph=false" if cfg.cuda_graph in (True, "full") else "")) from None


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return str(device)
