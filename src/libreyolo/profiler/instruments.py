"""What the profiler's window installs to measure real steps: the phase recorder, the captured
region's timer and the caching allocator's watch, and the clock pair that maps host times onto
the trace's clock.

The window (window.py) says when each one runs: the recorder times every phase of the timed and
recorded steps (with a CUDA event at each timed step's start, and synchronised around every phase
in the recorded second half); the region timer stands in for the step's `capturable` over the
timed and recorded steps; the allocator watch counts over the timed and recorded unsynchronised
steps.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import torch


class Recorder:
    """Installed with `markers.set_recorder` for the timed and recorded steps: times every phase of
    every step, and each timed step's start (and a segment's end) with a CUDA event."""

    def __init__(self, device: torch.device):
        self.device, self.cuda = device, device.type == "cuda"
        self.synced = False
        self.timing = True  # the timed steps: an event at each step's start
        self.step = -1  # window step index; the `data` phase opens a step
        self.records: list[tuple] = []  # (step, name, t_enter, t0, t_host, t1, ev0, ev1)
        self.anchors: list[tuple[float, float]] = []  # our own device syncs: clock anchors
        self.starts: dict[int, tuple[float, Any]] = {}  # step -> (host time, CUDA event or None)
        self.ends: dict[int, tuple[float, Any]] = {}  # the steps that end the timed steps or an epoch
        self.region_forward: dict[int, list[tuple[float, float]]] = {}  # step -> capturable() host spans
        self.region_backward: dict[int, float] = {}  # step -> when the region's backward began

    def sync(self) -> float:
        if self.cuda:
            t = time.perf_counter()
            torch.cuda.synchronize(self.device)
            self.anchors.append((t, time.perf_counter()))
        return time.perf_counter()

    def _event(self):
        if not (self.cuda and self.timing):
            return None
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def mark_end(self) -> None:
        """The current step ends here (the last timed step, or one that ends an epoch)."""
        self.ends[self.step] = (time.perf_counter(), self._event())

    @contextlib.contextmanager
    def phase(self, name: str):
        t_enter = time.perf_counter()
        if name == "data":
            self.step += 1
            self.starts[self.step] = (t_enter, self._event())
        if not self.synced:
            yield
            t = time.perf_counter()
            self.records.append((self.step, name, t_enter, t_enter, t, t, None, None))
            return
        self.sync()  # start the phase on an idle device ...
        ev0 = ev1 = None
        if self.cuda:
            ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            ev0.record()
        t0 = time.perf_counter()
        yield
        t_host = time.perf_counter()
        if ev1 is not None:
            ev1.record()
        t1 = self.sync()  # ... and charge it with all the work it launched
        self.records.append((self.step, name, t_enter, t0, t_host, t1, ev0, ev1))


class RegionTimer:
    """Stands in for the step's `capturable` during the window and calls it unchanged: times the
    captured region's forward on the host, and stamps when its backward begins. A hook on the
    region's outputs fires when the first of their gradients is ready; autograd runs the nodes of
    the later forward ops (the loss's) first, so by then the backward of everything after the
    region is done and the region's own starts. The hook returns None: gradients are untouched."""

    def __init__(self, fn, recorder: Recorder):
        self.fn, self.recorder = fn, recorder

    def __call__(self, images):
        rec, step = self.recorder, self.recorder.step
        t0 = time.perf_counter()
        out = self.fn(images)
        rec.region_forward.setdefault(step, []).append((t0, time.perf_counter()))

        def began(_grad):
            rec.region_backward.setdefault(step, time.perf_counter())

        for o in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(o, torch.Tensor) and o.requires_grad:
                o.register_hook(began)
        return out


class AllocatorWatch:
    """The caching allocator's event counters summed over the window's steps, from a mark (resume(),
    or commit() at each step's start while CUDA graphs are on) to pause() (an epoch's end inside the
    window is left out: validation and checkpoints allocate; so is a step that captured a CUDA
    graph, with drop()), and the largest reserved memory read. num_device_alloc/free count
    cudaMalloc/cudaFree and expandable segments' cuMemMap/cuMemUnmap (older torch: segments
    allocated and freed)."""

    KEYS = ("retries", "ooms", "allocs", "frees")

    def __init__(self, device: torch.device):
        self.device = device
        self.total = dict.fromkeys(self.KEYS, 0)
        self.mark: dict | None = None
        self.reserved = 0

    def _read(self) -> dict:
        s = torch.cuda.memory_stats(self.device)
        self.reserved = max(self.reserved, torch.cuda.memory_reserved(self.device))
        return {"retries": int(s.get("num_alloc_retries", 0)), "ooms": int(s.get("num_ooms", 0)),
                "allocs": int(s.get("num_device_alloc", s.get("segment.all.allocated", 0))),
                "frees": int(s.get("num_device_free", s.get("segment.all.freed", 0)))}

    def resume(self) -> None:
        if self.mark is None:
            self.mark = self._read()

    def commit(self) -> None:
        """Count up to now and mark again from here, with one read (each step's start while CUDA
        graphs may capture: a capturing step's drop() then forgets that step's counts alone)."""
        now = self._read()
        self._add(now)
        self.mark = now

    def _add(self, now: dict) -> None:
        if self.mark is not None:
            for k in self.KEYS:
                self.total[k] += now[k] - self.mark[k]

    def drop(self) -> None:
        """Forget the counts since the last mark (a step that captured a CUDA graph)."""
        self.mark = None

    def pause(self) -> None:
        if self.mark is not None:
            self._add(self._read())
            self.mark = None


def clock_pair() -> tuple[float, int]:
    """(perf_counter seconds, unix ns) read together: maps our host stamps onto the trace clock."""
    best = None
    for _ in range(5):
        a, unix, b = time.perf_counter_ns(), time.time_ns(), time.perf_counter_ns()
        if best is None or b - a < best[0]:
            best = (b - a, (a + b) / 2e9, unix)
    return best[1], best[2]
