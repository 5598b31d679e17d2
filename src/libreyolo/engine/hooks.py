"""Trainer hooks: logging, validation, results.csv and checkpoints are hooks, not loop code.

Call sequence (the trainer calls every hook in list order):

    before_train
    for each epoch:   before_epoch
        for each step:    before_step, <step>, after_step
                      after_epoch
    after_train

`before_step` and `after_step` run every step: keep them cheap (no host sync; the trainer reads
the loss back once per log interval and exposes it as `trainer.last_log`). A hook may remove
itself with `trainer.remove_hook(self)`.
"""

from __future__ import annotations

import csv
import logging
import sys
import time
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

if TYPE_CHECKING:
    from .trainer import Trainer

log = logging.getLogger("libreyolo")


class Hook:
    def before_train(self, trainer: Trainer) -> None: ...
    def before_epoch(self, trainer: Trainer) -> None: ...
    def before_step(self, trainer: Trainer) -> None: ...
    def after_step(self, trainer: Trainer) -> None: ...
    def after_epoch(self, trainer: Trainer) -> None: ...
    def after_train(self, trainer: Trainer) -> None: ...
    def state_dict(self) -> dict: return {}
    def load_state_dict(self, state: dict) -> None: ...


class ProgressHook(Hook):
    """A rich progress bar per epoch (loss items, img/s, GPU memory) on a TTY; one line per epoch otherwise."""

    def __init__(self, stream=None):
        self.console = Console(file=stream or sys.stderr)
        self.live = self.console.is_terminal
        self.progress: Progress | None = None
        self._task = None
        self._shown_log = None

    def before_epoch(self, trainer: Trainer) -> None:
        self._t0 = time.perf_counter()
        if not self.live:
            return
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                                 TextColumn("{task.completed}/{task.total}"), TextColumn("{task.fields[info]}"),
                                 TimeElapsedColumn(), TimeRemainingColumn(), console=self.console, transient=False)
        self.progress.start()
        self._task = self.progress.add_task(f"epoch {trainer.epoch + 1}/{trainer.cfg.epochs}",
                                            total=trainer.steps_per_epoch, info="")

    def after_step(self, trainer: Trainer) -> None:
        if self.progress is None:
            return
        info = None
        if trainer.last_log is not self._shown_log:  # refresh text only when new figures exist
            self._shown_log = trainer.last_log
            info = _format_log(trainer)
        self.progress.update(self._task, advance=1, **({"info": info} if info is not None else {}))

    def after_epoch(self, trainer: Trainer) -> None:
        if self.progress is not None:
            self.progress.update(self._task, info=_format_log(trainer))
            self.progress.stop()
            self.progress = None
        else:
            self.console.print(f"epoch {trainer.epoch + 1}/{trainer.cfg.epochs}  {_format_log(trainer)}  "
                               f"{time.perf_counter() - self._t0:.1f}s", highlight=False, soft_wrap=True)


def _format_log(trainer: Trainer) -> str:
    parts = [f"{k} {v:.4g}" for k, v in trainer.epoch_losses().items()]
    if trainer.last_log:
        parts.append(f"{trainer.last_log['img_s']:.0f} img/s")
        if trainer.last_log.get("mem_gb"):
            parts.append(f"{trainer.last_log['mem_gb']:.1f}G")
    metrics = trainer.metrics
    if metrics:
        parts.append(f"mAP50-95 {metrics['map50_95']:.4f} mAP50 {metrics['map50']:.4f}")
    return "  ".join(parts)


DETAIL_KEYS = ("per_class", "curves")  # evaluate()'s non-scalar results (eval/details.py)


class ValidationHook(Hook):
    """Validate the EMA weights every `eval_interval` epochs and after the last; early stopping."""

    def after_epoch(self, trainer: Trainer) -> None:
        cfg = trainer.cfg
        last = trainer.epoch + 1 == cfg.epochs
        if not cfg.val or not (last or (trainer.epoch + 1) % cfg.eval_interval == 0):
            return
        metrics = trainer.validate()
        # The per-class rows and curves feed results.html (ResultsHook); trainer.metrics stays the
        # scalar figures that checkpoints, results.csv and `train --json` carry.
        trainer.val_details = {k: metrics.pop(k) for k in DETAIL_KEYS if k in metrics}
        trainer.metrics = metrics
        trainer.validated_epoch = trainer.epoch
        fitness = 0.9 * trainer.metrics["map50_95"] + 0.1 * trainer.metrics["map50"]
        if fitness > trainer.best_fitness or trainer.best_epoch < 0:
            trainer.best_fitness, trainer.best_epoch = fitness, trainer.epoch
            trainer.improved = True
        if cfg.patience and trainer.epoch - trainer.best_epoch >= cfg.patience:
            log.info(f"early stop: no improvement for {cfg.patience} epochs (best epoch {trainer.best_epoch + 1})")
            trainer.stop = True


class ResultsHook(Hook):
    """One row per epoch in results.csv: losses, learning rate, metrics, timing, skipped steps;
    results.html (plots.py) after every validation and when training ends."""

    def before_train(self, trainer: Trainer) -> None:
        self._skipped_before = trainer.precision.skipped_steps()  # a resumed run's count carries on
        path = trainer.run_dir / "results.csv"
        if path.exists():
            # A fresh run in a reused directory (`exist_ok=true`) starts its own table; a resumed
            # one keeps the rows of the epochs its checkpoint holds (a row written after that
            # checkpoint would otherwise appear twice).
            with path.open(newline="") as f:
                rows = list(csv.reader(f))
            kept = [r for r in rows[1:] if r and r[0].isdigit() and int(r[0]) <= trainer.start_epoch]
            if not kept:
                path.unlink()
                return
            tmp = path.with_suffix(".csv.tmp")
            with tmp.open("w", newline="") as f:
                csv.writer(f).writerows(rows[:1] + kept)
            tmp.replace(path)

    def before_epoch(self, trainer: Trainer) -> None:
        self._t0 = time.perf_counter()

    def after_epoch(self, trainer: Trainer) -> None:
        row = {"epoch": trainer.epoch + 1}
        row.update({f"train/{k}": round(v, 6) for k, v in trainer.epoch_losses().items()})
        row["lr"] = trainer.optimizer.param_groups[0]["lr"]
        fresh = bool(trainer.metrics) and trainer.validated_epoch == trainer.epoch  # blank when not validated
        row["map50_95"] = round(trainer.metrics["map50_95"], 6) if fresh else ""
        row["map50"] = round(trainer.metrics["map50"], 6) if fresh else ""
        row["seconds"] = round(time.perf_counter() - self._t0, 3)
        row["skipped_steps"] = trainer.precision.skipped_steps()
        path = trainer.run_dir / "results.csv"
        new = not path.exists()
        with path.open("a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(row))
            if new:
                writer.writeheader()
            writer.writerow(row)
        if fresh:  # new curves to show: a long run's page is never older than its last validation
            self._write_page(trainer)
        new_skips = row["skipped_steps"] - self._skipped_before
        self._skipped_before = row["skipped_steps"]
        if new_skips:  # said only for epochs that skipped: the usual early overflows are one line each
            log.info(f"epoch {row['epoch']}: float16 loss scaler skipped {new_skips} steps for overflow "
                     f"({row['skipped_steps']} in all)")

    def after_train(self, trainer: Trainer) -> None:
        self._write_page(trainer)

    @staticmethod
    def _write_page(trainer: Trainer) -> None:
        from ..plots import write_results_html

        cfg = trainer.cfg
        meta = {"arch": f"{trainer.family.name}-{trainer.size}", "data": trainer.data_cfg.name,
                "epoch": f"{trainer.epoch + 1}/{cfg.epochs}", "imgsz": cfg.imgsz, "batch": cfg.batch,
                "best epoch": trainer.best_epoch + 1 if trainer.best_epoch >= 0 else None,
                "run": str(trainer.run_dir)}
        write_results_html(trainer.run_dir, getattr(trainer, "val_details", None), meta)


class CheckpointHook(Hook):
    """last.pt every epoch, best.pt on improvement, epochN.pt every `save_period` epochs."""

    def after_epoch(self, trainer: Trainer) -> None:
        weights = trainer.run_dir / "weights"
        trainer.save(weights / "last.pt")
        if trainer.improved:
            trainer.save(weights / "best.pt")
            trainer.improved = False
        period = trainer.cfg.save_period
        if period > 0 and (trainer.epoch + 1) % period == 0:
            trainer.save(weights / f"epoch{trainer.epoch + 1}.pt")
