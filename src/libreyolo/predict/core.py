"""Predict: images in, `Result`s out, through the same transforms and post-process as val.

The flow: a thread pool decodes the source's image files and runs the task's `prepare`
(validation's letterbox or centre crop) a few batches ahead of the device; a batch goes up as
uint8 (4x fewer bytes than float) through one reused pinned buffer; `network` turns it into the
task's prediction (/ 255 in the weights' dtype, the deploy model: conv+BN folded, float16 weights
on CUDA by default, its decode in float32), replayed from a CUDA graph with `cuda_graph=True`; the
task's `results` does NMS (detection) and maps boxes back to original pixels (segmentation: the
class map at the original size).

A `Predictor` holds the model and its graph; `LibreYOLO.predict` keeps the last one, so a script
that predicts frame by frame with the same settings builds the model once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from torch import Tensor

from ..errors import DataError
from .post import PostOptions
from .results import Result

log = logging.getLogger("libreyolo")


class Predictor:
    """A model ready to predict: built once, on its device, in eval mode (graph captured lazily)."""

    def __init__(self, source, *, imgsz: int | None = None, batch: int = 1, device: str = "", amp: bool = True,
                 amp_dtype: str = "float16", cuda_graph: bool = False, workers: int = 4):
        from ..engine.builder import build_model
        from ..engine.precision import Precision
        from ..resolve import inference_setup
        from .graph import InferenceGraph

        self.task, self.names, self.imgsz, self.device = inference_setup(source, imgsz, device, "predict")
        self.batch, self.workers = int(batch), int(workers)
        if self.device.type == "cuda":
            # One input shape for the whole run: cuDNN times its algorithms once (the first batch,
            # or the graph's warm-up) and keeps the fastest. Process-wide, as torch makes it.
            torch.backends.cudnn.benchmark = True
        if source.checkpoint is None:
            log.warning(f"predicting with {source.arch} random weights (no checkpoint given)")
        self.precision = Precision.create(amp, amp_dtype, self.device)
        self.model = self._deploy(build_model(source, len(self.names), exact=True))
        self.end_to_end = bool(getattr(self.model, "end_to_end", False))  # top-k, no NMS (DETRs)
        self.arch = source.arch
        self._staging: Tensor | None = None  # pinned host buffer the batches are uploaded from
        self._uploaded: torch.cuda.Event | None = None
        self.graph = None
        if cuda_graph and source.spec.capture.region not in ("network", "encoder"):
            log.info(f"cuda_graph=true ignored: {source.spec.capture.reason}; predicting eager")
        elif cuda_graph and self.device.type != "cuda":
            log.info(f"cuda_graph=true ignored: it needs a CUDA device (predicting on {self.device})")
        elif cuda_graph:
            self.graph = InferenceGraph(self.network, rows=self.batch)

    def _deploy(self, model: torch.nn.Module) -> torch.nn.Module:
        """The inference form of a training model: eval mode, BatchNorm folded into the convs
        (every block with `fuse_`), and on CUDA the weights in the precision's dtype and
        channels_last. Casting the weights once replaces autocast, which casts every conv's
        weight again on each call (with the cast cache off, as graph capture needs: one extra
        kernel per conv). The families decode in float32 whatever the network's dtype."""
        from ..families.common import fuse_model_

        model = fuse_model_(model.eval())
        self.dtype = self.precision.dtype or torch.float32
        model = model.to(self.device, dtype=self.dtype)
        self.channels_last = self.device.type == "cuda"
        return model.to(memory_format=torch.channels_last) if self.channels_last else model

    def describe(self) -> str:
        graph = ", CUDA graph" if self.graph is not None else ""
        weights = str(self.dtype).removeprefix("torch.")
        return (f"{self.arch} ({self.task.display}, {len(self.names)} classes) at {self.imgsz} px, batch "
                f"{self.batch} on {self.device}; {weights} weights, conv+BN folded{graph}")

    def network(self, images: Tensor) -> Tensor:
        """uint8 [B, 3, S, S] on the device -> the task's prediction, float32 (capturable)."""
        x = images.to(self.dtype).div_(255)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return self.model.predict(x).float()

    def upload(self, images: Tensor) -> Tensor:
        """A host batch on the device. On CUDA through one pinned buffer, reused: pinning a fresh
        tensor per batch (cudaHostAlloc) costs more than the copy; the last upload from the buffer
        is waited for before it is overwritten."""
        if images.device == self.device:
            return images
        if self.device.type != "cuda":
            return images.to(self.device)
        n = images.shape[0]
        if self._staging is None or self._staging.shape[1:] != images.shape[1:] or self._staging.shape[0] < n:
            self._staging = torch.empty((max(n, self.batch), *images.shape[1:]), dtype=images.dtype).pin_memory()
        elif self._uploaded is not None and not self._uploaded.query():
            self._uploaded.synchronize()  # only when the last upload is still in flight: a real wait
        staged = self._staging[:n]
        staged.copy_(images)
        out = staged.to(self.device, non_blocking=True)
        self._uploaded = torch.cuda.Event()
        self._uploaded.record()
        return out

    def infer(self, images: Tensor) -> Tensor:
        """One batch of prepared uint8 images (on the host or the device) -> prediction on the device."""
        images = self.upload(images)
        with torch.inference_mode():
            return (self.graph or self.network)(images)

    def prepare(self, image: Tensor) -> tuple[Tensor, Any]:
        return self.task.prepare(image, self.imgsz)

    def run(self, frames: Iterable, opts: PostOptions) -> Iterator[tuple[Any, Result]]:
        """(frame, its Result) for `frames` (objects with .image uint8 [3, h, w], .name, .path,
        .frame), in order."""
        if self.end_to_end:
            opts = dataclasses.replace(opts, nms=False)
        batch: list[tuple[Any, Tensor, Any]] = []
        for item in self._prepared(frames):
            batch.append(item)
            if len(batch) == self.batch:
                yield from self._results(batch, opts)
                batch = []
        if batch:
            yield from self._results(batch, opts)

    def _results(self, batch: list, opts: PostOptions) -> list[tuple[Any, Result]]:
        frames, images, metas = zip(*batch)
        preds = self.infer(torch.stack(images))
        with torch.no_grad():  # not inference_mode: a Result's tensors are the user's to edit
            return list(zip(frames, self.task.results(preds, metas, frames, self.names, opts)))

    def _prepared(self, frames: Iterable) -> Iterator[tuple[Any, Tensor, Any]]:
        """(frame, network image, meta) in order. A thread pool decodes (a `Source`'s image files)
        and prepares a few batches ahead of the device: torchvision's decoders and resize release
        the GIL, and at batch 1 a 600 px PNG's decode takes longer than a graphed forward."""
        threads = max(1, min(self.workers, os.cpu_count() or 1))
        ahead = max(2 * self.batch, 2 * threads)
        if hasattr(frames, "decoders"):
            decoders, frame_of = frames.decoders(), frames.frame_of
        else:  # frames already decoded
            decoders, frame_of = ((lambda f=f: f) for f in frames), (lambda f: f)

        def work(decode):
            decoded = decode()
            if decoded is None:
                return None, None
            return decoded, self.prepare(decoded[0] if isinstance(decoded, tuple) else decoded.image)

        def done(job):
            decoded, prepared = job.result()
            frame = frame_of(decoded)
            return None if frame is None else (frame, *prepared)

        with ThreadPoolExecutor(threads, thread_name_prefix="libreyolo-prepare") as pool:
            pending: deque = deque()
            for decode in decoders:
                pending.append(pool.submit(work, decode))
                if len(pending) > ahead and (item := done(pending.popleft())) is not None:
                    yield item
            while pending:
                if (item := done(pending.popleft())) is not None:
                    yield item


def predict(predictor_for, source: Any, options: dict[str, Any]) -> Iterator[Result]:
    """Results for `source` with checked `options` (check_options); annotated files saved when
    options['save']. `predictor_for(options)` supplies the Predictor (cached by the caller)."""
    from ..atomic import check_writable
    from ..logs import checking_inputs, progress_bar
    from .draw import Saver, annotate, predict_dir
    from .sources import open_source

    frames = open_source(source, vid_stride=options["vid_stride"])
    save_dir = predict_dir(options["project"], options["name"], options["exist_ok"]) if options["save"] else None
    if save_dir is not None:  # before the model loads
        check_writable(save_dir, "predict folder", folder=True)
    with checking_inputs():  # a model that fails to build prints its one line, nothing before it
        predictor = predictor_for(options)
    opts = PostOptions(options["conf"], options["iou"], options["max_det"], options["multi_label"])
    saver = Saver(save_dir) if save_dir is not None else None
    show = options["progress"] and frames.kind in ("folder", "glob", "video", "list")
    produced = 0
    with saver if saver is not None else contextlib.nullcontext(), \
            progress_bar(predictor.run(frames, opts), show, "predicting", total=frames.total) as pairs:
        for frame, result in pairs:
            if saver is not None:
                result.extra["saved"] = str(saver.save(frame, annotate(frame.image, result)))
                if result.mask is not None:  # segmentation: the class map itself, as a PNG of class ids
                    result.extra["mask_saved"] = str(saver.save_mask(frame, result.mask))
            produced += 1
            yield result
    if not produced and frames.skipped:
        raise DataError(f"none of the {frames.skipped} image file(s) of the source decodes (named above)")
    if frames.skipped:
        log.warning(f"{frames.skipped} file(s) of the source could not be decoded and were skipped (named above)")
