"""Run directories: created after every input check passed, removed again by a run that failed
before writing anything but its arguments."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import yaml

from ..config import TrainConfig
from ..errors import LibreYOLOError

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


def write_args(run_dir: Path, cfg: TrainConfig) -> None:
    (run_dir / "args.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))


def train_in_new_run_dir(trainer, cfg: TrainConfig):
    """Create the run directory (args.yaml first), then train. A run that fails before anything but
    args.yaml was written (out of memory at the first step, say) takes its new directory away
    with it: a failed command leaves nothing behind."""
    from .checkpoint import remove_stale_temps
    from .distributed import broadcast_object

    if not trainer.world.main:  # rank 0 makes the run directory; the others learn its path, write nothing
        trainer.run_dir = broadcast_object(None)
        return trainer.train()
    reused = cfg.exist_ok and (Path(cfg.project) / cfg.name).exists()
    project = Path(cfg.project)
    new_folders = [p for p in (project, *project.parents) if not p.exists()]  # deepest first
    run_dir = make_run_dir(cfg.project, cfg.name, cfg.exist_ok)
    for stale in remove_stale_temps(run_dir / "weights"):  # a reused directory's killed writes
        log.info(f"removed {stale}, left by an interrupted checkpoint write")
    write_args(run_dir, cfg)
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


def discard_if_empty(run_dir: Path) -> bool:
    """Remove `run_dir` if it holds nothing but args.yaml (and an empty weights/); True if so."""
    weights = run_dir / "weights"
    if {p.name for p in run_dir.iterdir()} - {"args.yaml", "weights"}:
        return False
    if weights.is_dir() and any(weights.iterdir()):
        return False
    (run_dir / "args.yaml").unlink(missing_ok=True)
    if weights.is_dir():
        weights.rmdir()
    run_dir.rmdir()
    return True
