"""`libreyolo profile infer`: the profiler's window over inference steps instead of training steps.

The profiler hook (window.py) measures any loop that calls its events the way the Trainer does and
carries the attributes it reads. `InferenceLoop` is such a loop around predict's own `Predictor`,
so an inference profile gets the same window, verdict rules, four artifacts and report as a
training one; `mode = "infer"` selects the inference phases and levers (verdict.py). One step:

- `data`: the next batch of prepared images from predict's own pipeline (Predictor._prepared):
  `workers` threads decode each image and letterbox it (classifiers: centre-crop) a few batches
  ahead; workers=0 does both on this thread. A slow decoder or too few threads show as data
  wait, as a slow dataloader does in training;
- `h2d`: the uint8 batch uploaded through predict's pinned buffer (`Predictor.upload`);
- `forward`: `Predictor.infer` on the device batch: float / 255, the network (conv+BN folded,
  weights in the precision's dtype) and its decode, or the replay of its CUDA graph (cuda_graph=true: captured at the first batch, which
  is a skipped step);
- `postprocess`: the task's results: NMS and the unletterbox of detections, or the class
  probabilities, copied to the host (a sync by design, which the verdict does not count).

The images cycle: one pass over them is an epoch of ceil(images / batch) full batches, and passes
repeat until the window is done (window.steps_needed: skipped, timed, recorded and op steps). Without a source the images are the task's
built-in validation set (shapes, shapes-cls, shapes-seg: generated offline and cached), DEFAULT_IMAGES of them
spread over the set.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import yaml
from torch import Tensor

from ..atomic import write_text_atomic
from ..config import FIELDS
from ..engine.run import Hook
from ..errors import ConfigError, DataError, LibreYOLOError
from ..logs import counted
from ..markers import phase
from ..predict.options import KEYS as PREDICT
from ..predict.post import PostOptions

log = logging.getLogger("libreyolo")

DEFAULT_IMAGES = 32
# The graph is captured at the first batch: with one skipped step the capture stays out of the
# window (a timed step that captured would be left out of the step time, assemble.mark_kind).
GRAPH_SKIP = 1
# The keys `profile infer` takes: predict's (predict/options.py KEYS), then the window and the output.
PREDICT_KEYS = ("source", "batch", "imgsz", "device", "amp", "amp_dtype", "cuda_graph", "conf", "iou", "max_det")
OWN_DEFAULTS = {"workers": PREDICT["workers"].default, "profile_skip": FIELDS["profile_skip"].default,
                "profile_steps": FIELDS["profile_steps"].default, "project": "runs/profile", "name": "infer",
                "exist_ok": False}
KEYS = (*PREDICT_KEYS, *OWN_DEFAULTS)


@dataclass(frozen=True)
class InferConfig:
    """One inference profile's settings. `cache` and `channels_last` are the training keys that
    profile.json's run metadata records: inference caches nothing, and `channels_last` is what the
    Predictor chose (true on CUDA)."""

    model: str
    source: str | None  # None: the task's built-in validation images
    batch: int
    imgsz: int | None   # None until the Predictor resolves it (the checkpoint's size, else the family's)
    device: str
    amp: bool
    amp_dtype: str
    cuda_graph: bool
    conf: float
    iou: float
    max_det: int
    workers: int        # prepare threads; 0 prepares on the loop's thread
    profile_skip: int
    profile_steps: int
    project: str
    name: str
    exist_ok: bool
    cache: bool = False
    channels_last: bool = False


def settings(model: str, overrides: dict[str, Any]) -> InferConfig:
    """The checked settings of `overrides` (KEYS) with the defaults filled in; one ConfigError line
    per mistake."""
    from ..config import check_value, unknown_key_message
    from ..predict.options import check_options

    for key in overrides:
        if key not in KEYS:
            if key in FIELDS:
                raise ConfigError(f"key '{key}' does not apply to profile infer (allowed: {', '.join(KEYS)})")
            raise ConfigError(unknown_key_message(key, set(KEYS)))
    opts = check_options({k: v for k, v in overrides.items() if k in PREDICT_KEYS})
    own = {k: check_value(k, overrides.get(k, default)) for k, default in OWN_DEFAULTS.items()}
    if opts["cuda_graph"] and own["profile_skip"] < GRAPH_SKIP:
        raise ConfigError(f"cuda_graph=true needs profile_skip >= {GRAPH_SKIP} (got {own['profile_skip']}): the "
                          f"first step captures the graph, which the window must not measure")
    return InferConfig(model=model, **{k: opts[k] for k in PREDICT_KEYS}, **own)


# --- the images -----------------------------------------------------------------------------------
def image_files(source: str | None, task) -> tuple[list[Path], str]:
    """The image files to cycle through, and how the report names them. `source`: an image file,
    a folder (its images, by name), a glob; None: the task's built-in validation images."""
    from ..data.dataset_yaml import IMAGE_SUFFIXES

    if source is None:
        data = task.load_data(task.builtin_data)
        files = [item[0] if isinstance(item, tuple) else item for item in data.val]  # classify: (path, class)
        files = files[:: max(len(files) // DEFAULT_IMAGES, 1)][:DEFAULT_IMAGES]
        return files, f"{task.builtin_data} val ({len(files)} images)"

    from ..predict.sources import open_source

    path = Path(source).expanduser()
    if path.is_file() and path.suffix.lower() not in IMAGE_SUFFIXES:  # a video, or not an image
        raise DataError(f"source {source}: profile infer reads still images ({', '.join(IMAGE_SUFFIXES)})")
    if not path.exists() and not any(c in source for c in "*?["):
        raise DataError(f"source '{source}' does not exist")
    files = open_source(source).image_files()  # predict's own listing: sorted, no dot-files, no subfolders
    return files, f"{source} ({counted(len(files), 'image')})"


class _Cycle:
    """The image files as a predict source that never ends: `decoders`/`frame_of` for predict's
    thread pool (predict/sources.py), plain iteration for workers=0."""

    def __init__(self, files: Sequence[Path]):
        from ..data.classify import image_ok
        from ..predict.sources import open_source

        if not any(image_ok(Path(f)) for f in files):  # else the cycle would look for a frame for ever
            raise DataError(f"none of the {len(files)} image file(s) of the source decodes (truncated or not images)")
        self.source = open_source([str(f) for f in files])

    def decoders(self):
        while True:
            yield from self.source.decoders()

    def frame_of(self, decoded):
        return self.source.frame_of(decoded)

    def __iter__(self):
        while True:
            yield from self.source


# --- the trainer-shaped parts the hook reads ----------------------------------------------------
class _GraphCounts:
    """An InferenceGraph's counters under the names the hook reads of the training graphs
    (engine/graphs.py): `replayed_steps`, `captures`, `stats()`."""

    def __init__(self, graph):
        self.graph = graph

    @property
    def replayed_steps(self) -> int:
        return self.graph.replays

    @property
    def captures(self) -> int:
        return int(self.graph.graph is not None)  # one capture, at the first batch

    def stats(self) -> dict[str, Any]:
        # The graph's private memory pool is not tracked by InferenceGraph: unknown.
        return {"enabled": self.graph.fallback_reason is None, "replayed_steps": self.graph.replays, "pool_mb": None}


class _Precision:
    """The predictor's precision as the report names it: its weights' dtype (predict casts the
    model instead of autocasting; there is no gradient scaler)."""

    def __init__(self, dtype: torch.dtype):
        self.text = "float32" if dtype == torch.float32 else f"{str(dtype).removeprefix('torch.')} weights"

    def describe(self) -> str:
        return self.text


class InferenceLoop:
    """Inference steps with the trainer's hook events around them, in its order (engine/run.py):
    before_train; per pass over the images before_epoch, before_step/after_step per step,
    after_epoch; after_train. Runs until a hook sets `stop` or the steps a window needs
    (window.steps_needed) ran."""

    mode = "infer"  # window.loop_mode: inference phases and levers

    def __init__(self, predictor, model_source, cfg: InferConfig, files: Sequence[Path], images: str,
                 run_dir: Path, hooks: list[Hook]):
        self.predictor, self.task, self.cfg, self.files = predictor, predictor.task, cfg, files
        self.device, self.run_dir, self.hooks = predictor.device, run_dir, list(hooks)
        self.family, self.size, self.arch = model_source.spec, model_source.size, model_source.arch
        self.data_cfg = SimpleNamespace(name=images)
        self.precision = _Precision(predictor.dtype)
        self.graphs = _GraphCounts(predictor.graph) if predictor.graph is not None else None
        self.steps_per_epoch = math.ceil(len(files) / cfg.batch)
        self.epoch = self.batch_index = self.iteration = 0
        self.stop = False
        self.opts = PostOptions(cfg.conf, cfg.iou, cfg.max_det, nms=not predictor.end_to_end)

    def run(self) -> None:
        from .window import steps_needed

        total = steps_needed(self.cfg.profile_skip, self.cfg.profile_steps)
        self._call("before_train")
        done = False
        with contextlib.closing(self._prepared()) as batches:  # closing it ends the prepare threads
            for epoch in itertools.count():
                self.epoch = epoch
                self._call("before_epoch")
                for batch_index in range(self.steps_per_epoch):
                    self.batch_index, self.iteration = batch_index, epoch * self.steps_per_epoch + batch_index
                    self._step(batches)
                    done = self.stop or self.iteration + 1 == total
                    if done:
                        break
                self._call("after_epoch")
                if done:
                    break
        self._call("after_train")

    def _prepared(self) -> Iterator[tuple[Any, Tensor, Any]]:
        """(frame, network input, meta) for ever: predict's own pipeline (its threads decode and
        prepare), or this thread's with workers=0."""
        if self.cfg.workers > 0:
            return self.predictor._prepared(_Cycle(self.files))
        return ((f, *self.predictor.prepare(f.image)) for f in _Cycle(self.files))

    def _step(self, batches: Iterator[tuple[Any, Tensor, Any]]) -> None:
        with phase("data"):
            frames, images, metas = zip(*(next(batches) for _ in range(self.cfg.batch)))
            batch = torch.stack(images)
        self._call("before_step")
        with phase("h2d"):
            batch = self.predictor.upload(batch)
        with phase("forward"):
            preds = self.predictor.infer(batch)
        with phase("postprocess"), torch.inference_mode():
            self.task.results(preds, metas, frames, self.predictor.names, self.opts)
        self._call("after_step")

    def _call(self, event: str) -> None:
        for hook in list(self.hooks):  # a copy: hooks may remove themselves
            getattr(hook, event)(self)

    def remove_hook(self, hook: Hook) -> None:
        self.hooks.remove(hook)


def run_once(model: str, overrides: dict[str, Any]) -> Path:
    """Profile inference of `model` in this process (settings: KEYS); returns the run directory,
    project/name (runs/profile/infer, infer2, ...), holding the four artifacts and args.yaml."""
    from ..engine.device import out_of_memory_as_error
    from ..engine.rundir import discard_if_empty, make_run_dir
    from ..logs import checking_inputs
    from ..predict.core import Predictor
    from ..resolve import resolve_model
    from .window import ProfilerHook

    cfg = settings(model, overrides)
    model_source = resolve_model(model)
    with checking_inputs():  # a failed check prints its one line and nothing before it
        predictor = Predictor(model_source, imgsz=cfg.imgsz, batch=cfg.batch, device=cfg.device, amp=cfg.amp,
                              amp_dtype=cfg.amp_dtype, cuda_graph=cfg.cuda_graph, workers=cfg.workers)
        files, images = image_files(cfg.source, predictor.task)
    cfg = replace(cfg, imgsz=predictor.imgsz, channels_last=predictor.channels_last)
    run_dir = make_run_dir(cfg.project, cfg.name, cfg.exist_ok)
    write_text_atomic(run_dir / "args.yaml", yaml.safe_dump(asdict(cfg), sort_keys=False))
    log.info(f"profiling inference of {predictor.describe()}; images: {images}; {cfg.profile_skip} skipped + "
             f"{cfg.profile_steps} measured steps; run dir {run_dir}")
    # The hook stops the loop after its window and stays quiet: the command prints the report.
    hook = ProfilerHook(cfg.profile_skip, cfg.profile_steps, stop_after_window=True, print_report=False)
    try:
        with out_of_memory_as_error(cfg, predictor.device):
            InferenceLoop(predictor, model_source, cfg, files, images, run_dir, [hook]).run()
    except (LibreYOLOError, KeyboardInterrupt):
        discard_if_empty(run_dir)
        raise
    if not (run_dir / "profile.json").is_file():
        raise LibreYOLOError(f"the profile window did not complete in {run_dir} (see the log above)")
    return run_dir
