"""A CUDA graph of the inference forward: captured once, at the predictor's batch and imgsz.

Inference is the easy capture: no backward, no loss, no optimizer, and in eval mode no batch-norm
statistics or dropout draws change between calls. What the graph holds: uint8 -> float / 255, the
network (weights in the run's dtype) and its decode. The first batch runs eagerly twice on a
side stream (cuDNN picks its algorithms, the allocator settles), then is captured with the
predictor's batch rows (a smaller first batch is padded); later batches replay it. A batch
smaller than the captured one (a folder's last batch) replays the same graph on the first rows
of its input buffer. Another input shape runs eager,
said in one line the first time; a failed capture says why in one line and the rest runs eager.
The rules are those of the PyTorch CUDA-graphs notes (docs: notes/cuda, "CUDA Graphs").
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import Tensor

from ..engine.graphs import describe_key, input_key

log = logging.getLogger("libreyolo")

WARMUP = 2  # eager calls on the side stream before the capture


class InferenceGraph:
    """`graph(images uint8 [B, 3, S, S] on the device) -> fn(images)`, replayed when it can be."""

    def __init__(self, fn: Callable[[Tensor], Tensor], rows: int = 1):
        self.fn = fn
        self.rows = rows  # the capture's batch: a smaller first batch is padded to it
        self.graph: torch.cuda.CUDAGraph | None = None
        self.key: tuple | None = None          # the captured input's key, at its full batch
        self.fallback_reason: str | None = None
        self.replays = self.eager_calls = 0
        self._said: set[tuple] = set()
        self._static_in: Tensor | None = None
        self._static_out: Tensor | None = None

    @staticmethod
    def _rowless(key: tuple) -> tuple:
        """An input key without its batch size: what a partial batch must share with the capture."""
        shape, dtype, stride, device, grad = key
        return (shape[1:], dtype, stride[1:], device, grad)

    def __call__(self, images: Tensor) -> Tensor:
        if self.fallback_reason is None and self.graph is None:
            self._capture(images)
        if self.graph is not None:
            key = input_key(images)
            n = images.shape[0]
            if self._rowless(key) == self._rowless(self.key) and n <= self.key[0][0]:
                self._static_in[:n].copy_(images)
                self.graph.replay()
                self.replays += 1
                return self._static_out[:n].clone()  # the next replay overwrites the static output
            if self._rowless(key) not in self._said:
                self._said.add(self._rowless(key))
                log.info(f"cuda_graph: input {describe_key(key)} differs from the captured "
                         f"{describe_key(self.key)}; it runs eager")
        self.eager_calls += 1
        return self.fn(images)

    def _capture(self, images: Tensor) -> None:
        if images.device.type != "cuda":
            self.fallback_reason = "needs a CUDA device"
            return
        try:
            n = images.shape[0]
            static_in = images.new_zeros((max(n, self.rows), *images.shape[1:]))
            static_in[:n].copy_(images)
            side = torch.cuda.Stream(images.device)
            side.wait_stream(torch.cuda.current_stream(images.device))
            with torch.cuda.stream(side):
                for _ in range(WARMUP):
                    self.fn(static_in)
            torch.cuda.current_stream(images.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_out = self.fn(static_in)
        except Exception as exc:  # noqa: BLE001 - any capture failure: one line, then eager
            self.fallback_reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
            log.info(f"cuda_graph: capture failed ({self.fallback_reason}); predicting eager")
            torch.cuda.synchronize(images.device)
            return
        self.graph, self.key = graph, input_key(static_in)
        self._static_in, self._static_out = static_in, static_out
        log.info(f"cuda_graph: captured the forward for {describe_key(self.key)}")
