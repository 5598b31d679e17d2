"""Atomic file writes: write a temp file beside the target, then rename it over the target.

A reader (or a kill -9 mid-write) then sees the old file or the new one, never half of one:
`os.replace` within one folder is atomic on POSIX filesystems. The temp file is named
`.<name>.<pid>-<token><suffix>` (default suffix `.tmp`) in the target's folder, so a write that a
kill interrupted is recognisable afterwards (engine/checkpoint.remove_stale_temps globs
`.*.pt.*.tmp`). No torch here: the profiler's readers and the CLI import this.

A write that fails (a full disk, a file-size limit or quota, an I/O error) is one WriteError
line naming the file and the error; the previous file of that name is kept whole, and the temp
file is removed.
"""

from __future__ import annotations

import errno
import json
import math
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .errors import WriteError


@contextmanager
def atomic_path(path: str | Path, suffix: str = ".tmp", *, make_dirs: bool = True, what: str = "") -> Iterator[Path]:
    """Yield a temp path to write; on success it replaces `path`, on any error it is removed.

    The parent folder is created if missing (`make_dirs=False`: never, so a run directory that
    was deleted under a running job is not made again by its next write). The temp file is
    created by the writer (plain open, so it gets the usual umask permissions). An OSError while
    writing or renaming becomes one WriteError line (`what` names the kind of file in it:
    "checkpoint"); a folder that cannot be made is left the caller's OSError (predict's Saver says
    it in its own words), and `check_writable` refuses such outputs before the work."""
    path = Path(path)
    if make_dirs:
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path, suffix)
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as exc:
        raise write_error(path, exc, what) from None
    finally:
        tmp.unlink(missing_ok=True)


def check_writable(path: str | Path, what: str, *, folder: bool = False) -> Path:
    """Refuse, before any work is done, an output that no write could make: one WriteError line.

    A file (`folder=False`) needs a name and must not be an existing folder; a folder must not be
    an existing file. Either way the nearest part of the path that exists must be a folder this
    process may write in (the folders below it are made by the write). `what` names the output in
    the line ("--save-json file", "project folder")."""
    path = Path(path).expanduser()
    if not folder and (path.name in ("", ".", "..") or path.is_dir()):
        raise WriteError(f"cannot write the {what} {path}: it is a folder; name a file")
    if folder and path.exists() and not path.is_dir():
        raise WriteError(f"cannot use the {what} {path}: it is a file, not a folder")
    start = path if folder else path.parent
    nearest = next(p for p in (start, *start.parents) if p.exists())  # '.' or '/' at the latest
    if not nearest.is_dir():
        raise WriteError(f"cannot write the {what} {path}: {nearest} is a file, not a folder")
    if not os.access(nearest, os.W_OK | os.X_OK):
        raise WriteError(f"cannot write the {what} {path}: no permission to write in {nearest}")
    return path


def temp_path(path: Path, suffix: str = ".tmp") -> Path:
    """The temp file a write of `path` goes to first: hidden, beside it, unique to the write."""
    return path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}{suffix}")


def write_error(path: str | Path, exc: OSError, what: str = "") -> WriteError:
    """The one line for a failed write of `path`: the file, the error, and whether the previous
    file of that name is still there (an atomic write never touched it)."""
    path = Path(path)
    kept = "; the previous file is kept" if path.is_file() else ""
    return WriteError(f"cannot write {what + ' ' if what else ''}{path}: {os_error_text(exc)}{kept}")


# What each of the usual write failures means for the user, after the system's own words.
_HINTS = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "a disk quota is used up",
          errno.EFBIG: "a file-size limit (ulimit -f) or quota", errno.EIO: "the device reported an I/O error",
          errno.EROFS: "the filesystem is read-only"}


def os_error_text(exc: OSError) -> str:
    """'No space left on device (ENOSPC: the disk is full)': the system's words, the errno's name."""
    code = exc.errno if isinstance(exc.errno, int) else None
    words = exc.strerror or str(exc) or type(exc).__name__
    if code is None:
        return words
    name = errno.errorcode.get(code, f"errno {code}")
    hint = _HINTS.get(code)
    return f"{words} ({name}{': ' + hint if hint else ''})"


def write_text_atomic(path: str | Path, text: str, *, make_dirs: bool = True) -> Path:
    with atomic_path(path, make_dirs=make_dirs) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def write_json_atomic(path: str | Path, obj: Any, indent: int | None = 1, clean: bool = True, *,
                      make_dirs: bool = True) -> Path:
    """`clean`: replace NaN/inf by null first (skip it for large objects known to be finite).

    Strict JSON either way (`allow_nan=False`): an unclean NaN raises rather than writing `NaN`."""
    return write_text_atomic(path, json.dumps(finite_json(obj) if clean else obj, indent=indent,
                                              allow_nan=False) + "\n", make_dirs=make_dirs)


def finite_json(obj: Any) -> Any:
    """NaN/inf become null: JSON has no spelling for them and strict readers reject the extension."""
    if isinstance(obj, float):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(v) for v in obj]
    return obj
