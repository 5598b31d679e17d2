"""Atomic file writes: write a temp file beside the target, then rename it over the target.

A reader (or a kill -9 mid-write) then sees the old file or the new one, never half of one:
`os.replace` within one folder is atomic on POSIX filesystems. The temp file is named
`.<name>.<pid>-<token><suffix>` (default suffix `.tmp`) in the target's folder, so a write that a
kill interrupted is recognisable afterwards (engine/checkpoint.remove_stale_temps globs
`.*.pt.*.tmp`). No torch here: the profiler's readers and the CLI import this.
"""

from __future__ import annotations

import json
import math
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def atomic_path(path: str | Path, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield a temp path to write; on success it replaces `path`, on any error it is removed.

    The parent folder is created if missing. The temp file is created by the writer (plain
    open, so it gets the usual umask permissions)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}{suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomic(path: str | Path, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def write_json_atomic(path: str | Path, obj: Any, indent: int | None = 1, clean: bool = True) -> Path:
    """`clean`: replace NaN/inf by null first (skip it for large objects known to be finite).

    Strict JSON either way (`allow_nan=False`): an unclean NaN raises rather than writing `NaN`."""
    return write_text_atomic(path, json.dumps(finite_json(obj) if clean else obj, indent=indent,
                                              allow_nan=False) + "\n")


def finite_json(obj: Any) -> Any:
    """NaN/inf become null: JSON has no spelling for them and strict readers reject the extension."""
    if isinstance(obj, float):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(v) for v in obj]
    return obj
