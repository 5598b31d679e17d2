"""Run directories: created after every input check passed, locked by the one training that
uses them (engine/lock.py), removed again by a run that failed before writing anything but its
arguments.

Under multi-process training, on one node or several, global rank 0 alone creates, writes and
reads the run directory; the other ranks learn its path from rank 0 and write nothing, so the
nodes need not share a filesystem (on a shared one, one process writes)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import yaml

from ..atomic import os_error_text, write_text_atomic
from ..config import TrainConfig
from ..errors import LibreYOLOError, RunDirError
from ..signals import check
from .lock import LOCK_NAME, RunLock

log = logging.getLogger("libreyolo")


def run_dir_candidates(project: str | Path, name: str) -> Iterator[Path]:
    """project/name, project/name2, name3, ...: the names a new run directory tries, in order
    (a LibreYOLOError once they run out). Shared by make_run_dir and predict's output folder."""
    root = Path(project)
    for i in range(1, 10_000):
        yield root / (name if i == 1 else f"{name}{i}")
    raise LibreYOLOError(f"too many run directories named '{name}' under '{project}'")


def make_run_dir(project: str, name: str, exist_ok: bool) -> Path:
    """project/name, or project/name2, name3, ... unless exist_ok (created atomically)."""
    root = Path(project)
    try:
        root.mkdir(parents=True, exist_ok=True)
        if exist_ok:
            path = root / name
            path.mkdir(parents=True, exist_ok=True)
            return path
        for path in run_dir_candidates(root, name):
            try:
                path.mkdir()
                return path
            except FileExistsError:
                continue
    except OSError as exc:  # a file where a folder should be, no permission: one line
        raise RunDirError(f"cannot make a run directory under {root}: {os_error_text(exc)}") from None


def write_args(run_dir: Path, cfg: TrainConfig) -> None:
    write_text_atomic(run_dir / "args.yaml", yaml.safe_dump(cfg.to_dict(), sort_keys=False), make_dirs=False)


def train_in_new_run_dir(trainer, cfg: TrainConfig, run_dir: Path | None = None):
    """Create the run directory (args.yaml first), then train. A run that fails before anything but
    args.yaml was written (out of memory at the first step, say) takes its new directory away
    with it: a failed command leaves nothing behind. `run_dir`: the directory an earlier attempt
    of this torchrun job made and saved no checkpoint in (engine/elastic.py), trained in again."""
    from .checkpoint import remove_stale_temps
    from .distributed import broadcast_object
    from .elastic import mark

    if not trainer.world.main:  # rank 0 makes the run directory; the others learn its path, write nothing
        trainer.run_dir = broadcast_object(None)
        return trainer.train()
    check()  # a signal swallowed during the start-up: nothing is made
    reused = run_dir is None and cfg.exist_ok and (Path(cfg.project) / cfg.name).exists()
    project = Path(cfg.project)
    new_folders = [p for p in (project, *project.parents) if not p.exists()]  # deepest first
    run_dir = run_dir or make_run_dir(cfg.project, cfg.name, cfg.exist_ok)
    # One training per directory (engine/lock.py): a second one given the same project/name
    # with exist_ok=true is refused here, before it writes anything.
    lock = trainer.run_lock = RunLock(run_dir).acquire()
    try:
        for stale in remove_stale_temps(run_dir / "weights"):  # a reused directory's killed writes
            log.info(f"removed {stale}, left by an interrupted checkpoint write")
        write_args(run_dir, cfg)
        mark(run_dir)  # under torchrun with restarts: the directory a restart of this job resumes
        trainer.run_dir = broadcast_object(run_dir) if trainer.world.active else run_dir
        try:
            return trainer.train()
        except (LibreYOLOError, KeyboardInterrupt):
            if not reused and discard_if_empty(run_dir):
                for folder in new_folders:  # project folders this run made, while nothing else is in them
                    try:
                        folder.rmdir()
                    except OSError:
                        break
            raise
    finally:
        lock.release()


def resume_in_run_dir(trainer, checkpoint: Path):
    """Resume in the checkpoint's run directory (trainer.run_dir) under its lock: a resume of a
    run that is still training is refused, as a second run is. The temp files of checkpoint
    writes a kill interrupted are removed once the lock is held (no write of another run is
    under way then)."""
    from .checkpoint import remove_stale_temps
    from .elastic import mark

    if not trainer.world.main:
        return trainer.train()
    with RunLock(trainer.run_dir) as lock:
        trainer.run_lock = lock
        for stale in remove_stale_temps(Path(checkpoint).resolve().parent):
            log.info(f"removed {stale}, left by an interrupted checkpoint write")
        mark(trainer.run_dir)
        return trainer.train()


def discard_if_empty(run_dir: Path) -> bool:
    """Remove `run_dir` if it holds nothing but args.yaml (and an empty weights/, the run's lock
    file and its torchrun job marker); True if so. A directory deleted under the run is not there
    to remove."""
    from .elastic import MARKER

    weights = run_dir / "weights"
    if not run_dir.is_dir() or {p.name for p in run_dir.iterdir()} - {"args.yaml", "weights", LOCK_NAME, MARKER}:
        return False
    if weights.is_dir() and any(weights.iterdir()):
        return False
    (run_dir / "args.yaml").unlink(missing_ok=True)
    (run_dir / MARKER).unlink(missing_ok=True)
    (run_dir / LOCK_NAME).unlink(missing_ok=True)  # the lock itself is released by the caller
    if weights.is_dir():
        weights.rmdir()
    run_dir.rmdir()
    return True
