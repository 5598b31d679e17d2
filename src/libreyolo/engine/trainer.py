"""The training loop: epochs of steps, with hooks around them.

The step itself is in step.py and is built by builder.py; the loss bookkeeping is meter.py, the
checkpointed state state.py, run directories rundir.py. The loop knows the task (tasks/) only
through its loaders, its evaluation and its fitness; the step never knows it.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import time
import weakref
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .. import signals
from ..atomic import write_json_atomic
from ..config import TrainConfig
from ..data.loader import close_workers
from ..families import arch_name
from ..families.base import FamilySpec
from ..logs import counted
from ..markers import phase
from ..tasks.base import TaskSpec
from . import checkpoint as ckpt_io
from . import distributed, diverge
from .builder import (
    build_step_context,
    compile_cache_dir,
    cudnn_autotune,
    place_model,
    seed_everything,
    set_cudnn_autotune,
)
from .device import device_name, out_of_memory_as_error
from .graphs import resolve_auto as resolve_graphs
from .meter import LossMeter
from .optim import accumulation, resolve_accumulate, resolve_auto
from .precise_bn import STATS_BATCH, batch_norms, remeasure_
from .recipe import resolve_recipe
from .run import Hook
from .schedule import LRSchedule
from .state import restore_training_state, training_state
from .step import train_step
from .timings import RunClock, describe

log = logging.getLogger("libreyolo")


@dataclass
class TrainResult:
    metrics: dict[str, float]
    run_dir: Path
    best: Path
    last: Path
    epochs_run: int
    timings: dict[str, Any] = field(default_factory=dict)  # engine/timings.py: where the time went
    task: str = "detect"


class Trainer:
    """One training run. `hooks` are the run's hooks in calling order (hooks.default_hooks() plus
    any the entry point adds, the profiler's among them); under multi-process training only rank
    0 runs them, and the others wait for its decisions at each epoch end. What the hooks and the
    checkpoint read of it is run.Run."""

    def __init__(self, cfg: TrainConfig, family: FamilySpec, size: str, model: nn.Module,
                 data_cfg, run_dir: Path | None, device: torch.device, *, task: TaskSpec,
                 hooks: list[Hook], resume: dict | None = None, explicit: Collection[str] | None = None):
        self.clock = RunClock()
        self.cfg, self.family, self.size, self.data_cfg, self.task = cfg, family, size, data_cfg, task
        self.run_dir, self.device = run_dir, device
        # Under torchrun this process is one of world.size (engine/distributed.py); alone, (0, 1).
        self.world = w = distributed.world()  # joined at the command's start (distributed.join)
        seed_everything(cfg.seed, cfg.deterministic)
        self.model = place_model(model, cfg, device)
        self.train_loader = task.train_loader(data_cfg, cfg, w.rank, w.size)
        self.val_loader = task.val_loader(data_cfg, cfg) if cfg.val and w.main else None  # rank 0 validates
        # precise_bn: where the validated weights' BatchNorm statistics are measured (built at the first
        # validation that measures, `_stats_images`).
        self.stats_loader = None
        if w.active:
            self.backend = distributed.init(w, device, cfg.ddp_timeout)
            # Before the EMA copies the model and the optimizer flattens its parameters.
            self.model, message = distributed.sync_batch_norm(self.model, cfg.sync_bn, device, w)
            if message:
                log.info(message)
            # Per-rank process RNGs (the initial weights were drawn from `seed` on every rank); the
            # augmentation draws from per-sample generators and is the same whichever rank loads.
            seed_everything(cfg.seed + w.rank, cfg.deterministic)
            tail = len(self.train_loader.dataset) % cfg.batch
            if 0 < tail < w.size:
                log.info(f"the last {tail} image(s) of each epoch's order are left out: fewer than one per process")
        self.steps_per_epoch = len(self.train_loader)
        # The default policies, now that the run's length is known: the recipe (the family's
        # published one or the generic), then the optimizer (which the recipe may leave `auto`),
        # both by the optimizer steps at the accumulation given (else round(nbs/batch), the peer
        # trainer's count for the same choices), then the accumulation itself.
        updates = cfg.epochs * math.ceil(self.steps_per_epoch / accumulation(cfg))
        resolved, message = resolve_recipe(cfg, family, size, explicit, updates)
        if message:
            log.info(message)
        if resolved != cfg:
            self.train_loader.reconfigure(resolved)
        cfg, message = resolve_auto(resolved, len(data_cfg.names), updates, explicit)
        if message:
            log.info(message)
        cfg, message = resolve_accumulate(cfg, self.steps_per_epoch, explicit)
        if message:
            log.info(message)
        self.cfg = cfg  # checkpoints hold the resolved recipe, optimizer and accumulation: a resume trains on with them
        autotune, message = cudnn_autotune(cfg, self.steps_per_epoch, len(self.train_loader.sampler.sizes))
        set_cudnn_autotune(cfg, autotune)
        if message and device.type == "cuda":
            log.info(message)
        # cuda_graph=auto is decided here, where the run's processes and device are known; the cfg
        # keeps `auto`, so a resume on another machine decides again.
        graphs, message = resolve_graphs(cfg, self.model, family, device)
        if message:
            log.info(message)
        self.ctx = build_step_context(replace(cfg, cuda_graph=graphs), family, self.model, device)
        self.optimizer, self.precision, self.ema, self.criterion, self.graphs = (
            self.ctx.optimizer, self.ctx.precision, self.ctx.ema, self.ctx.criterion, self.ctx.graphs)
        self.schedule = LRSchedule(self.optimizer, cfg, self.steps_per_epoch, cfg.accumulate)
        # compile=true: the first step compiles the network; its time is said once.
        self._compiling = self.graphs.module is not self.model.capturable
        if self.ctx.whole is not None:  # a captured update bakes SGD's momentum in: not while it ramps
            # Through a weak reference: a closure on the trainer would put it in a cycle that
            # keeps it, its loaders' workers and its graphs alive after train() returns.
            trainer = weakref.ref(self)
            self.ctx.whole.ready = lambda: trainer().schedule.momentum_settled(trainer().iteration)
        self.hooks: list[Hook] = list(hooks) if w.main else []
        self.start_epoch, self.epoch, self.batch_index, self.iteration = 0, 0, 0, 0
        self.start_batch = 0  # a resume from a mid-epoch checkpoint: the first batch of start_epoch
        self.resumed = False
        self.updates = 0  # optimizer steps of the run so far (checkpoint_steps counts them)
        self.checkpoint_step: int | None = None  # set for the step a mid-epoch checkpoint is due after
        self.resumed_losses: dict | None = None  # that checkpoint's loss sums of its epoch so far
        self.stop = False  # set by a hook to end the run (early stopping, `profile run`)
        # The last validation: scalar metrics, the task's detail results, and its epoch.
        self.metrics: dict[str, float] = {}
        self.val_details: dict[str, Any] | None = None
        self.validated_epoch = -1
        self.meter = LossMeter(tuple(self.criterion.item_names), device)
        self.rank_rng: list | None = None  # every rank's RNG state at the epoch end (rank 0)
        self.checkpoints = ckpt_io.BackgroundWriter()  # CheckpointHook's writes
        self.run_lock = None  # the run directory's lock (engine/lock.py), set by rundir.py on rank 0
        self.skips = diverge.SkipWatch(self.precision)  # a scaler skipping every step stops the run
        if resume is not None:
            restore_training_state(self, resume)
        if w.active:
            # After the optimizer made its flat tensors (DDP hooks the parameter views) and after a
            # resume loaded the weights on every rank. The criterion becomes this rank's share of
            # the global batch's loss.
            self.ctx.ddp = distributed.wrap(self.model, device)
            self.ctx.criterion = self.criterion = distributed.GlobalLoss(self.criterion, w.size)

    @property
    def arch(self) -> str:
        return arch_name(self.family, self.size)

    @property
    def last_log(self) -> dict[str, float] | None:
        """img/s and GPU memory of the last loss read-back (what progress shows)."""
        return self.meter.last_log

    # --- the loop ---------------------------------------------------------------------------------
    def train(self) -> TrainResult:
        try:
            return self._train()
        finally:  # an error or a Ctrl-C too: the workers stop now, not at the interpreter's exit
            close_workers(self.train_loader)
            close_workers(self.val_loader)

    def _train(self) -> TrainResult:
        log.info(f"training {self.family.display}-{self.size} on {self.data_cfg.name} "
                 f"({self.train_loader.num_images} train images, {self.task.display}) for {counted(self.cfg.epochs, 'epoch')} on "
                 f"{self._where()}; precision: {self.precision.describe()}; run dir {self.run_dir}")
        self.clock.start_train()
        self._call("before_train")
        epochs_run = 0
        with self._checkpoints_settled(), settled_heap(), \
                distributed.failures_as_error(self.world, self.cfg.ddp_timeout, self._last_good), \
                out_of_memory_as_error(replace(self.cfg, cuda_graph=self.graphs.enabled), self.device):
            for epoch in range(self.start_epoch, self.cfg.epochs):
                self.epoch = epoch
                first = self.start_batch if epoch == self.start_epoch else 0
                self.train_loader.set_epoch(self.epoch)
                self.train_loader.start_at(first)
                self._family_epoch()
                self.batch_index = first
                self._call("before_epoch")
                self.run_epoch(first)
                if self.world.active:
                    self.rank_rng = distributed.gather_object(ckpt_io.rng_state())
                self._call("after_epoch")
                self._end_epoch_sync()
                epochs_run += 1
                if self.stop:
                    break
        try:
            self.wait_for_checkpoints()
        finally:
            self._call("after_train")
        self.clock.finish()
        timings = self.clock.summary()
        if self.world.main:
            write_json_atomic(self.run_dir / "timings.json", timings, make_dirs=False)
        log.info(describe(timings))
        if self.world.active:
            distributed.shutdown()
        weights = self.run_dir / "weights"
        best = weights / "best.pt"
        return TrainResult(metrics=dict(self.metrics), run_dir=self.run_dir,
                           best=best if best.exists() else weights / "last.pt",
                           last=weights / "last.pt", epochs_run=epochs_run, timings=timings, task=self.task.name)

    def _where(self) -> str:
        if not self.world.active:
            return device_name(self.device)
        return (f"{self.world.size} processes ({self.backend}; {device_name(self.device)} on rank 0), "
                f"{self.cfg.batch // self.world.size} images each of every batch of {self.cfg.batch}")

    def _end_epoch_sync(self) -> None:
        """Rank 0's decisions after its validation and checkpoints reach every rank (the others
        wait here for it meanwhile): stop early or not, and the metrics every rank's result holds."""
        if self.world.active:
            self.stop, self.metrics = distributed.broadcast_object((self.stop, self.metrics))

    def _family_epoch(self) -> None:
        """Let the family switch epoch-dependent training (YOLOX's L1 term when mosaic closes); a
        change to what the captured region computes re-arms the CUDA graphs."""
        set_epoch = getattr(self.model, "set_epoch", None)
        reason = set_epoch(self.epoch, self.cfg) if callable(set_epoch) else None
        if reason:
            log.info(f"epoch {self.epoch + 1}: {reason}")
            self.graphs.invalidate(reason)
            if self.ctx.whole is not None:
                self.ctx.whole.invalidate(reason)

    def run_epoch(self, first: int = 0) -> None:
        """The epoch's steps from batch `first` (0, or where a mid-epoch checkpoint left it)."""
        self.model.train()
        n = self.steps_per_epoch
        self.meter.start_epoch()
        if first and self.resumed_losses is not None:
            self.meter.load_state_dict(self.resumed_losses)  # the epoch's row averages all its steps
        t_epoch = time.perf_counter()
        batches = iter(self.train_loader)
        since_update = 0  # a mid-epoch checkpoint is written right after an optimizer step
        for batch_index in range(first, n):
            self.batch_index = batch_index
            with phase("data"):
                batch = next(batches)
            self.clock.first_step(time.perf_counter() - t_epoch)
            self.iteration = self.epoch * n + self.batch_index
            signals.check()  # a SIGTERM that third-party code swallowed still ends the run here
            self.schedule.step(self.iteration)
            self._call("before_step")
            since_update += 1
            update = self.schedule.steps_optimizer(self.epoch, self.batch_index, since_update)
            since_update = 0 if update else since_update
            t_step = time.perf_counter() if self._compiling else 0.0
            items = train_step(self.ctx, batch, update)
            if self._compiling:
                self._compiling = False
                log.info(f"compile=true: the first step took {time.perf_counter() - t_step:.1f} s, compiling the "
                         f"network; inductor caches its kernels in {compile_cache_dir()}, so a later run of this "
                         f"model at this size compiles faster")
            # img/s counts the global batch: every rank's images of this step.
            self.meter.add(items, self.train_loader.sampler.global_size(batch_index)
                           if self.world.active else batch.images.shape[0])
            last = self.batch_index + 1 == n
            self.updates += update
            # checkpoint_steps: every N optimizer steps, except at the epoch's end (its own checkpoint
            # follows). Every rank counts the same steps, so every rank reaches the collective below.
            every = self.cfg.checkpoint_steps
            mid_epoch = update and not last and every > 0 and self.updates % every == 0
            if (self.batch_index + 1) % self.cfg.log_interval == 0 or last or mid_epoch:
                self._read_losses(final=last or mid_epoch)  # a checkpoint keeps the epoch's loss sums
            if mid_epoch:
                self._prepare_mid_epoch_checkpoint()
            self._call("after_step")
            self.checkpoint_step = None
            if self.stop:  # a hook ended the run mid-epoch (`profile run` after its window)
                self._read_losses(final=True)  # so the epoch line shows the steps that did run
                break
        # The final read-back synchronised with the device, so this is the epoch's real length.
        self.clock.add_epoch(time.perf_counter() - t_epoch, whole=first == 0)

    def _prepare_mid_epoch_checkpoint(self) -> None:
        """What the CheckpointHook's mid-epoch last.pt needs beyond rank 0's state: every rank's
        RNG (a collective), and the position, which tells the hook that one is due."""
        if self.world.active:
            self.rank_rng = distributed.gather_object(ckpt_io.rng_state())
        self.checkpoint_step = self.batch_index + 1

    def _read_losses(self, final: bool = False) -> None:
        # Within an epoch the read is deferred on CUDA (meter.py): the loop does not wait for the
        # device; `final` (the epoch's end) reads at once. Under DDP the items are already the
        # global batch's on every rank (GlobalLoss all-reduces them with the normaliser each step),
        # so this read needs no collective, and every rank reaches the same verdict on a
        # non-finite loss.
        where = f"epoch {self.epoch + 1}, step {self.batch_index + 1}"
        self.meter.read(self.precision.scaler_enabled, where, self._last_good, final=final)
        self.skips.read(where, self._last_good, final=final)

    def epoch_losses(self) -> dict[str, float]:
        """Mean loss items over this epoch's finite steps read back so far."""
        return self.meter.epoch_means()

    def _last_good(self) -> str:
        """What a failed run can resume from (asked only on a failure path)."""
        self.checkpoints.wait(raise_errors=False)  # a pending last.pt is the last good state once written
        # Read back and checked to hold finite weights before it is named (engine/diverge.py).
        return diverge.last_good_state(self.run_dir, self.checkpoints.written, resumed=self.resumed)

    # --- validation, checkpoints ----------------------------------------------------------------
    def validate(self) -> dict[str, float]:
        """Evaluate the EMA weights (else the model) with the task's evaluator, their BatchNorm
        statistics first measured again under precise_bn; the scalar metrics become
        `self.metrics`, the rest `self.val_details` (results.html)."""
        model = self.ema.ema if self.ema is not None else self.model
        stats = self._stats_images()
        if stats is not None:
            remeasure_(model, stats, self.device, self.precision.dtype)
        metrics = self.task.evaluate(model, self.val_loader, self.device, self.cfg, amp_dtype=self.precision.dtype,
                                     names=self.data_cfg.names, progress=False)
        self.clock.val_images += int(metrics.get("num_images", 0))
        self.val_details = {k: metrics[k] for k in self.task.detail_keys if k in metrics}
        self.metrics = self.task.scalars(metrics)
        self.validated_epoch = self.epoch
        return self.metrics

    def _stats_images(self):
        """precise_bn's images for this validation, or None: only while the epoch trained with mosaic.
        Then the running averages describe mosaic batches at older weights, and validation's
        plain images at today's weights come out far from them (YOLO-NAS-s's one-epoch dips).
        Once mosaic closes, the training batches look like validation's and the averages, of the
        weights of the last epoch or so, are what the val images would measure; the training
        images' own statistics come out lower then (their features are fit: YOLOv9-t ended 0.016
        below with them, docs/accuracy.md), so they are kept. A task without mosaic keeps them."""
        cfg = self.cfg
        if (self.val_loader is None or cfg.precise_bn <= 0 or getattr(self.train_loader.sampler, "mosaic", 0.0) <= 0
                or not batch_norms(self.model)):
            return None
        if self.stats_loader is None:
            self.stats_loader = self.task.stats_loader(self.data_cfg, cfg, self.train_loader, cfg.precise_bn,
                                                       max(int(cfg.batch), STATS_BATCH))
            log.info(f"precise_bn={cfg.precise_bn}: while mosaic is on, BatchNorm statistics of the validated "
                     f"weights are measured again on {self.stats_loader.num_images} training images before each "
                     f"validation (precise_bn=0 keeps the running averages)")
        return self.stats_loader

    def state_dict(self) -> dict[str, Any]:
        return training_state(self)

    def save(self, path: Path) -> Path:
        return ckpt_io.save_checkpoint(path, self.state_dict())

    def save_in_background(self, *paths: Path) -> None:
        """One detached copy of the training state, written to each of `paths` on the checkpoint
        thread: the files are complete after `wait_for_checkpoints`. The previous epoch's writes
        are waited for first (they have had a whole epoch), so one epoch's state at most is in
        flight, and a write that failed raises here, one WriteError line. Weights that went
        non-finite are never written (engine/diverge.py): the run stops instead. The state is
        serialised once, to the first path; the others (best.pt, epochN.pt) are byte copies of it."""
        self.checkpoints.wait()
        state = training_state(self, detached=True)
        diverge.check_weights(state, f"epoch {self.epoch + 1}, step {self.batch_index + 1}", self._last_good)
        if paths:
            self.checkpoints.submit(paths[0], state, tag=self.epoch, copies=paths[1:])

    @contextlib.contextmanager
    def _checkpoints_settled(self) -> Iterator[None]:
        """A loop that raises (out of memory, Ctrl-C, a hook's error) still lets the pending
        writes finish before the error goes on; their own failures are logged, not raised over it."""
        try:
            yield
        except BaseException as exc:
            self.checkpoints.wait(raise_errors=False)
            if isinstance(exc, KeyboardInterrupt):  # Ctrl-C, SIGTERM: the line says what was kept
                signals.note(exc, f"epoch {self.epoch + 1}, step {self.batch_index + 1}", self._last_good())
            raise

    def wait_for_checkpoints(self) -> None:
        """Block until the background writes are on disk; the wait counts as checkpoint time."""
        t0 = time.perf_counter()
        self.checkpoints.wait()
        self.clock.add_hook("CheckpointHook", time.perf_counter() - t0)

    # --- hooks ----------------------------------------------------------------------------------
    def _call(self, event: str) -> None:
        if event in _STEP_EVENTS:  # every step: kept to the bare calls
            for hook in list(self.hooks):  # a copy: hooks may remove themselves
                getattr(hook, event)(self)
            return
        for hook in list(self.hooks):
            t0 = time.perf_counter()
            getattr(hook, event)(self)
            self.clock.add_hook(type(hook).__name__, time.perf_counter() - t0)

    def remove_hook(self, hook: Hook) -> None:
        self.hooks.remove(hook)


_STEP_EVENTS = ("before_step", "after_step")


@contextlib.contextmanager
def settled_heap() -> Iterator[None]:
    """The objects alive when the loop starts (torch's, the model's, the optimizer's: about
    358,000 for YOLOv9-t) left out of the garbage collector's passes until it ends.

    A full collection walks every tracked object, and a dense validation's evaluation (a dict
    per box for faster-coco-eval) sets one off every few evaluations: ten of them took 1.90 s
    with the heap as it is and 1.62 s frozen on a 2-core machine (benchmarks/collector_cost.py).
    What is garbage is collected before the freeze; the loop's own objects are collected as
    usual, and the frozen ones go back at the end, so a process that trains many times keeps
    nothing."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
