"""TensorBoard and MLflow: a run's figures where a team already watches its runs.

Both are hooks (hooks.py) that `logger_hooks(cfg)` adds after the run's own, so at an epoch's end
they see its validation, its results.csv row and (with profile=true) the profiler's files. Per
epoch, at step = the epoch number (1-based, as in results.csv), `epoch_figures` gives both:

- `train/<item>`: each loss item's mean over the epoch;
- `metrics/<key>`: the task's metrics (mAP50-95, mAP50, top-1, ...), on epochs that validated;
- `lr/<group>`: every optimizer group's learning rate at the epoch's end, by the group's name;
- `speed/img_s`: training images per second over the epoch's step loop (data wait included), and
  `speed/step_ms`, that loop's mean step;
- `memory/gpu_reserved_gb`: the most the CUDA caching allocator has reserved (CUDA only).

With profile=true the profiler's verdict, its reason and its lever (profile_summary.json) go in as
text once the window is written. Neither logger can end a run: a failing write or an unreachable
tracking server is one warning line, and training goes on without that logger.

- TensorBoard (`tensorboard=auto|true|false`; auto: on when the package is installed, and the start
  says which): event files in the run directory itself, so `tensorboard --logdir runs/train` shows
  every run. The writer opens at the first epoch's end (a run that fails earlier leaves no event
  file); a resumed run purges the steps after its checkpoint.
- MLflow (`mlflow=true`): the tracking URI in MLFLOW_TRACKING_URI, else a file store `mlruns/` in
  the working directory; the experiment MLFLOW_EXPERIMENT_NAME, else `libreyolo`; one MLflow run
  per run directory (named after it; a resume goes on logging into the same MLflow run). Params:
  every config key. After training: results.html, results.csv, args.yaml, weights/best.pt and
  profile_summary.json as artifacts, and the run marked finished.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from .hooks import Hook

if TYPE_CHECKING:
    from .trainer import Trainer

log = logging.getLogger("libreyolo")

INSTALL = {"tensorboard": "pip install 'libreyolo[tensorboard]'", "mlflow": "pip install 'libreyolo[mlflow]'"}


def installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def logger_hooks(cfg) -> list[Hook]:
    """What reports on a run beyond its own files: the dataset's one-line verdict at the start,
    then the loggers `cfg` asks for. A logger asked for by name (true) but not installed is one
    ConfigError line, before the run directory exists."""
    hooks: list[Hook] = [DataVerdictHook()]
    if cfg.tensorboard is True and not installed("tensorboard"):
        raise ConfigError(f"tensorboard=true: the tensorboard package is not installed ({INSTALL['tensorboard']})")
    if cfg.tensorboard is True or (cfg.tensorboard == "auto" and installed("tensorboard")):
        hooks.append(TensorBoardHook(auto=cfg.tensorboard == "auto"))
    elif cfg.tensorboard == "auto":
        log.info(f"tensorboard: off (tensorboard=auto, and the package is not installed: {INSTALL['tensorboard']})")
    if cfg.mlflow:
        if not installed("mlflow"):
            raise ConfigError(f"mlflow=true: the mlflow package is not installed ({INSTALL['mlflow']})")
        hooks.append(MLflowHook())
    return hooks


def epoch_figures(trainer: Trainer) -> dict[str, float]:
    """This epoch's figures under the keys both loggers use (the module doc lists them)."""
    out = {f"train/{k}": float(v) for k, v in trainer.epoch_losses().items()}
    if trainer.metrics and trainer.validated_epoch == trainer.epoch:
        out.update({f"metrics/{k}": float(trainer.metrics[k]) for k in trainer.task.metrics if k in trainer.metrics})
    for i, group in enumerate(trainer.optimizer.param_groups):
        out[f"lr/{group.get('name', i)}"] = float(group["lr"])
    seconds = trainer.clock.epochs[-1] if trainer.clock.epochs else 0.0
    steps = trainer.batch_index + 1
    if seconds > 0:
        images = min(steps * trainer.cfg.batch, trainer.train_loader.num_images)
        out["speed/img_s"] = images / seconds
        out["speed/step_ms"] = 1000 * seconds / steps
    mem = (trainer.last_log or {}).get("mem_gb")
    if mem:
        out["memory/gpu_reserved_gb"] = float(mem)
    return out


def profile_verdict(trainer: Trainer) -> dict[str, Any] | None:
    """The profiler's summary once this run has written it (a reused run directory's older one
    does not count), else None."""
    if not trainer.cfg.profile or trainer.run_dir is None:
        return None
    path = Path(trainer.run_dir) / "profile_summary.json"
    try:
        if path.stat().st_mtime < trainer.clock.created_unix:
            return None
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def verdict_text(summary: dict[str, Any]) -> str:
    return (f"**{summary.get('verdict')}**: {summary.get('reason')}\n\nlever: {summary.get('lever')}\n\n"
            f"step {summary.get('step_ms_mean', 0):.1f} ms, utilisation {summary.get('utilisation', 0):.2f}")


class DataVerdictHook(Hook):
    """`libreyolo data check`'s one-line verdict at the start of training, from what the loaders'
    scan read (labels and header sizes: nothing more is read). Detection datasets only."""

    def before_train(self, trainer: Trainer) -> None:
        from ..data.check import quick_report
        from ..data.labels import Split

        loaders = {"train": trainer.train_loader, "val": trainer.val_loader}
        splits = {s: getattr(getattr(ld, "dataset", None), "split", None) for s, ld in loaders.items()}
        splits = {s: v for s, v in splits.items() if isinstance(v, Split)}
        if "train" in splits:
            report = quick_report(trainer.data_cfg.name, list(trainer.data_cfg.names), splits, int(trainer.cfg.imgsz))
            (log.info if report["ok"] else log.warning)(report["verdict"])


class _Logger(Hook):
    """What both loggers share: a failure is one warning line, and the logger leaves the run."""

    name = ""

    def _failed(self, trainer: Trainer, what: str, exc: BaseException) -> None:
        if os.environ.get("LIBREYOLO_DEBUG"):
            raise exc
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        log.warning(f"{self.name}: {what} failed ({type(exc).__name__}: {first}); training goes on without {self.name}")
        self._close()
        if self in trainer.hooks:
            trainer.remove_hook(self)

    def _close(self) -> None: ...


class TensorBoardHook(_Logger):
    name = "tensorboard"

    def __init__(self, auto: bool = False) -> None:
        self.auto = auto
        self.writer = None
        self.profile_logged = False

    def before_train(self, trainer: Trainer) -> None:
        why = "tensorboard=auto and the package is installed; tensorboard=false turns it off" if self.auto \
            else "tensorboard=true"
        log.info(f"tensorboard: event files in {trainer.run_dir} ({why}; view: tensorboard --logdir "
                 f"{Path(trainer.run_dir).parent})")

    def after_epoch(self, trainer: Trainer) -> None:
        try:
            writer = self._writer(trainer)
            step = trainer.epoch + 1
            for key, value in epoch_figures(trainer).items():
                writer.add_scalar(key, value, step)
            self._profile(trainer, writer, step)
            writer.flush()
        except Exception as exc:  # never let a dashboard end a training run
            self._failed(trainer, "writing the event file", exc)

    def after_train(self, trainer: Trainer) -> None:
        if self.writer is None:
            return
        try:
            self._profile(trainer, self.writer, trainer.epoch + 1)
        except Exception as exc:
            self._failed(trainer, "writing the event file", exc)
        self._close()

    def _writer(self, trainer: Trainer):
        if self.writer is None:
            from torch.utils.tensorboard import SummaryWriter

            # A resume purges what an interrupted attempt wrote after the checkpoint's epoch.
            purge = trainer.start_epoch + 1 if trainer.start_epoch else None
            self.writer = SummaryWriter(log_dir=str(trainer.run_dir), purge_step=purge)
        return self.writer

    def _profile(self, trainer: Trainer, writer, step: int) -> None:
        if self.profile_logged:
            return
        summary = profile_verdict(trainer)
        if summary is None:
            return
        writer.add_text("profile/verdict", verdict_text(summary), step)
        for key in ("step_ms_mean", "utilisation", "data_wait_frac"):
            if isinstance(summary.get(key), (int, float)):
                writer.add_scalar(f"profile/{key}", float(summary[key]), step)
        self.profile_logged = True

    def _close(self) -> None:
        if self.writer is not None:
            with contextlib.suppress(Exception):
                self.writer.close()
            self.writer = None


# MLflow retries an unreachable server 7 times with growing waits (minutes); a run waits for no
# dashboard that long. The user's own settings of these win.
BOUNDED = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "0.5",
           "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
ARTIFACTS = ("results.html", "results.csv", "args.yaml", "weights/best.pt", "profile_summary.json")


@contextlib.contextmanager
def _bounded_requests():
    added = [k for k in BOUNDED if k not in os.environ]
    os.environ.update({k: BOUNDED[k] for k in added})
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


def tracking_uri() -> str:
    """MLFLOW_TRACKING_URI, else a file store mlruns/ in the working directory."""
    return os.environ.get("MLFLOW_TRACKING_URI") or (Path.cwd() / "mlruns").as_uri()


class MLflowHook(_Logger):
    name = "mlflow"

    def __init__(self) -> None:
        self.client = None
        self.run_id: str | None = None
        self.profile_logged = False

    def state_dict(self) -> dict:
        return {"run_id": self.run_id} if self.run_id else {}

    def load_state_dict(self, state: dict) -> None:
        self.run_id = state.get("run_id") or None

    def before_train(self, trainer: Trainer) -> None:
        uri = tracking_uri()
        try:
            with _bounded_requests():
                self._start(trainer, uri)
        except Exception as exc:
            self._failed(trainer, f"connecting to the tracking server at {uri}", exc)

    def _start(self, trainer: Trainer, uri: str) -> None:
        from mlflow import MlflowClient
        from mlflow.entities import Param, RunTag

        if uri.startswith("file:") or "://" not in uri:
            # MLflow 3 refuses a file store unless asked for one; here the user asked (or it is the default).
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        client = MlflowClient(tracking_uri=uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "libreyolo"
        resumed = False
        if self.run_id is not None:
            try:
                client.get_run(self.run_id)
                resumed = True
            except Exception:  # another tracking store than the first attempt's: a new MLflow run
                self.run_id = None
        if not resumed:
            exp = client.get_experiment_by_name(name)
            exp_id = exp.experiment_id if exp is not None else client.create_experiment(name)
            run = client.create_run(exp_id, run_name=Path(trainer.run_dir).name,
                                    tags={"libreyolo.run_dir": str(Path(trainer.run_dir).resolve()),
                                          "libreyolo.arch": trainer.arch, "libreyolo.data": trainer.data_cfg.name})
            self.run_id = run.info.run_id
            params = [Param(k, _param(v)) for k, v in trainer.cfg.to_dict().items()]
            params.append(Param("classes", str(len(trainer.data_cfg.names))))
            for i in range(0, len(params), 100):  # MLflow takes at most 100 params per request
                client.log_batch(self.run_id, params=params[i:i + 100])
        else:
            client.log_batch(self.run_id, tags=[RunTag("libreyolo.resumed_at_epoch", str(trainer.start_epoch + 1))])
        self.client = client
        log.info(f"mlflow: {'resuming' if resumed else 'logging'} run {self.run_id} ({Path(trainer.run_dir).name}) "
                 f"in experiment {name} at {uri}")

    def after_epoch(self, trainer: Trainer) -> None:
        from mlflow.entities import Metric

        now, step = int(time.time() * 1000), trainer.epoch + 1
        metrics = [Metric(k, v, now, step) for k, v in epoch_figures(trainer).items()]
        try:
            with _bounded_requests():
                self.client.log_batch(self.run_id, metrics=metrics)
                self._profile(trainer)
        except Exception as exc:
            self._failed(trainer, "logging the epoch's metrics", exc)

    def after_train(self, trainer: Trainer) -> None:
        run_dir = Path(trainer.run_dir)
        try:
            with _bounded_requests():
                self._profile(trainer)
                for rel in ARTIFACTS:
                    if (run_dir / rel).is_file():
                        self.client.log_artifact(self.run_id, str(run_dir / rel),
                                                 artifact_path=str(Path(rel).parent) if "/" in rel else None)
                finished = trainer.stop or trainer.epoch + 1 >= trainer.cfg.epochs
                self.client.set_terminated(self.run_id, "FINISHED" if finished else "FAILED")
        except Exception as exc:
            self._failed(trainer, "logging the artifacts", exc)

    def _profile(self, trainer: Trainer) -> None:
        from mlflow.entities import RunTag

        summary = None if self.profile_logged else profile_verdict(trainer)
        if summary is None:
            return
        self.client.log_batch(self.run_id, tags=[RunTag("profile.verdict", str(summary.get("verdict"))),
                                                 RunTag("profile.lever", str(summary.get("lever"))[:5000])])
        self.client.log_text(self.run_id, verdict_text(summary), "profile_verdict.md")
        self.profile_logged = True


def _param(value: Any) -> str:
    return "none" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
