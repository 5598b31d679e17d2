"""The LibreYOLO facade: resolve a model name, then `.train()`, `.val()`, `.predict()`, `.export()`.

Model names follow four rules, in order (the CLI's `model=` uses the same):
1. an existing file is a LibreYOLO checkpoint and is loaded;
2. an official weights name (`LibreYOLO9s.pt`) that is absent is downloaded from
   `$LIBREYOLO_WEIGHTS_URL/<name>` into the cache; if that is impossible the model is built from
   scratch with one warning line saying exactly that;
3. an architecture name (`yolo9-t`, `YOLOv9-t`, `yolo9t`) builds from scratch, silently;
4. anything else is a one-line error. An architecture is never guessed from a file name.

resolve.py applies them (`resolve_model`, re-exported here) and says what inference takes from a
checkpoint; this module runs what a resolved model does.
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from .atomic import check_writable
from .config import FIELDS, VAL_KEYS, TrainConfig, build_config
from .errors import CheckpointError, ConfigError, DataError
from .families import arch_name, get_family
from .families.base import FamilySpec
from .logs import checking_inputs, ensure_logging
from .resolve import INFERENCE_KEYS, ORIGIN, ModelSource, arch_of, fetch_weights, inference_args, resolve_model
from .tasks import task_for

log = logging.getLogger("libreyolo")

# Keys that may change when resuming; every other key comes from the checkpoint's config.
# A run may resume on another number of devices (checkpoints hold the plain module), and with or
# without CUDA graphs (graphed training equals eager; the OOM line suggests cuda_graph=false).
RESUME_KEYS = {"resume", "device", "workers", "cache", "exist_ok", "log_interval", "sync_bn", "ddp_timeout",
               "checkpoint_steps", "tensorboard", "mlflow", "cuda_graph"}


class LibreYOLO:
    """`LibreYOLO("LibreYOLO9s.pt")` or `LibreYOLO("yolo9-t")`; then `.train(data=...)`, `.val(data=...)`,
    `.predict(source)`, `.export(format="onnx")`."""

    def __init__(self, model: str):
        ensure_logging()  # a script sees the lines the CLI prints (logs.py)
        self.name = model
        self.source = resolve_model(model)

    @property
    def arch(self) -> str:
        return self.source.arch

    def train(self, data: str | None = None, *, hooks: list | None = None, **overrides: Any):
        """Train; returns a TrainResult (metrics, run_dir, best, last, timings, task).

        `hooks`: extra `engine.hooks.Hook` objects, called after the run's own (validation,
        results, checkpoints, progress, and the profiler's with profile=true), on rank 0 only."""
        from .engine import distributed, elastic
        from .engine.builder import build_model, seed_everything
        from .engine.device import select_device
        from .engine.rundir import train_in_new_run_dir
        from .engine.trainer import Trainer

        distributed.quiet_other_ranks()  # under torchrun, rank 0 alone logs
        user = self._train_keys(data, overrides)
        resume = user.get("resume", False)
        if resume not in (False, None, "", "false"):
            return self._resume(user, hooks)
        task = task_for(self.source.spec, user.get("task"))
        if not user.get("data"):
            raise ConfigError(f"no dataset given: pass data=NAME ({task.data_help})")
        cfg = build_config(user, self.source.defaults)
        check_writable(cfg.project, "project folder", folder=True)  # before the data is read
        device = select_device(cfg.device)
        distributed.join(cfg, device)
        elastic.shared_store_notice()
        # Started again by torchrun (--max-restarts): go on with the run the first attempt made.
        previous = elastic.previous_attempt(cfg.project, cfg.name)
        if previous is not None and previous.finished:  # only its processes' exit was cut short
            return previous.result(task.name)
        if previous is not None and previous.checkpoint is not None:
            kept = {k: user[k] for k in RESUME_KEYS if k in user}
            return self._resume({**kept, "resume": str(previous.checkpoint)}, hooks)
        data_cfg = task.load_data(cfg.data)
        seed_everything(cfg.seed, cfg.deterministic)  # before building: the initial weights are seeded too
        model = build_model(self.source, len(data_cfg.names), pretrained=fetch_weights)
        with checking_inputs():
            # The trainer scans the labels and images and builds the loaders: every check of the
            # inputs runs before the run directory exists, so a command that fails on them writes
            # nothing.
            trainer = Trainer(cfg, self.source.spec, self.source.size, model, data_cfg, None, device, task=task,
                              hooks=run_hooks(cfg, hooks), explicit=frozenset(user))
            check_batch(cfg.batch, trainer.train_loader.num_images, data_cfg.name)
            if cfg.nbs < cfg.batch:
                log.info(f"nbs={cfg.nbs} is below batch={cfg.batch}: no gradient accumulation (one optimizer "
                         f"step per batch) and weight decay scaled by batch/nbs = {cfg.batch / cfg.nbs:.3g}")
        return train_in_new_run_dir(trainer, cfg, previous.run_dir if previous is not None else None)

    def _train_keys(self, data: str | None, overrides: dict[str, Any]) -> dict[str, Any]:
        user = dict(overrides)
        if data is not None:
            user["data"] = data
        user["model"] = self.name
        for key in user:
            if key not in FIELDS:
                from .config import unknown_key_message
                raise ConfigError(unknown_key_message(key))
        return user

    def _resume(self, user: dict[str, Any], hooks: list | None = None):
        from .engine import distributed
        from .engine.checkpoint import check_resumable, load_checkpoint
        from .engine.device import select_device
        from .engine.resume_data import check_counts, check_names, load_resume_data, moved_data
        from .engine.rundir import resume_in_run_dir
        from .engine.state import mid_epoch
        from .engine.trainer import Trainer

        distributed.quiet_other_ranks()
        resume = user["resume"]
        if resume is True or resume == "true":
            path = self.source.path if self.source.path is not None else _latest_last(user)
        else:
            path = Path(str(resume))

        def read() -> dict[str, Any]:
            ckpt = load_checkpoint(path)
            check_resumable(ckpt, path)
            return ckpt

        # After an elastic restart the group is already joined: rank 0 reads the checkpoint (its
        # node holds the run directory) and the others receive it. A resume typed by hand is read
        # by every process before the group exists: its path must be there on every node.
        ckpt = distributed.from_rank0(read)
        spec, size = self._resumed_arch(ckpt, path)
        changed = sorted(k for k in user if k not in RESUME_KEYS | {"model", "data"}
                         and user[k] != ckpt["config"].get(k))
        if changed:
            raise ConfigError(f"cannot change {', '.join(changed)} when resuming (only "
                              f"{', '.join(sorted(RESUME_KEYS - {'resume'}))} may change)")
        saved = {k: v for k, v in ckpt["config"].items() if k in FIELDS}
        saved.update({k: user[k] for k in RESUME_KEYS if k in user})
        moved = moved_data(user, ckpt)  # data= naming the same dataset in a new place (checked below)
        if moved is not None:
            saved["data"] = moved
        saved["resume"] = str(path)
        cfg = build_config(saved)
        if int(ckpt["epoch"]) + 1 >= cfg.epochs and mid_epoch(ckpt) is None:
            raise ConfigError(f"'{path}' finished all {cfg.epochs} epochs; nothing to resume")
        device = select_device(cfg.device)
        distributed.join(cfg, device)
        task = task_for(spec, cfg.task)
        data_cfg = load_resume_data(task, cfg.data, moved is not None, path)
        if moved is not None:
            check_names(ckpt, data_cfg, moved, path)
        if len(ckpt["names"]) != data_cfg.nc:
            raise CheckpointError(f"cannot resume '{path}': it was trained on {len(ckpt['names'])} classes but "
                                  f"dataset '{data_cfg.name}' has {data_cfg.nc}")
        model = spec.build(size, len(ckpt["names"]))
        for part in ("model", "ema"):
            if ckpt.get(part) is not None:
                _check_fits(model, ckpt[part], path, part, arch_name(spec, size))
        run_dir = path.resolve().parent.parent
        with checking_inputs():
            trainer = Trainer(cfg, spec, size, model, data_cfg, run_dir, device, task=task,
                              hooks=run_hooks(cfg, hooks), resume=ckpt)
            check_batch(cfg.batch, trainer.train_loader.num_images, data_cfg.name)
            if moved is not None:
                check_counts(ckpt, trainer, moved, path)
        return resume_in_run_dir(trainer, path)  # under the run directory's lock

    def _resumed_arch(self, ckpt: dict, path: Path) -> tuple[FamilySpec, str]:
        """The checkpoint's (family, size); a model= naming another architecture is refused, not
        silently swapped for the checkpoint's."""
        spec = get_family(ckpt["family"])
        size = ckpt["size"]
        if size not in spec.sizes:
            raise CheckpointError(f"'{path}' names size '{size}' unknown to {spec.display}")
        arch = arch_name(spec, size)
        if self.arch != arch:
            raise ConfigError(f"'{path}' is a {arch} checkpoint but model={self.name} is {self.arch}: a resume "
                              f"continues its checkpoint's model (drop model=, or train {self.name} without resume=)")
        if self.source.path is not None and self.source.path.resolve() != path.resolve():
            log.info(f"resuming {path}: the weights of model={self.name} are not used")
        return spec, size

    def val(self, data: str | None = None, *, save_json: str | os.PathLike | None = None,
            **overrides: Any) -> dict[str, Any]:
        """Validate on a dataset's val split; returns the task's metrics (detection: 'map50_95',
        'map50', 'precision', 'recall', 'num_images', 'num_dets', 'per_class', 'curves';
        classification: 'top1', 'top5', 'loss', 'num_images', 'per_class') with 'imgsz', 'data'
        and 'task', and prints the per-class table on stderr.

        A checkpoint validates at the size it was trained at, on the dataset it was trained on,
        unless `imgsz=`/`data=` are given (`inference_args`); a log line says what was used.
        `save_json` (detectors): also write the detections there as a COCO results json, under the
        dataset's own image and category ids ('saved_json' in the result)."""
        from .engine.builder import build_model
        from .engine.device import out_of_memory_as_error, select_device
        from .engine.precision import Precision

        user = dict(overrides)
        if data is not None:
            user["data"] = data
        for key in user:
            if key not in VAL_KEYS:
                from .config import unknown_key_message
                raise ConfigError(unknown_key_message(key, VAL_KEYS))
        trained, origin = inference_args(self.source, user)
        user.update(trained)
        ckpt = self.source.checkpoint
        task = task_for(self.source.spec, (ckpt or {}).get("task"))
        if not user.get("data"):
            raise ConfigError(f"no dataset given: pass data=NAME ({task.data_help})")
        if save_json is not None and task.name != "detect":
            raise ConfigError(f"save_json: COCO results are boxes; a {task.display} model has none")
        if save_json is not None:  # before the validation, not after it
            check_writable(save_json, "save_json file")
        user.setdefault("model", self.name)
        cfg = build_config(user, self.source.defaults)
        device = select_device(cfg.device)
        try:
            data_cfg = task.load_data(cfg.data)
        except DataError as exc:
            if origin["data"] != "checkpoint":
                raise
            raise DataError(f"{exc} (the dataset {self.source.path} was trained on; pass data= to choose "
                            f"another)") from None
        if ckpt is not None and len(ckpt["names"]) != len(data_cfg.names):
            raise DataError(f"model was trained on {len(ckpt['names'])} classes but dataset "
                            f"'{data_cfg.name}' has {len(data_cfg.names)}")
        with checking_inputs():
            if ckpt is None:
                log.warning(f"validating {self.arch} with random weights (no checkpoint given)")
            model = build_model(self.source, len(data_cfg.names), exact=True).to(device).eval()
            precision = Precision.create(cfg.amp, cfg.amp_dtype, device)
            # One pass over the images: a cache (cache=auto's RAM) would only hold them in memory.
            loader = task.val_loader(data_cfg, replace(cfg, cache=False))
        used = ", ".join(f"{k} {getattr(cfg, k)} ({ORIGIN[origin[k]]})" for k in INFERENCE_KEYS)
        log.info(f"validating {self.arch}: {used}; {loader.num_images} val images on {device}; "
                 f"precision: {precision.describe()}")
        with out_of_memory_as_error(cfg, device):
            metrics = task.evaluate(model, loader, device, cfg, amp_dtype=precision.dtype, names=data_cfg.names,
                                    progress=True, **({"save_json": save_json} if save_json is not None else {}))
        task.report(metrics)
        if save_json is not None:
            log.info(f"COCO results: {metrics['num_dets']} detections in {metrics['saved_json']}")
        return {**metrics, "imgsz": cfg.imgsz, "data": cfg.data, "task": task.name}


    def predict(self, source: Any, *, stream: bool = False, **options: Any):
        """Predict on `source`: an image file, a folder, a glob, a video file, a numpy array (HWC
        RGB uint8), a tensor (CHW), a PIL image, or a list of these. Returns a list of
        `predict.Result` (one per image or video frame; boxes in original pixels), or with
        `stream=True` a generator of them (a long video without holding every result).

        Options (`predict.options.KEYS`): conf=0.25, iou=0.7, imgsz (the checkpoint's), max_det=300,
        batch=1, device, amp, amp_dtype, cuda_graph, save=False (annotated files into
        project/name), project, name, exist_ok, vid_stride, workers; and `multi_label` (a
        candidate per class above conf, as validation does) and `progress` (a bar on a terminal).
        The model is kept for the next call with the same imgsz, batch, device, amp, amp_dtype and
        cuda_graph (one setting at a time: another replaces it)."""
        from .predict.core import predict as run
        from .predict.options import check_options

        opts = check_options({"save": False, **options})
        results = run(self._predictor, source, opts)
        return results if stream else list(results)

    def _predictor(self, opts: dict[str, Any]):
        from .predict.core import Predictor

        setting = tuple(opts[k] for k in ("imgsz", "batch", "device", "amp", "amp_dtype", "cuda_graph"))
        cached = getattr(self, "_predictors", {})
        if setting not in cached:
            cached.clear()  # one model in memory: a new setting replaces the last
            cached[setting] = Predictor(self.source, imgsz=opts["imgsz"], batch=opts["batch"], device=opts["device"],
                                        amp=opts["amp"], amp_dtype=opts["amp_dtype"], cuda_graph=opts["cuda_graph"],
                                        workers=opts["workers"])
            self._predictors = cached
            log.info(f"predicting with {cached[setting].describe()}")
        cached[setting].workers = int(opts["workers"])  # threads only: no rebuild
        return cached[setting]

    def export(self, **options: Any):
        """Export for deployment (docs/export.md): format='onnx' (default) or 'pt2', imgsz, batch,
        dynamic, opset, device, output, check. Returns an `export.ExportResult` (its `.path`)."""
        from .export import export_model

        return export_model(self.name, **options)


def check_batch(batch: int, images: int, data_name: str) -> None:
    """A batch larger than the training set cannot be meant: every epoch would be one short batch."""
    if batch > images:
        raise ConfigError(f"batch={batch} is larger than the {images} usable training images of "
                          f"'{data_name}': lower batch to {images} or less")


def run_hooks(cfg: TrainConfig, extra: list | None = None) -> list:
    """A run's hooks, in calling order: the defaults (engine/hooks.py), the profiler's when
    cfg.profile (unless the caller brings its own, as `libreyolo profile run` does), the data
    verdict and the loggers (engine/loggers.py), then the caller's."""
    from .engine.hooks import Hook, default_hooks
    from .engine.loggers import logger_hooks
    from .profiler.window import ProfilerHook, profiler_hooks

    extra = list(extra or [])
    for hook in extra:
        if not isinstance(hook, Hook):
            raise ConfigError(f"hooks=: {type(hook).__name__} is not an engine.hooks.Hook")
    own = [] if any(isinstance(h, ProfilerHook) for h in extra) else profiler_hooks(cfg)
    return [*default_hooks(), *own, *logger_hooks(cfg), *extra]


def _check_fits(model, state: Any, path: Path, part: str, arch: str) -> None:
    """The checkpoint's `part` weights load into `model` exactly, else one CheckpointError line
    (instead of load_state_dict's many)."""
    import torch

    own = model.state_dict()
    if not isinstance(state, dict):
        raise CheckpointError(f"cannot resume '{path}': its '{part}' weights are not a state dict")
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    wrong = [k for k in own if k in state and (not isinstance(state[k], torch.Tensor) or state[k].shape != own[k].shape)]
    if not (missing or unexpected or wrong):
        return
    if wrong:
        k = wrong[0]
        shape = tuple(state[k].shape) if isinstance(state[k], torch.Tensor) else type(state[k]).__name__
        example = f"'{k}' is {shape} in the checkpoint, {tuple(own[k].shape)} in the model"
    else:
        example = f"'{(missing or unexpected)[0]}' is {'missing' if missing else 'unexpected'}"
    raise CheckpointError(f"cannot resume '{path}': its {part} weights do not fit {arch} with {model.num_classes} "
                          f"classes ({len(wrong)} of another shape, {len(missing)} missing, {len(unexpected)} "
                          f"unexpected; e.g. {example})")


def _latest_last(user: dict[str, Any]) -> Path:
    project = Path(user.get("project", FIELDS["project"].default))
    found = sorted(project.glob("*/weights/last.pt"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise ConfigError(f"resume=true but no last.pt under '{project}'; pass resume=path/to/last.pt")
    return found[-1]


__all__ = ["LibreYOLO", "ModelSource", "TrainConfig", "arch_of", "inference_args", "resolve_model"]
