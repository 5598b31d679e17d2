"""A run's training state in a checkpoint, and a resume from it.

What a checkpoint holds beyond the weights: the optimizer (flat groups), the precision state
(loss scaler), the EMA and its update count, the epoch, the last validation's metrics, the
resolved config, every RNG (every rank's under multi-process training) and each hook's
`state_dict` (the validation hook's best epoch, ...).

A checkpoint written mid-epoch (`checkpoint_steps`) also holds `step`, the batches of its epoch
done, and the epoch's loss sums so far; a resume from it goes on at the next batch of that
epoch. It is always written right after an optimizer step, so no gradient is half accumulated;
the data order, augmentation and schedule are functions of (seed, epoch, batch), so nothing else
of the position needs keeping. An end-of-epoch checkpoint has `step` None.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..errors import CheckpointError
from . import checkpoint as ckpt_io
from .resume_data import image_counts
from .run import Run

log = logging.getLogger("libreyolo")


def training_state(trainer: Run, detached: bool = False) -> dict[str, Any]:
    """The checkpoint's content. With `detached`, nothing in it is shared with the live trainer
    (the optimizer's state tensors and the hooks' states are copied too; the weights always are),
    so another thread can write it while training goes on."""
    ema = trainer.ema
    optimizer = trainer.optimizer.state_dict()  # its tensors are the live ones
    hooks = {type(h).__name__: h.state_dict() for h in trainer.hooks}
    if detached:
        optimizer, hooks = _copied(optimizer), copy.deepcopy(hooks)
    return {
        "family": trainer.family.name, "size": trainer.size, "task": trainer.task.name,
        "names": list(trainer.data_cfg.names),
        "model": cpu_state(trainer.model), "ema": cpu_state(ema.ema) if ema else None,
        "ema_updates": ema.updates if ema else 0,
        "optimizer": optimizer, "precision": trainer.precision.state_dict(),
        "epoch": trainer.epoch, "step": trainer.checkpoint_step, "updates": trainer.updates,
        "losses": trainer.meter.state_dict() if trainer.checkpoint_step else None,
        "metrics": dict(trainer.metrics), "config": trainer.cfg.to_dict(),
        # What a resume on a moved dataset (data= beside resume=) is checked against.
        "data_images": image_counts(trainer),
        "rng": ckpt_io.rng_state(),
        "hooks": hooks,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        # A multi-process run's every RNG, rank by rank: a resume on as many processes restores
        # each; on another count rank 0 takes `rng` and the others start from seed + rank.
        **({"rng_ranks": trainer.rank_rng} if trainer.rank_rng is not None else {}),
    }


def restore_training_state(trainer: Run, ckpt: dict) -> None:
    """Load `ckpt` into a freshly built trainer; a damaged state is one CheckpointError line."""
    try:
        _restore(trainer, ckpt)
    except (KeyError, TypeError, ValueError, IndexError, RuntimeError, AttributeError) as exc:
        if isinstance(exc, CheckpointError):
            raise
        # The weights were checked by the caller; this is the rest of a damaged state.
        raise CheckpointError(f"cannot resume: the checkpoint's training state is damaged "
                              f"({type(exc).__name__}: {str(exc).strip()[:120]})") from None


def _restore(trainer: Run, ckpt: dict) -> None:
    trainer.model.load_state_dict(ckpt["model"])
    if trainer.ema is not None and ckpt.get("ema") is not None:
        trainer.ema.ema.load_state_dict(ckpt["ema"])
        trainer.ema.updates = int(ckpt.get("ema_updates", 0))
    try:
        trainer.optimizer.load_state_dict(ckpt["optimizer"])
    except ValueError as exc:  # torch's one-line group/size mismatch
        raise CheckpointError(
            f"cannot resume: the checkpoint's optimizer state does not fit this optimizer ({exc}); "
            "a checkpoint from before the flat optimizer (one tensor per parameter group) cannot be "
            "resumed: fine-tune from its weights instead (model=<checkpoint>)") from None
    trainer.precision.load_state_dict(ckpt["precision"])
    trainer.start_epoch, trainer.start_batch = resume_position(ckpt, trainer.steps_per_epoch)
    if trainer.start_batch:
        trainer.resumed_losses = ckpt.get("losses")
    trainer.updates = int(ckpt.get("updates") or 0)
    trainer.resumed = True
    trainer.metrics = dict(ckpt.get("metrics") or {})
    world = trainer.world
    ranks = ckpt.get("rng_ranks")
    if isinstance(ranks, list) and len(ranks) == world.size:
        ckpt_io.restore_rng_state(ranks[world.rank])
    elif world.main:
        ckpt_io.restore_rng_state(ckpt["rng"])
    saved = dict(ckpt.get("hooks") or {})
    if not saved.get("ValidationHook") and "best_epoch" in ckpt:
        # Written before the validation hook kept the best epoch itself: the same fitness
        # (0.9 mAP50-95 + 0.1 mAP50) was a top-level key then.
        saved["ValidationHook"] = {"best_fitness": ckpt.get("best_fitness", -1.0), "best_epoch": ckpt["best_epoch"]}
    for hook in trainer.hooks:
        hook.load_state_dict(saved.get(type(hook).__name__, {}))
    at = f", step {trainer.start_batch + 1}/{trainer.steps_per_epoch}" if trainer.start_batch else ""
    log.info(f"resuming from epoch {trainer.start_epoch + 1}/{trainer.cfg.epochs}{at}")


def mid_epoch(ckpt: dict) -> int | None:
    """The batches of its epoch a mid-epoch checkpoint had done; None for an epoch's end."""
    step = ckpt.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) and step > 0 else None


def resume_position(ckpt: dict, steps_per_epoch: int) -> tuple[int, int]:
    """(epoch, batch) a resume from `ckpt` starts at: the next batch of a mid-epoch checkpoint's
    epoch, else the next epoch's first."""
    step = mid_epoch(ckpt)
    if step is not None and step < steps_per_epoch:
        return int(ckpt["epoch"]), step
    return int(ckpt["epoch"]) + 1, 0


# Device memory a copy stages at a time: a state leaves the GPU in copies of up to this size.
_STAGE_BYTES = 32 << 20


def _copied(value: Any, stage: Callable[[torch.Tensor], bool] = lambda t: t.device.type != "cpu") -> Any:
    """`value` with every container rebuilt and every tensor copied to the CPU, as views of one
    flat buffer per dtype (two where a GPU's tensors and the CPU's mix).

    torch.save writes a record per storage, and between records its writer hands Python's GIL
    back and waits to take it again. A checkpoint thread beside a host-bound training loop, which
    holds the GIL all the time, then waits about a switch interval (5 ms) per record: ECDet-s's
    state, 1,285 storages, took 22-25 s to write beside a spinning Python thread and 0.5-0.7 s
    beside an idle one on a 2-core machine (benchmarks/checkpoint_write.py). As views of one
    buffer per dtype it is a few records (0.7 s beside the spinning thread); the file's
    format is torch.save's own, and each part (model, EMA, optimizer) gets buffers of its own, so
    a part saved on its own later holds only itself.

    Tensors for which `stage` holds (those on a GPU) leave their device a run at a time: those
    of a dtype are concatenated there, up to `_STAGE_BYTES` a run, and copied in one transfer. A
    copy to host memory waits for the device, and a GPU shared by several processes answers each
    wait in its turn: one transfer per tensor (YOLOv9-t's weights, EMA and optimizer: 2,243)
    would wait that many times."""
    tensors: list[torch.Tensor] = []
    ckpt_io.map_tensors(value, tensors.append)
    staged = [stage(t) for t in tensors]
    # A buffer per dtype, and a second for a GPU's tensors where the CPU's mix with them (AdamW's
    # `step` counters beside its moments): the staged ones then lie end to end in theirs.
    sizes: dict[tuple[torch.dtype, bool], int] = {}
    for t, s in zip(tensors, staged):
        sizes[t.dtype, s] = sizes.get((t.dtype, s), 0) + t.numel()
    flat = {key: torch.empty(n, dtype=key[0]) for key, n in sizes.items()}
    offsets = dict.fromkeys(flat, 0)
    # Staged tensors by (dtype, device), each run [tensors, start, end] of their buffer.
    runs: dict[tuple[torch.dtype, torch.device], list] = {}

    def flush(key: tuple[torch.dtype, torch.device]) -> None:
        run, start, end = runs.pop(key)
        flat[key[0], True][start:end].copy_(torch.cat([t.detach().reshape(-1) for t in run]))

    views = []
    for t, s in zip(tensors, staged):
        at = offsets[t.dtype, s]
        offsets[t.dtype, s] = at + t.numel()
        views.append(flat[t.dtype, s][at:at + t.numel()].view(t.shape))
        if not s:
            views[-1].copy_(t.detach())
            continue
        key = (t.dtype, t.device)
        if key in runs and (runs[key][2] != at or (at - runs[key][1]) * t.element_size() >= _STAGE_BYTES):
            flush(key)
        run = runs.setdefault(key, [[], at, at])
        run[0].append(t)
        run[2] = at + t.numel()
    for key in list(runs):
        flush(key)
    copies = iter(views)
    return ckpt_io.map_tensors(value, lambda t: next(copies), copy.deepcopy)


def cpu_state(module: nn.Module) -> dict[str, torch.Tensor]:
    return _copied(module.state_dict())
