"""Trainer hooks: logging, validation, results.csv and checkpoints are hooks, not loop code.

The hook contract (`Hook`, its call sequence) and what a hook is handed (`Run`, the trainer's
face to its hooks) are in run.py.
"""

from __future__ import annotations

import logging
import math
import sys
import time

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from .lock import RunDirGuard
from .results_csv import ResultsTable
from .run import Hook, Run

log = logging.getLogger("libreyolo")


class ProgressHook(Hook):
    """Each epoch's progress on stderr: a live bar on a terminal, plain lines in a log (CI, pipes).

    Both show the steps, img/s, the loss items (the epoch's means so far), GPU memory on CUDA and
    the time left in the epoch, from the figures of the last loss read-back (`trainer.last_log`,
    once per `log_interval` steps): the hook reads nothing from the device itself. The bar
    advances every step (host counters only); its text changes at the read-backs. In a log, a
    read-back prints a line once a tenth of the epoch or a minute has passed since the last line,
    never sooner than 5 s after it; every epoch then ends with its own line.
    """

    PLAIN_MIN_S = 5.0       # never more than a line per 5 s in a log ...
    PLAIN_MAX_S = 60.0      # ... at least one a minute while read-backs come ...
    PLAIN_FRACTION = 0.1    # ... and otherwise one per tenth of the epoch

    def __init__(self, stream=None, clock=time.perf_counter):
        self.console = Console(file=stream or sys.stderr, highlight=False)
        self.live = self.console.is_terminal and not self.console.is_dumb_terminal
        self.clock = clock
        self.progress: Progress | None = None
        self._task = None
        self._shown_log = None

    def before_epoch(self, trainer: Run) -> None:
        self._t0 = self._last_line = self.clock()
        self._first = self._last_line_step = trainer.batch_index  # > 0 when resumed mid-epoch
        self._shown_log = trainer.last_log  # the previous epoch's figures are not this epoch's
        if not self.live:
            return
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(bar_width=30),
                                 TextColumn("{task.completed}/{task.total}"), TextColumn("{task.fields[info]}"),
                                 TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                                 console=self.console, transient=False)
        self.progress.start()
        self._task = self.progress.add_task(_epoch_name(trainer), total=trainer.steps_per_epoch,
                                            completed=trainer.batch_index, info="")

    def after_step(self, trainer: Run) -> None:
        fresh = trainer.last_log is not self._shown_log  # a read-back just happened
        if fresh:
            self._shown_log = trainer.last_log
        if self.progress is not None:
            info = {"info": _format_log(trainer, metrics=False)} if fresh else {}
            self.progress.update(self._task, advance=1, **info)
        elif fresh:
            self._maybe_line(trainer)

    def _maybe_line(self, trainer: Run) -> None:
        now, done, total = self.clock(), trainer.batch_index + 1, trainer.steps_per_epoch
        since = now - self._last_line
        if done >= total or since < self.PLAIN_MIN_S:
            return  # the epoch line follows at once / too soon after the last line
        if since < self.PLAIN_MAX_S and done - self._last_line_step < self.PLAIN_FRACTION * total:
            return
        self._last_line, self._last_line_step = now, done
        elapsed = now - self._t0
        left = elapsed / max(done - self._first, 1) * (total - done)
        self._print(f"{_epoch_name(trainer)}  {done}/{total} steps ({100 * done / total:.0f}%)  "
                    f"{_format_log(trainer, metrics=False)}  {_clock(elapsed)} elapsed, ETA {_clock(left)}")

    def after_epoch(self, trainer: Run) -> None:
        if self.progress is not None:
            self.progress.update(self._task, info=_format_log(trainer))
            self.progress.stop()
            self.progress = None
        else:
            self._print(f"{_epoch_name(trainer)}  {_format_log(trainer)}  {self.clock() - self._t0:.1f}s")

    def after_train(self, trainer: Run) -> None:
        if self.progress is not None:  # after_epoch closes every bar; never leave a live display behind
            self.progress.stop()
            self.progress = None

    def _print(self, line: str) -> None:
        self.console.print(line, markup=False, soft_wrap=True)


def _epoch_name(trainer: Run) -> str:
    return f"epoch {trainer.epoch + 1}/{trainer.cfg.epochs}"


def _clock(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m // 60}:{m % 60:02d}:{s:02d}"


def _format_log(trainer: Run, metrics: bool = True) -> str:
    """The figures of the last read-back: loss items, img/s, GPU memory; with `metrics`, the last
    validation's headline metrics (the task's)."""
    parts = [f"{k} {v:.4g}" for k, v in trainer.epoch_losses().items()]
    if trainer.last_log:
        parts.append(f"{_rate(trainer.last_log['img_s'])} img/s")
        if trainer.last_log.get("mem_gb"):
            parts.append(f"GPU {trainer.last_log['mem_gb']:.1f}G")
    if metrics and trainer.metrics:
        parts.append(trainer.task.summary(trainer.metrics))
    return "  ".join(parts)


class ValidationHook(Hook):
    """Validate the EMA weights every `eval_interval` epochs and after the last; track the best
    fitness (the task's: it picks best.pt) and stop early after `patience` epochs without a better
    one. The best epoch is this hook's state, saved in checkpoints and restored on resume."""

    def __init__(self) -> None:
        self.best_fitness, self.best_epoch = -1.0, -1

    def after_epoch(self, trainer: Run) -> None:
        cfg = trainer.cfg
        last = trainer.epoch + 1 == cfg.epochs
        if not cfg.val or not (last or (trainer.epoch + 1) % cfg.eval_interval == 0):
            return
        metrics = trainer.validate()
        fitness = trainer.task.fitness(metrics)
        if fitness > self.best_fitness or self.best_epoch < 0:
            self.best_fitness, self.best_epoch = fitness, trainer.epoch
        if cfg.patience and trainer.epoch - self.best_epoch >= cfg.patience:
            log.info(f"early stop: no improvement for {cfg.patience} epochs (best epoch {self.best_epoch + 1})")
            trainer.stop = True

    def improved_at(self, epoch: int) -> bool:
        """True when `epoch`'s validation set a new best."""
        return self.best_epoch == epoch

    def state_dict(self) -> dict:
        return {"best_fitness": self.best_fitness, "best_epoch": self.best_epoch}

    def load_state_dict(self, state: dict) -> None:
        self.best_fitness = float(state.get("best_fitness", -1.0))
        self.best_epoch = int(state.get("best_epoch", -1))


PAGE_COST_BOUND = 50


class ResultsHook(Hook):
    """One row per epoch in results.csv: losses, learning rate, the task's metrics, timing,
    skipped steps; results.html (plots.py) after a validation and when training ends.
    `validation` (the run's ValidationHook) supplies the best epoch shown on the page.

    Drawing the page takes 0.1-0.2 s (plotly, a detector's per-class curves), a run of 2-3 s
    epochs would spend a tenth of its time on it: after a validation the page is drawn again
    only when at least PAGE_COST_BOUND times its last drawing has passed since, so it costs at
    most 1/PAGE_COST_BOUND of the run. An epoch of 10 s or more redraws every validation."""

    def __init__(self, validation: ValidationHook | None = None) -> None:
        self.validation = validation
        self.table = ResultsTable()  # the rows so far; every checkpoint holds them (its state)
        self._drawn_at, self._draw_s = -math.inf, 0.0  # when the page was last drawn, and in how long

    def before_train(self, trainer: Run) -> None:
        self._skipped_before = trainer.precision.skipped_steps()  # a resumed run's count carries on
        # A fresh run in a reused directory (`exist_ok=true`) starts its own table; a resumed one
        # keeps the rows of the epochs its checkpoint holds (a row written after that checkpoint
        # would otherwise appear twice), rebuilt from the checkpoint if the file was damaged.
        self.table.start(trainer.run_dir / "results.csv", trainer.start_epoch)

    def before_epoch(self, trainer: Run) -> None:
        self._t0 = time.perf_counter()

    def after_epoch(self, trainer: Run) -> None:
        row = {"epoch": trainer.epoch + 1}
        row.update({f"train/{k}": round(v, 6) for k, v in trainer.epoch_losses().items()})
        row["lr"] = trainer.optimizer.param_groups[0]["lr"]
        fresh = bool(trainer.metrics) and trainer.validated_epoch == trainer.epoch  # blank when not validated
        for key in trainer.task.metrics:
            row[key] = round(trainer.metrics[key], 6) if fresh else ""
        row["seconds"] = round(time.perf_counter() - self._t0, 3)
        row["skipped_steps"] = trainer.precision.skipped_steps()
        self.table.add(trainer.run_dir / "results.csv", row)  # the whole table, atomically
        if fresh and time.perf_counter() - self._drawn_at >= PAGE_COST_BOUND * self._draw_s:
            self._write_page(trainer)
        new_skips = row["skipped_steps"] - self._skipped_before
        self._skipped_before = row["skipped_steps"]
        if new_skips:  # said only for epochs that skipped: the usual early overflows are one line each
            log.info(f"epoch {row['epoch']}: float16 loss scaler skipped {new_skips} steps for overflow "
                     f"({row['skipped_steps']} in all)")

    def after_train(self, trainer: Run) -> None:
        self._write_page(trainer)

    def state_dict(self) -> dict:
        return {"rows": self.table.rows}

    def load_state_dict(self, state: dict) -> None:
        self.table.load(state.get("rows"))

    def _write_page(self, trainer: Run) -> None:
        import plotly.subplots  # noqa: F401  (imported once: not part of what a drawing costs)

        from ..plots import write_results_html

        t0 = time.perf_counter()
        cfg = trainer.cfg
        best = self.validation.best_epoch if self.validation is not None else -1
        meta = {"arch": trainer.arch, "task": trainer.task.name, "data": trainer.data_cfg.name,
                "epoch": f"{trainer.epoch + 1}/{cfg.epochs}", "imgsz": cfg.imgsz, "batch": cfg.batch,
                "best epoch": best + 1 if best >= 0 else None, "run": str(trainer.run_dir)}
        details = trainer.val_details  # from the validation that set trainer.metrics
        write_results_html(trainer.run_dir, trainer.task, {**trainer.metrics, **details} if details else None, meta)
        self._drawn_at = time.perf_counter()
        self._draw_s = self._drawn_at - t0


class CheckpointHook(Hook):
    """last.pt every epoch, best.pt when `validation` (the run's ValidationHook) saw a new best
    this epoch, epochN.pt every `save_period` epochs. Runs after the validation hook. With
    `checkpoint_steps`, last.pt also after every N-th optimizer step (the trainer says when:
    `checkpoint_step`), so last.pt is always the run's latest state. The files are written on the
    trainer's checkpoint thread, which the trainer waits for before `after_train` (and before it
    names the last good state of a failed run)."""

    def __init__(self, validation: ValidationHook | None = None) -> None:
        self.validation = validation

    def after_step(self, trainer: Run) -> None:
        if trainer.checkpoint_step is not None:
            trainer.save_in_background(trainer.run_dir / "weights" / "last.pt")

    def after_epoch(self, trainer: Run) -> None:
        weights = trainer.run_dir / "weights"
        paths = [weights / "last.pt"]
        if self.validation is not None and self.validation.improved_at(trainer.epoch):
            paths.append(weights / "best.pt")
        period = trainer.cfg.save_period
        if period > 0 and (trainer.epoch + 1) % period == 0:
            paths.append(weights / f"epoch{trainer.epoch + 1}.pt")
        trainer.save_in_background(*paths)


def _rate(img_s: float) -> str:
    """Three significant figures, never rounded to 0: a CPU at 640 px trains at ~0.5 img/s."""
    return f"{img_s:.3g}" if img_s < 100 else f"{img_s:.0f}"


def default_hooks() -> list[Hook]:
    """What every training run has, in calling order: validation (and the best epoch) first, so
    the results table and the checkpoints of an epoch see its validation."""

    validation = ValidationHook()
    # The guard stops a run whose directory was deleted under it before anything is written there.
    return [validation, RunDirGuard(), ResultsHook(validation), CheckpointHook(validation), ProgressHook()]
