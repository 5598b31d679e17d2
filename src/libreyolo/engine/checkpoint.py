"""Checkpoints: assembled from parts, holding plain modules' state, written atomically.

A checkpoint is a dict of tensors and plain Python values so that it loads with
`torch.load(weights_only=True)` (no pickled code can run from a weights file). It never holds a
graphed, compiled or DDP-wrapped module.
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
import threading
import zipfile
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..atomic import atomic_path, write_error
from ..errors import CheckpointError, WriteError

log = logging.getLogger("libreyolo")

SCHEMA = 1
MAGIC = "libreyolo-checkpoint"


def save_checkpoint(path: str | Path, payload: dict[str, Any], *, make_dirs: bool = True) -> Path:
    """Write `payload` to `path` through a temp file + rename, so no half-written file remains.

    Written through a Python file object and synced to the disk before the rename: a full disk, a
    file-size limit or an I/O error is then the system's own error (one WriteError line naming
    the file), where torch writing to a path itself reports only "unexpected pos"; and a quota
    that a filesystem enforces only when the data reaches the disk fails here, not after the
    rename. `make_dirs=False` makes the checkpoint's folder (weights/) but never its parent: a run
    directory deleted under a running job is not made again."""
    path = _checkpoint_folder(path, make_dirs)
    with atomic_path(path, make_dirs=make_dirs, what="checkpoint") as tmp, open(tmp, "wb") as f:
        try:
            torch.save({"format": MAGIC, "schema": SCHEMA, **payload}, f)
        except RuntimeError as exc:  # torch's zip writer reports a failed write as its own error
            raise _os_error(exc) or exc from None
        f.flush()
        os.fsync(f.fileno())
    return path


def copy_checkpoint(source: str | Path, path: str | Path, *, make_dirs: bool = True) -> Path:
    """`path` as a byte copy of the checkpoint file `source`: the same state under a second name
    (best.pt in an epoch that also wrote last.pt) without serialising it again. Atomic and synced
    like `save_checkpoint` (temp file + rename; `make_dirs` likewise). A copy, not a hard link:
    a tool that rewrites one file in place (an optimizer stripped from best.pt) leaves the other
    whole."""
    path = _checkpoint_folder(path, make_dirs)
    with atomic_path(path, make_dirs=make_dirs, what="checkpoint") as tmp:
        shutil.copyfile(source, tmp)  # in the kernel (sendfile / copy_file_range) where it can
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
    return path


def _checkpoint_folder(path: str | Path, make_dirs: bool) -> Path:
    """`path`, its folder made where `make_dirs=False` allows it (weights/, never its parent)."""
    path = Path(path)
    if not make_dirs and not path.parent.is_dir():
        if path.parent.exists():
            raise WriteError(f"cannot write checkpoint {path}: {path.parent} is a file, not a folder")
        try:
            path.parent.mkdir()
        except OSError as exc:
            raise write_error(path, exc, "checkpoint") from None
    return path


def _os_error(exc: BaseException) -> OSError | None:
    """The OSError behind `exc`: torch's zip writer, closing the archive after a failed write,
    raises "unexpected pos" over the OSError the write itself raised."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, OSError):
            return exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


class BackgroundWriter:
    """Checkpoint writes on one thread, in the order asked, off the training loop: the loop pays
    for a detached copy of the state (engine/state.training_state: one buffer per dtype, so that
    torch.save writes a few records and does not wait for the GIL between hundreds of them beside
    a host-bound loop), the thread for serialising and writing it. Each write is atomic
    (save_checkpoint). `written` maps each path to the tag of its last write that succeeded.
    Thread-safe: a watchdog thread may wait while the loop submits."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[tuple[Path, Any, Future]] = []
        self._lock = threading.Lock()
        self.written: dict[Path, Any] = {}

    def submit(self, path: str | Path, payload: dict[str, Any], tag: Any = None,
               copies: tuple[str | Path, ...] = ()) -> None:
        """Write `payload` to `path`, then each of `copies` as a byte copy of that file
        (copy_checkpoint): one state under several names is serialised once. A copy is made only
        once the write of `path` succeeded, never from an older file of that name."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="libreyolo-checkpoint")
            # make_dirs=False: a run directory deleted under the run is not made again by a write.
            first = self._pool.submit(save_checkpoint, path, payload, make_dirs=False)
            self._pending.append((Path(path), tag, first))
            for copy in copies:  # one thread, in order: the write of `path` has ended when a copy starts
                self._pending.append((Path(copy), tag, self._pool.submit(_copy_after, first, path, copy)))

    def wait(self, raise_errors: bool = True) -> None:
        """Until every submitted write has finished; then the thread stops (a later submit starts
        it again). A failed write raises one WriteError line, or with `raise_errors=False`
        (a failure path, where another error is on its way) is logged."""
        failed = []
        with self._lock:  # held while waiting: a second waiter finds the writes collected
            while self._pending:
                # Taken off the list only once finished: a Ctrl-C during the wait leaves the write
                # pending, so the wait on the way out still finds it (and records where it landed).
                path, tag, future = self._pending[0]
                exc = future.exception()  # waits for it
                self._pending.pop(0)
                if exc is None:
                    self.written[path] = tag
                else:
                    failed.append(_failure_line(path, exc))
            if self._pool is not None:
                self._pool.shutdown(wait=False)  # idle: nothing left for it
                self._pool = None
        for message in failed[1:] if raise_errors else failed:
            log.warning(message)
        if failed and raise_errors:
            raise WriteError(failed[0])


def _copy_after(write: Future, source: str | Path, path: str | Path) -> Path:
    """`copy_checkpoint(source, path)` once `write` (the write of `source`) has succeeded."""
    if write.exception() is not None:  # its own failure is reported for it
        kept = "; the previous file is kept" if Path(path).is_file() else ""
        raise WriteError(f"cannot write checkpoint {path}: the write of {source} it copies failed{kept}")
    return copy_checkpoint(source, path, make_dirs=False)


def _failure_line(path: Path, exc: BaseException) -> str:
    if isinstance(exc, WriteError):  # the write's own line: the file and the system's error
        return str(exc)
    if isinstance(exc, OSError):
        return str(write_error(path, exc, "checkpoint"))
    return f"cannot write checkpoint {path}: {type(exc).__name__}: {str(exc).strip()[:200]}"


def remove_stale_temps(folder: str | Path) -> list[Path]:
    """Delete the temp files of checkpoint writes that a kill interrupted (`.last.pt.*.tmp`, the
    names atomic.atomic_path gives).

    Called when a run or a resume starts in `folder`: no write of this run is under way yet, and
    a run directory is written by one training at a time."""
    stale = sorted(Path(folder).glob(".*.pt.*.tmp"))
    for p in stale:
        p.unlink(missing_ok=True)
    return stale


# The first bytes of what torch.save writes: a zip archive (the default since torch 1.6) or a
# legacy pickle, whose PROTO opcode 0x80 is followed by its protocol, 2 to 5 (pickle's docs).
_ZIP_MAGIC = b"PK\x03\x04"
_PICKLE_MAGIC = tuple(b"\x80" + bytes([protocol]) for protocol in range(2, 6))


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load and check a LibreYOLO checkpoint; any problem is one CheckpointError line."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint '{path}' does not exist")
    _check_magic(path)
    _check_archive(path)
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, OSError, zipfile.BadZipFile, ValueError) as exc:
        raise CheckpointError(f"'{path}' is not a readable checkpoint (truncated or corrupt: {_reason(exc)})") from None
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
    for key, tp in (("family", str), ("size", str), ("names", list), ("model", dict)):
        if not isinstance(ckpt[key], tp):
            raise CheckpointError(f"'{path}' is damaged: its '{key}' is {_article(type(ckpt[key]).__name__)}, "
                                  f"not {_article(tp.__name__)}")
    return _owning(ckpt)


def _owning(value: Any) -> Any:
    """`value` with every tensor on a storage of its own. A checkpoint is written as views of one
    buffer per dtype (engine/state.py) and loads that way; pickle, though, writes a view's whole
    storage each time (its memo does not know two views share one), so a broadcast of the loaded
    state to other ranks (engine/distributed.from_rank0) would carry the buffer once per tensor."""
    return map_tensors(value, lambda t: t.clone() if t.untyped_storage().nbytes() > t.nbytes else t)


def map_tensors(value: Any, tensor: Callable[[torch.Tensor], Any],
                other: Callable[[Any], Any] = lambda v: v) -> Any:
    """`value` with its dicts, lists and tuples rebuilt, `tensor` applied to each tensor and `other`
    to every other leaf, depth first in the containers' order."""
    if isinstance(value, torch.Tensor):
        return tensor(value)
    if isinstance(value, dict):
        return {k: map_tensors(v, tensor, other) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(map_tensors(v, tensor, other) for v in value)
    return other(value)


def _check_magic(path: Path) -> None:
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as exc:
        raise CheckpointError(f"cannot read checkpoint '{path}' ({exc.strerror or type(exc).__name__})") from None
    if not head:
        raise CheckpointError(f"'{path}' is not a readable checkpoint (truncated or corrupt: the file is empty)")
    if not head.startswith((_ZIP_MAGIC, *_PICKLE_MAGIC)):
        kind = "a text file" if _is_text(path) else "not a PyTorch file"
        raise CheckpointError(f"'{path}' is not a LibreYOLO checkpoint ({kind}: PyTorch checkpoints are zip archives)")


def _check_archive(path: Path) -> None:
    """A zip checkpoint's every member against its CRC-32: bytes damaged inside a tensor (a disk
    error, a bad copy) still load, as wrong weights, unless something reads them back against
    the checksums the writer stored. One pass over the file (~0.1 s for 100 MB)."""
    try:
        with zipfile.ZipFile(path) as zf:
            bad = zf.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError, RuntimeError) as exc:
        # Cut short or not an archive; a legacy (pickle) file is not a zip at all: torch.load decides.
        if isinstance(exc, zipfile.BadZipFile):
            with open(path, "rb") as f:
                if f.read(2) in _PICKLE_MAGIC:
                    return
            reason = "cut short: the zip directory at its end is missing"
        else:
            reason = _reason(exc)
        raise CheckpointError(f"'{path}' is not a readable checkpoint (truncated or corrupt: {reason})") from None
    if bad is not None:
        raise CheckpointError(f"'{path}' is damaged: its member {bad.split('/', 1)[-1]} does not match its "
                              f"checksum (a disk error or a bad copy); use another copy of the checkpoint")


def _reason(exc: BaseException) -> str:
    """An exception's first sentence, short: torch's reader appends a paragraph of advice."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    text = text.split(". This is an internal", 1)[0]
    newer = re.search(r"PyTorch file with version (\d+), but the maximum supported version for reading is (\d+)", text)
    if newer:
        return f"written by a newer PyTorch: archive version {newer[1]}, this one reads up to {newer[2]}"
    if text.startswith("[enforce fail"):  # '[enforce fail at inline_container.cc:180] . file in ...'
        text = text.split("] . ", 1)[-1]
    return text[:160]


def _is_text(path: Path) -> bool:
    with open(path, "rb") as f:
        head = f.read(4096)
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start > len(head) - 4  # only a multi-byte character cut at the end
    return b"\x00" not in head


# What a resume reads besides the weights, and the type each must have.
RESUME_STATE: dict[str, type] = {
    "epoch": int, "config": dict, "optimizer": dict, "precision": dict, "rng": dict,
}


def check_resumable(ckpt: dict[str, Any], path: str | Path) -> None:
    """A checkpoint to resume must hold the training state, not only weights; else one line."""
    for key, tp in RESUME_STATE.items():
        value = ckpt.get(key)
        if not isinstance(value, tp) or isinstance(value, bool):
            what = "missing" if key not in ckpt else f"{_article(type(value).__name__)}, not {_article(tp.__name__)}"
            raise CheckpointError(f"'{path}' cannot be resumed: its '{key}' is {what} (weights only? "
                                  f"fine-tune from it with model={path} instead)")


def _article(word: str) -> str:
    return f"{'an' if word[0] in 'aeiou' else 'a'} {word}"


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
