"""The training loop: epochs of steps, with hooks around them. The step itself is in step.py."""

from __future__ import annotations

import contextlib
import logging
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from torch import nn

from ..atomic import write_json_atomic
from ..config import TrainConfig
from ..errors import CheckpointError, LibreYOLOError
from ..families.base import FamilySpec
from ..profiler.markers import phase
from ..profiler.window import profiler_hooks
from . import checkpoint as ckpt_io
from . import distributed
from .ema import ModelEMA
from .graphs import GraphManager
from .hooks import CheckpointHook, Hook, ProgressHook, ResultsHook, ValidationHook
from .optim import accumulate_steps, build_optimizer, resolve_auto
from .precision import Precision
from .schedule import LRSchedule
from .step import StepContext, train_step
from .timings import RunClock, describe

log = logging.getLogger("libreyolo")


class NonFiniteLossError(LibreYOLOError):
    """The loss became NaN/inf without a loss scaler to absorb it."""


@dataclass
class TrainResult:
    metrics: dict[str, float]
    run_dir: Path
    best: Path
    last: Path
    epochs_run: int
    timings: dict[str, Any] = field(default_factory=dict)  # engine/timings.py: where the time went


class Trainer:
    def __init__(self, cfg: TrainConfig, family: FamilySpec, size: str, model: nn.Module,
                 data_cfg, run_dir: Path, device: torch.device, *, resume: dict | None = None,
                 hooks: list[Hook] | None = None):
        from ..data import build_train_loader, build_val_loader  # data imports are heavy-ish

        self.clock = RunClock()
        self.cfg, self.family, self.size, self.data_cfg = cfg, family, size, data_cfg
        self.run_dir, self.device = run_dir, device
        # Under torchrun this process is one of world.size (engine/distributed.py); alone, (0, 1).
        self.world = w = distributed.world()
        distributed.check_batch(cfg.batch, w)
        seed_everything(cfg.seed, cfg.deterministic)
        self.model = model.to(device)
        if cfg.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        self.train_loader = build_train_loader(data_cfg, cfg, w.rank, w.size)
        self.val_loader = build_val_loader(data_cfg, cfg) if cfg.val and w.main else None  # rank 0 validates
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
        updates = cfg.epochs * math.ceil(self.steps_per_epoch / accumulate_steps(cfg.batch, cfg.nbs))
        cfg, message = resolve_auto(cfg, len(data_cfg.names), updates)
        if message:
            log.info(message)
        self.cfg = cfg  # checkpoints hold the resolved optimizer: a resume trains on with it
        autotune, message = cudnn_autotune(cfg, self.steps_per_epoch, len(self.train_loader.sampler.sizes))
        torch.backends.cudnn.benchmark = autotune
        if message and device.type == "cuda":
            log.info(message)
        self.ctx = build_step_context(cfg, family, self.model, device)
        self.optimizer, self.precision, self.ema, self.criterion, self.graphs = (
            self.ctx.optimizer, self.ctx.precision, self.ctx.ema, self.ctx.criterion, self.ctx.graphs)
        self.schedule = LRSchedule(self.optimizer, cfg, self.steps_per_epoch, accumulate_steps(cfg.batch, cfg.nbs))
        # Rank 0 validates, writes results and checkpoints and shows progress; the other ranks run
        # no hooks of their own and wait for its decisions at each epoch end (_end_epoch_sync).
        if hooks is None:
            hooks = [ValidationHook(), ResultsHook(), CheckpointHook(), ProgressHook(), *profiler_hooks(cfg)] \
                if w.main else []
        self.hooks: list[Hook] = hooks
        self.start_epoch, self.epoch, self.batch_index, self.iteration = 0, 0, 0, 0
        self.best_fitness, self.best_epoch, self.improved, self.stop = -1.0, -1, False, False
        self.metrics: dict[str, float] = {}
        self.validated_epoch = -1
        self.last_log: dict[str, float] | None = None
        self.item_names = tuple(self.criterion.item_names)
        self._epoch_sum, self._epoch_count = [0.0] * len(self.item_names), 0
        self._acc = torch.zeros(len(self.item_names), device=device)  # device-side loss sums
        self._finite = torch.zeros((), device=device)                 # finite steps in the interval
        self._rank_rng: list | None = None  # every rank's RNG state at the epoch end (rank 0)
        if resume is not None:
            try:
                self._load_resume(resume)
            except (KeyError, TypeError, ValueError, IndexError, RuntimeError) as exc:
                # The weights were checked by the caller; this is the rest of a damaged state.
                raise CheckpointError(f"cannot resume: the checkpoint's training state is damaged "
                                      f"({type(exc).__name__}: {str(exc).strip()[:120]})") from None
        if w.active:
            # After the optimizer made its flat tensors (DDP hooks the parameter views) and after a
            # resume loaded the weights on every rank. The criterion becomes this rank's share of
            # the global batch's loss.
            self.ctx.ddp = distributed.wrap(self.model, device)
            self.ctx.criterion = self.criterion = distributed.GlobalLoss(self.criterion, w.size)

    # --- the loop ---------------------------------------------------------------------------------
    def train(self) -> TrainResult:
        log.info(f"training {self.family.display}-{self.size} on {self.data_cfg.name} "
                 f"({self.train_loader.num_images} train images) for {self.cfg.epochs} epochs on "
                 f"{self._where()}; precision: {self.precision.describe()}; run dir {self.run_dir}")
        self.clock.start_train()
        self._call("before_train")
        epochs_run = 0
        with distributed.failures_as_error(self.world, self.cfg.ddp_timeout, self._last_good), \
                out_of_memory_as_error(self.cfg, self.device):
            for epoch in range(self.start_epoch, self.cfg.epochs):
                self.epoch = epoch
                self.train_loader.set_epoch(self.epoch)
                self._family_epoch()
                self._call("before_epoch")
                self.run_epoch()
                if self.world.active:
                    self._rank_rng = distributed.gather_object(ckpt_io.rng_state())
                self._call("after_epoch")
                self._end_epoch_sync()
                epochs_run += 1
                if self.stop:
                    break
        self._call("after_train")
        self.clock.finish()
        timings = self.clock.summary()
        if self.world.main:
            write_json_atomic(self.run_dir / "timings.json", timings)
        log.info(describe(timings))
        if self.world.active:
            distributed.shutdown()
        weights = self.run_dir / "weights"
        best = weights / "best.pt"
        return TrainResult(metrics=dict(self.metrics), run_dir=self.run_dir,
                           best=best if best.exists() else weights / "last.pt",
                           last=weights / "last.pt", epochs_run=epochs_run, timings=timings)

    def _where(self) -> str:
        if not self.world.active:
            return _device_name(self.device)
        return (f"{self.world.size} processes ({self.backend}; {_device_name(self.device)} on rank 0), "
                f"{self.cfg.batch // self.world.size} images each of every batch of {self.cfg.batch}")

    def _end_epoch_sync(self) -> None:
        """Rank 0's decisions after its validation and checkpoints reach every rank (the others
        wait here for it meanwhile): stop early or not, and the metrics every rank's result holds."""
        if self.world.active:
            self.stop, self.metrics, self.best_fitness, self.best_epoch = distributed.broadcast_object(
                (self.stop, self.metrics, self.best_fitness, self.best_epoch))

    def _family_epoch(self) -> None:
        """Let the family switch epoch-dependent training (YOLOX's L1 term when mosaic closes); a
        change to what the captured region computes re-arms the CUDA graphs."""
        set_epoch = getattr(self.model, "set_epoch", None)
        reason = set_epoch(self.epoch, self.cfg) if callable(set_epoch) else None
        if reason:
            log.info(f"epoch {self.epoch + 1}: {reason}")
            self.graphs.invalidate(reason)

    def run_epoch(self) -> None:
        self.model.train()
        n = self.steps_per_epoch
        self._epoch_sum = [0.0] * len(self.item_names)
        self._epoch_count = 0
        self._reset_interval()
        t_epoch = time.perf_counter()
        batches = iter(self.train_loader)
        since_update = 0
        for batch_index in range(n):
            self.batch_index = batch_index
            with phase("data"):
                batch = next(batches)
            self.clock.first_step(time.perf_counter() - t_epoch)
            self.iteration = self.epoch * n + self.batch_index
            self.schedule.step(self.iteration)
            self._call("before_step")
            # Step the optimizer once `accumulate` batches have contributed (ramping up from 1
            # during warmup) and at the end of each epoch, so an epoch always ends on a clean
            # update and resume from last.pt is exact.
            since_update += 1
            update = since_update >= self.schedule.accumulate_at(self.epoch, self.batch_index) or self.batch_index + 1 == n
            since_update = 0 if update else since_update
            items = train_step(self.ctx, batch, update)
            # img/s counts the global batch: every rank's images of this step.
            self._accumulate(items, self.train_loader.sampler.global_size(batch_index)
                             if self.world.active else batch.images.shape[0])
            if (self.batch_index + 1) % self.cfg.log_interval == 0 or self.batch_index + 1 == n:
                self._read_losses()
            self._call("after_step")
            if self.stop:  # a hook ended the run mid-epoch (`profile run` after its window)
                if self._interval_steps:
                    self._read_losses()  # so the epoch line shows the steps that did run
                break
        # The last read-back synchronised with the device, so this is the epoch's real length.
        self.clock.add_epoch(time.perf_counter() - t_epoch)

    # --- loss bookkeeping: device-side sums, one read-back per log interval ---------------------
    def _reset_interval(self) -> None:
        self._acc.zero_()
        self._finite.zero_()
        self._interval_steps, self._interval_images, self._interval_t0 = 0, 0, time.perf_counter()

    def _accumulate(self, items: torch.Tensor, images: int) -> None:
        # Four tiny device ops, no sync: a float16 step the scaler skipped (inf/NaN items) must
        # neither poison the logged mean nor go unnoticed; the read-back decides what it means.
        ok = torch.isfinite(items).all()
        self._acc += torch.where(ok, items, 0.0)
        self._finite += ok
        self._interval_steps += 1
        self._interval_images += images

    def _read_losses(self) -> None:
        # Under DDP the items are already the global batch's on every rank (GlobalLoss all-reduces
        # them with the normaliser each step), so this read needs no collective, and every rank
        # reaches the same verdict on a non-finite loss.
        values = torch.cat([self._acc, self._finite.reshape(1)]).tolist()  # the loop's one sync
        *sums, finite = values
        bad = self._interval_steps - int(finite)
        if bad and not self.precision.scaler_enabled:
            raise NonFiniteLossError(
                f"non-finite loss at epoch {self.epoch + 1}, step {self.batch_index + 1} "
                f"({bad} of the last {self._interval_steps} steps); epoch mean so far "
                f"{self._format_items(self.epoch_losses())}; {self._last_good()}")
        self._epoch_sum = [a + b for a, b in zip(self._epoch_sum, sums)]
        self._epoch_count += int(finite)
        elapsed = max(time.perf_counter() - self._interval_t0, 1e-9)
        self.last_log = {"img_s": self._interval_images / elapsed}
        if self.device.type == "cuda":
            self.last_log["mem_gb"] = torch.cuda.max_memory_reserved(self.device) / 2**30
        self._reset_interval()

    def epoch_losses(self) -> dict[str, float]:
        """Mean loss items over this epoch's finite steps read back so far."""
        count = max(self._epoch_count, 1)
        return {k: v / count for k, v in zip(self.item_names, self._epoch_sum)}

    @staticmethod
    def _format_items(items: dict[str, float]) -> str:
        return " ".join(f"{k}={v:.4g}" for k, v in items.items())

    def _last_good(self) -> str:
        last = self.run_dir / "weights" / "last.pt"
        if last.exists():
            return f"the last good state is {last} (end of epoch {self.epoch})"
        return "no good state was saved (the first epoch failed)"

    # --- validation, checkpoints ----------------------------------------------------------------
    def validate(self) -> dict[str, float]:
        from ..eval import evaluate

        model = self.ema.ema if self.ema is not None else self.model
        metrics = evaluate(model, self.val_loader, self.device, conf=self.cfg.conf, iou=self.cfg.iou,
                           max_det=self.cfg.max_det, amp_dtype=self.precision.dtype,
                           names=self.data_cfg.names, progress=False)
        self.clock.val_images += int(metrics.get("num_images", 0))
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {
            "family": self.family.name, "size": self.size, "names": list(self.data_cfg.names),
            "model": _cpu_state(self.model), "ema": _cpu_state(self.ema.ema) if self.ema else None,
            "ema_updates": self.ema.updates if self.ema else 0,
            "optimizer": self.optimizer.state_dict(), "precision": self.precision.state_dict(),
            "epoch": self.epoch, "best_fitness": self.best_fitness, "best_epoch": self.best_epoch,
            "metrics": dict(self.metrics), "config": self.cfg.to_dict(), "rng": ckpt_io.rng_state(),
            "hooks": {type(h).__name__: h.state_dict() for h in self.hooks},
            "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
            # A multi-process run's every RNG, rank by rank: a resume on as many processes restores
            # each; on another count rank 0 takes `rng` and the others start from seed + rank.
            **({"rng_ranks": self._rank_rng} if self._rank_rng is not None else {}),
        }

    def save(self, path: Path) -> Path:
        return ckpt_io.save_checkpoint(path, self.state_dict())

    def _load_resume(self, ckpt: dict) -> None:
        self.model.load_state_dict(ckpt["model"])
        if self.ema is not None and ckpt.get("ema") is not None:
            self.ema.ema.load_state_dict(ckpt["ema"])
            self.ema.updates = int(ckpt.get("ema_updates", 0))
        try:
            self.optimizer.load_state_dict(ckpt["optimizer"])
        except ValueError as exc:  # torch's one-line group/size mismatch
            raise CheckpointError(
                f"cannot resume: the checkpoint's optimizer state does not fit this optimizer ({exc}); "
                "a checkpoint from before the flat optimizer (one tensor per parameter group) cannot be "
                "resumed: fine-tune from its weights instead (model=<checkpoint>)") from None
        self.precision.load_state_dict(ckpt["precision"])
        self.start_epoch = int(ckpt["epoch"]) + 1
        self.best_fitness = float(ckpt.get("best_fitness", -1.0))
        self.best_epoch = int(ckpt.get("best_epoch", -1))
        self.metrics = dict(ckpt.get("metrics") or {})
        ranks = ckpt.get("rng_ranks")
        if isinstance(ranks, list) and len(ranks) == self.world.size:
            ckpt_io.restore_rng_state(ranks[self.world.rank])
        elif self.world.main:
            ckpt_io.restore_rng_state(ckpt["rng"])
        for hook in self.hooks:
            hook.load_state_dict(ckpt.get("hooks", {}).get(type(hook).__name__, {}))
        log.info(f"resuming from epoch {self.start_epoch + 1}/{self.cfg.epochs}")

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


def build_step_context(cfg: TrainConfig, family: FamilySpec, model: nn.Module, device: torch.device) -> StepContext:
    """Optimizer, precision, EMA and criterion for `model` (already on `device`): what a step needs.

    Shared by the trainer and `libreyolo bench step`, so the benchmark times the real step. The
    trainer resolves `optimizer=auto` for its run length first; any other caller gets what auto
    gives a short run (a fine-tune at defaults).
    """
    cfg, _ = resolve_auto(cfg, model.num_classes, optimizer_steps=1)
    precision = Precision.create(cfg.amp, cfg.amp_dtype, device)
    if precision.message:
        log.info(precision.message)
    # EMA before graphs: the manager must see the model in its final device and memory format.
    ema = ModelEMA(model) if cfg.ema else None
    # With cuda_graph off (or unsupported) this is a silent pass-through to `model.capturable`.
    graphs = GraphManager.for_run(model, cfg, family, device, precision)
    # The optimizer holds one flat tensor per parameter group (optim.flatten): clipping reads
    # those few gradients, not one per parameter.
    optimizer = build_optimizer(model, cfg, device_type=device.type)
    return StepContext(model=model, capturable=graphs.step_callable, criterion=family.criterion(model, cfg),
                       optimizer=optimizer, precision=precision,
                       params=[p for group in optimizer.param_groups for p in group["params"]],
                       clip_grad=cfg.clip_grad, ema=ema, device=device, channels_last=cfg.channels_last,
                       graphs=graphs)


def seed_everything(seed: int, deterministic: bool) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = not deterministic


# cudnn_benchmark=auto turns autotuning on only for runs this long (steps per image size). On the
# H200 (YOLOv9-t, batch 8, 640 px, float16, graphed) autotuning cost 13 s in the first epoch and
# then saved 7.6 ms a step (2.36 s against 3.12 s per 100-step epoch): it pays for itself after
# about 1,700 steps (docs/training-performance.md, "Fixed cost of a run").
AUTOTUNE_MIN_STEPS = 2000


def cudnn_autotune(cfg: TrainConfig, steps_per_epoch: int, sizes: int) -> tuple[bool, str | None]:
    """(cudnn.benchmark for this run, a line saying why when `auto` decided).

    Autotuning times every algorithm for each new convolution shape, so each training size (and
    the validation shapes) pays it once; multi-scale runs pay it per size."""
    if cfg.deterministic:
        return False, None
    if cfg.cudnn_benchmark != "auto":
        return bool(cfg.cudnn_benchmark), None
    steps = cfg.epochs * steps_per_epoch
    on = steps >= AUTOTUNE_MIN_STEPS * sizes
    per = f" over {sizes} image sizes" if sizes > 1 else ""
    return on, (f"cudnn_benchmark=auto: {'on' if on else 'off'} ({steps} steps{per}; autotuning pays for "
                f"itself after about {AUTOTUNE_MIN_STEPS} steps per size)")


def _cpu_state(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return str(device)


class OutOfMemory(LibreYOLOError):
    """A batch the device cannot hold."""

    per_rank = True  # under DDP each process says it for its own device (cli/app.py)


def is_out_of_memory(exc: BaseException) -> bool:
    """CUDA's OutOfMemoryError, or the CPU allocator's RuntimeError ("can't allocate memory")."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text)


@contextlib.contextmanager
def out_of_memory_as_error(cfg: TrainConfig, device: torch.device):
    """Turn running out of memory into one line naming what to lower, instead of a traceback."""
    try:
        yield
    except (torch.OutOfMemoryError, RuntimeError) as exc:
        if not is_out_of_memory(exc):
            raise
        half = max(cfg.batch // 2, 1)
        lower = f"lower batch (e.g. batch={half}) or imgsz" if cfg.batch > 1 else "lower imgsz"
        raise OutOfMemory(f"out of memory on {device} at batch={cfg.batch} imgsz={cfg.imgsz}: {lower}"
                          + (", or set cuda_graph=false" if cfg.cuda_graph else "")) from None


def make_run_dir(project: str, name: str, exist_ok: bool) -> Path:
    """project/name, or project/name2, name3, ... unless exist_ok (created atomically)."""
    root = Path(project)
    root.mkdir(parents=True, exist_ok=True)
    if exist_ok:
        path = root / name
        path.mkdir(parents=True, exist_ok=True)
        return path
    for i in range(1, 10_000):
        path = root / (name if i == 1 else f"{name}{i}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise LibreYOLOError(f"too many run directories named '{name}' under '{project}'")


def write_args(run_dir: Path, cfg: TrainConfig) -> None:
    (run_dir / "args.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
