"""Elastic restarts: a run that torchrun starts again (`--max-restarts N`) goes on where it stopped.

When a process of the run dies (kill -9, a node lost, the kernel's out-of-memory killer),
torchrun's agents end the other processes and, while restarts are left, start the whole group
again with the same command line. That command then finds the run its first attempt made and
resumes it, with no `resume=` typed:

- **Which start is a restart.** TORCHELASTIC_RESTART_COUNT above 0 in any process: only the
  agent whose processes failed counts a restart (an agent that restarts its processes because
  another node's failed may not), so rank 0 gathers every process's count. A restart that no
  agent counts (a node joining an elastic `--nnodes 1:4` job) is recognised by the run directory
  alone, when torchrun's run id is a real one (`--rdzv-id`; SLURM: `$SLURM_JOB_ID`; `--standalone`
  draws one); torchrun's default id `none` names no job.
- **Which run directory.** Rank 0 writes `.torchelastic` (the run id) into the run directory it
  trains in whenever restarts are possible (TORCHELASTIC_MAX_RESTARTS above 0). A restart takes
  the newest directory among project/name, name2, ... that holds this run id.
- **From where.** That directory's weights/last.pt, which is always the run's latest state: an
  epoch's end or, with `checkpoint_steps=N`, its last N-th optimizer step. The resume is
  `resume=` of it (engine/state.py): the same run directory, epoch, batch, schedule, EMA, loss
  scaler and every rank's RNG; results.csv keeps the rows of the epochs the checkpoint holds, so
  an epoch interrupted after its row was written does not appear twice. A directory without
  last.pt (no checkpoint before the failure) is trained in again from the start; one whose
  last.pt finished every epoch (a process died on its way out) is the result as it is.
- **torch's shared store.** Since torch 2.5 torchrun's agent hosts the store the processes meet
  in (TORCHELASTIC_USE_AGENT_STORE) and keeps it across restarts; a restarted process can then
  read the previous attempt's addresses and fail to join (pytorch/pytorch#135712, #167288; under
  torch 2.14 on CPU, the restarted processes of `libreyolo train` failed to join in each of our
  tries, while a script that joins within a second of starting did not). Starting torchrun with
  TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 gives every attempt a store of its own; rank 0 says so
  in one line when restarts are asked for without it.
- **Who reads it.** Rank 0 alone, as it alone writes the run directory; the decision and the
  checkpoint reach the other ranks over the process group, so nodes need no shared filesystem.
  (c10d orders the nodes of a rendezvous by host name, so rank 0 comes back on the node that
  holds the run directory while the same nodes take part.)
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..atomic import write_text_atomic
from . import distributed

log = logging.getLogger("libreyolo")

MARKER = ".torchelastic"


def _env_int(name: str) -> int:
    try:
        return int(os.environ.get(name) or 0)
    except ValueError:
        return 0


def restarts_possible() -> bool:
    """Under torchrun with `--max-restarts` above 0."""
    return _env_int("TORCHELASTIC_MAX_RESTARTS") > 0


def _run_id() -> str | None:
    """torchrun's run id when it names this job (its default `none` names none)."""
    rid = os.environ.get("TORCHELASTIC_RUN_ID", "")
    return None if rid in ("", "none") else rid


def mark(run_dir: Path) -> None:
    """Rank 0, in the run directory it trains in: the job that a restart should find it for."""
    if restarts_possible():
        rid = os.environ.get("TORCHELASTIC_RUN_ID", "none")
        write_text_atomic(Path(run_dir) / MARKER, json.dumps({"run_id": rid, "since": time.time()}), make_dirs=False)


def shared_store_notice() -> None:
    """Rank 0's line when restarts are asked for over torch's shared store (see the module doc)."""
    if restarts_possible() and distributed.world().active and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        log.info("torchrun --max-restarts: a restart may fail to re-form the process group over torch's shared "
                 "rendezvous store (pytorch/pytorch#135712); start torchrun with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1")


@dataclass(frozen=True)
class Attempt:
    """An earlier attempt of this job: its run directory, its latest checkpoint (None: none yet),
    whether that checkpoint finished every epoch, and its metrics."""

    run_dir: Path
    checkpoint: Path | None
    finished: bool = False
    metrics: dict[str, Any] | None = None

    def result(self, task: str):
        """A finished attempt's TrainResult: nothing is left to train."""
        from .trainer import TrainResult

        weights = self.run_dir / "weights"
        best = weights / "best.pt"
        return TrainResult(metrics=dict(self.metrics or {}), run_dir=self.run_dir,
                           best=best if best.exists() else weights / "last.pt", last=weights / "last.pt",
                           epochs_run=0, task=task)


def previous_attempt(project: str, name: str) -> Attempt | None:
    """This job's earlier attempt when this start is torchrun's restart of it, else None. Under
    multi-process training a collective: every rank calls it, rank 0 decides."""
    if not restarts_possible():
        return None
    w = distributed.world()
    count = _env_int("TORCHELASTIC_RESTART_COUNT")
    counts = distributed.gather_object(count) if w.active else [count]
    found = _find(Path(project), name, restarted=max(counts) > 0) if w.main else None
    found = distributed.broadcast_object(found) if w.active else found
    if found is not None:
        n = max(counts) if w.main else count
        if found.finished:
            log.info(f"torchrun restarted the run (restart {n}) after it had finished: {found.run_dir} is complete")
        elif found.checkpoint is not None:
            log.info(f"torchrun restarted the run (restart {n}): resuming {found.run_dir} from its latest checkpoint")
        else:
            log.info(f"torchrun restarted the run (restart {n}) before its first checkpoint: training "
                     f"{found.run_dir} again from the start")
    return found


def _find(project: Path, name: str, restarted: bool) -> Attempt | None:
    rid = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    if not restarted and _run_id() is None:
        return None  # a first start, or no id to tell this job's directory from another's
    pattern = re.compile(re.escape(name) + r"\d*")
    mine = []
    for folder in project.glob("*") if project.is_dir() else ():
        if pattern.fullmatch(folder.name) and (since := _marked_since(folder, rid)) is not None:
            mine.append((since, folder))
    if not mine:
        return None
    run_dir = max(mine)[1]
    last = run_dir / "weights" / "last.pt"
    if not last.is_file():
        return Attempt(run_dir, None)
    return Attempt(run_dir, last, *_finished(last))


def _finished(last: Path) -> tuple[bool, dict[str, Any]]:
    """Whether `last` finished every epoch of its run, and its metrics. A checkpoint that cannot
    be read here counts as unfinished: the resume reads it again and says in one line what is wrong."""
    import torch

    from .state import mid_epoch

    try:
        ckpt = torch.load(last, map_location="cpu", weights_only=True, mmap=True)
        done = int(ckpt["epoch"]) + 1 >= int(ckpt["config"]["epochs"]) and mid_epoch(ckpt) is None
        return done, dict(ckpt.get("metrics") or {})
    except Exception:
        return False, {}


def _marked_since(folder: Path, rid: str) -> float | None:
    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict) or marker.get("run_id") != rid:
        return None
    since = marker.get("since")
    return float(since) if isinstance(since, (int, float)) else 0.0
