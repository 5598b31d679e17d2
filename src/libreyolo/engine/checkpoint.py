"""Checkpoints: assembled from parts, holding plain modules' state, written atomically.

A checkpoint is a dict of tensors and plain Python values so that it loads with
`torch.load(weights_only=True)` (no pickled code can run from a weights file). It never holds a
graphed, compiled or DDP-wrapped module (STYLE.md #11).
"""

from __future__ import annotations

import os
import random
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import CheckpointError

SCHEMA = 1
MAGIC = "libreyolo-checkpoint"


def save_checkpoint(path: str | Path, payload: dict[str, Any]) -> Path:
    """Write `payload` to `path` through a temp file + rename, so no half-written file remains."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        torch.save({"format": MAGIC, "schema": SCHEMA, **payload}, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load and check a LibreYOLO checkpoint; any problem is one CheckpointError line."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint '{path}' does not exist")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, OSError, zipfile.BadZipFile, ValueError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"'{path}' is not a readable checkpoint (truncated or corrupt: {reason[:120]})") from None
    except Exception as exc:  # weights_only refusals are pickle.UnpicklingError and friends
        raise CheckpointError(f"'{path}' is not a LibreYOLO checkpoint ({type(exc).__name__})") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != MAGIC:
        raise CheckpointError(f"'{path}' is not a LibreYOLO checkpoint (foreign file)")
    if not isinstance(ckpt.get("schema"), int) or ckpt["schema"] > SCHEMA:
        raise CheckpointError(f"'{path}' has checkpoint schema {ckpt.get('schema')}, newer than this "
                              f"LibreYOLO understands ({SCHEMA}); upgrade libreyolo")
    for key in ("family", "size", "names", "model"):
        if key not in ckpt:
            raise CheckpointError(f"'{path}' is missing '{key}'; not a complete LibreYOLO checkpoint")
    return ckpt


def rng_state() -> dict[str, Any]:
    """Every RNG the run draws from, in weights_only-loadable form."""
    np_state = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": (np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_as_tuple(state["python"]))
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_tuple(value: Any) -> Any:
    # weights_only round-trips tuples as tuples, but be tolerant of lists from older writers.
    if isinstance(value, list):
        return tuple(_as_tuple(v) for v in value)
    return value
