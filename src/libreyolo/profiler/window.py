"""The profiler hook: a window of real training steps, timed unrecorded, then recorded, then a report.

Layout of the window, in contiguous segments after `profile_skip` untouched steps (warm-up):

1. timed: `profile_steps // 2` steps with no activity recording. A CUDA event is recorded at the
   start of each step (its `data` phase) and at the end of the segment (and of an epoch inside
   it), so a step's time is the gap between its start event and the next, as `bench step` times
   its steps; on a CPU, host clocks. Host clocks time each phase. These steps give the verdict its
   step time, data wait and host phase times, and the profiler's own cost cannot lengthen them.
2. recorded, unsynchronised: the first half of `profile_steps` under the PyTorch profiler. Kernel
   busy time, kernels, syncs and the idle gaps' split by length come from here (kernel durations
   barely move under the profiler: its cost is host time per launch); so does the profiler's
   overhead figure (these steps' median time against the timed steps').
3. recorded, synchronised: the second half, synchronised around every phase: the step's
   composition (phases' synchronised, GPU and kernel busy times).
4. op steps (CUDA only): OPS_STEPS steps under a second, CPU-only profiler session, for the host
   operators' table (`profile ops`). Recording CPU ops roughly doubles a launch-bound step, so they
   get steps of their own that time nothing else; on a CPU the recorded steps hold CPU ops anyway.

Segments rather than interleaving: the profiler starts once (a start costs tens of ms to seconds,
and repeated sessions in one process corrupt the first kernel timestamps, pytorch issue 192021).
Then analyse, write the four artifacts, print the report when the epoch ends and remove the hook.
Training continues unchanged: the profiler only observes (and, for `libreyolo profile run`, asks
the trainer to stop after the window).

What is recorded. On CUDA the profiler records CUDA activity only: kernels, memcpy/memset and the
CUDA runtime calls, which carry the launch correlation ids, the blocking sync calls and the
allocator's cudaMalloc/cudaFree. Steps and phases are timed with host clocks and written into the
trace afterwards. On CPU the profiler records CPU ops, the only activity there is. During the
timed and recorded steps of a training window the step's `capturable` (the region a CUDA graph
captures, `FamilySpec.capture`) is wrapped to time its forward and to stamp when its backward
starts: what `profile what-if` needs to predict the graphed step.

Synchronisation. The device is synchronised before the timed steps, after them, after the last
step of the recorded first half and after a recorded step that ends an epoch inside the window,
so each segment of steps is charged with all the work it launched; inside a segment the timed
steps and the first half add no synchronisation.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import torch

from .. import markers
from ..engine.run import Hook
from . import analyze as A

log = logging.getLogger("libreyolo")

KERNEL_ROWS = 50  # kept in profile.json; the report shows the top 10
OPS_STEPS = 2  # CPU-op recorded steps after a CUDA window: host operators per step


def timed_count(steps: int) -> int:
    """Timed (unrecorded) steps before `steps` recorded ones: as many as the unsynchronised half."""
    return max(1, steps // 2)


def steps_needed(skip: int, steps: int) -> int:
    """Steps from the start of training to the end of the window: skipped, timed, recorded and the
    op steps (which a CPU window does without, so this is its upper bound)."""
    return skip + timed_count(steps) + steps + OPS_STEPS


def world_size() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    try:
        return int(os.environ.get("WORLD_SIZE") or 1)
    except ValueError:
        return 1


def profiler_hooks(cfg, *, stop_after_window: bool = False, print_report: bool = True) -> list[Hook]:
    """The hooks a training entry point adds for `cfg`: [ProfilerHook] when cfg.profile, else [].

    `libreyolo profile run` asks for a hook that stops training after its window and stays quiet
    (its own command prints the report)."""
    if not cfg.profile:
        return []
    return [ProfilerHook(int(cfg.profile_skip), int(cfg.profile_steps), stop_after_window=stop_after_window,
                         print_report=print_report)]


class _Recorder:
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


class _RegionTimer:
    """Stands in for the step's `capturable` during the window and calls it unchanged: times the
    captured region's forward on the host, and stamps when its backward begins. A hook on the
    region's outputs fires when the first of their gradients is ready; autograd runs the nodes of
    the later forward ops (the loss's) first, so by then the backward of everything after the
    region is done and the region's own starts. The hook returns None: gradients are untouched."""

    def __init__(self, fn, recorder: _Recorder):
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


def _settle_checkpoints(trainer) -> None:
    """Wait for the trainer's background checkpoint writes (an inference window has none). A write
    serialises on its own thread while the next steps run, holding the GIL for much of it; inside
    the window that time would read as the steps' own (on a CPU with workers=0, 50-300 ms of data
    wait in the step after an epoch end, which turned a compute-bound verdict dataloader-bound).
    So the window's epoch ends write their checkpoints before the window goes on, as a run without
    the checkpoint thread does."""
    checkpoints = getattr(trainer, "checkpoints", None)
    if checkpoints is not None:
        checkpoints.wait()


class ProfilerHook(Hook):
    """Measures a window of `steps` recorded steps (and the timed and op steps around them) after
    skipping `skip`."""

    def __init__(self, skip: int, steps: int, *, stop_after_window: bool = False, print_report: bool = True):
        self.skip, self.steps = skip, steps
        self.first = timed_count(steps)  # the recorded unsynchronised half, and as many timed steps before it
        self.stop_after_window, self.print_report = stop_after_window, print_report
        self.state = "skip"  # skip -> timed -> first -> second -> ops (CUDA) -> done
        self.seen = 0
        self.window: list[dict] = []  # one record per window step
        self.profile: dict | None = None
        self.recorder: _Recorder | None = None
        self.prof = None  # the recording session (then the op steps' session)
        self.trace: dict | None = None
        self.region: tuple[Any, Any] | None = None  # (step context, its own capturable) while timed
        self.allocator: _AllocatorWatch | None = None  # CUDA: the caching allocator over the timed and first-half steps
        self.cuda = False
        self.start_s = self.stop_s = 0.0

    # --- hook events ------------------------------------------------------------------------------
    def before_train(self, trainer) -> None:
        n = world_size()
        if n > 1:
            log.info(f"profile=true: not available under multi-GPU training ({n} processes); training "
                     "without the profiler (profile a single-process run)")
            trainer.remove_hook(self)
        elif self.skip == 0:
            self._begin(trainer)

    def before_step(self, trainer) -> None:
        if self.state in ("skip", "done"):
            return
        if self.allocator is not None and self.state in ("timed", "first"):
            if _graphs_enabled(trainer):  # any step may capture: mark each step's start, so drop() forgets that step alone
                self.allocator.commit()
            else:
                self.allocator.resume()
        self.window.append({"iteration": trainer.iteration, "epoch": trainer.epoch, "seg": self.state,
                            "counts0": _graph_counts(trainer), "t_before": time.perf_counter()})

    def after_step(self, trainer) -> None:
        if self.state == "done":
            return
        self.seen += 1
        if self.state == "skip":
            if self.seen == self.skip:
                self._begin(trainer)
            return
        rec = self.window[-1]
        rec["t_after"], rec["counts1"] = time.perf_counter(), _graph_counts(trainer)
        n = sum(r["seg"] == rec["seg"] for r in self.window)
        ends_epoch = trainer.batch_index + 1 == trainer.steps_per_epoch
        if self.allocator is not None and self.state in ("timed", "first"):
            if rec["counts1"][1] > rec["counts0"][1]:
                self.allocator.drop()  # the step captured a CUDA graph: its pool's allocations are no pressure
            elif ends_epoch or (self.state == "first" and n == self.first):
                self.allocator.pause()  # validation and checkpoints between epochs allocate: not the steps'
        if self.state == "timed":
            if n == self.first or ends_epoch:
                self.recorder.mark_end()
            if n == self.first:
                self.recorder.sync()
                self._start_recording(trainer)
        elif self.state == "first":
            if n == self.first or ends_epoch:
                rec["t_end"] = self.recorder.sync()  # a segment ends: all the work it launched is done
            if n == self.first:
                self.recorder.synced, self.state = True, "second"
        elif self.state == "second":
            rec["t_end"] = self.recorder.sync()
            if n == self.steps - self.first:
                self._end_recording(trainer)
        elif self.state == "ops" and n == OPS_STEPS:
            self._finish(trainer)

    def after_epoch(self, trainer) -> None:
        if self.state not in ("skip", "done"):
            _settle_checkpoints(trainer)  # the epoch's checkpoint writes finish before the window goes on
            return
        if self.state != "done":
            return
        if self.profile is not None and self.print_report:
            from .report import print_report

            print_report(self.profile)
        trainer.remove_hook(self)

    def after_train(self, trainer) -> None:
        if self.state == "ops":  # training ended during the op steps: the recorded window is whole
            done = sum(w["seg"] == "ops" for w in self.window)
            log.info(f"profile: training ended after {done} of the {OPS_STEPS} op steps; the profile is written "
                     + (f"with a host-op table over {done} step(s)" if done else "without a host-op table"))
            self._finish(trainer)
            self.after_epoch(trainer)  # the report, as at an epoch's end
            return
        if self.state == "done":
            return
        self._release()
        total = self.first + self.steps + (OPS_STEPS if trainer.device.type == "cuda" else 0)
        log.warning(f"profile: training ended {len(self.window)} steps into the {total}-step window "
                    f"(after {min(self.seen, self.skip)} of {self.skip} skipped steps); no profile written: "
                    f"train longer or lower profile_skip/profile_steps")

    # --- window -----------------------------------------------------------------------------------
    def _begin(self, trainer) -> None:
        """The timed steps start: no profiler yet, our phase recorder and the region's timer."""
        self.cuda = trainer.device.type == "cuda"
        _settle_checkpoints(trainer)
        self.recorder = _Recorder(trainer.device)
        self.recorder.sync()
        if self.cuda:
            self.allocator = _AllocatorWatch(trainer.device)  # counting from the first timed step's start
        ctx = getattr(trainer, "ctx", None)  # the training step's context (inference has none)
        if ctx is not None and callable(getattr(ctx, "capturable", None)):
            self.region = (ctx, ctx.capturable)
            ctx.capturable = _RegionTimer(ctx.capturable, self.recorder)
        self.tid, self.pid = threading.get_native_id(), os.getpid()
        markers.set_recorder(self.recorder)
        self.state = "timed"

    def _start_recording(self, trainer) -> None:
        from torch.profiler import ProfilerActivity

        # Kineto writes straight to stderr, into the middle of our report: an error line on CPU-only
        # machines ("gpuGetDeviceCount failed", level 4) and, in newer torch, a "USDT: ...
        # profiler_start" / "profiler_stop" marker pair (level 5). 6 is above every level; Kineto
        # reads it at each start. A user's own setting is kept.
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
        t = time.perf_counter()
        if not self._start_session(ProfilerActivity.CUDA if self.cuda else ProfilerActivity.CPU,
                                   "the PyTorch profiler did not start", "no profile written, training continues"):
            self._release()
            self.state = "done"
            return
        self.start_s = time.perf_counter() - t
        self.recorder.timing = False
        self.recorder.sync()
        self.clock = _clock_pair()
        self.state = "first"

    def _start_session(self, activity, what: str, then: str) -> bool:
        """Start a profiler session recording `activity`; False (and one warning line: `what`,
        the error, `then`) if it cannot start."""
        from torch.profiler import profile

        try:
            self.prof = profile(activities=[activity])
            self.prof.start()
            return True
        except Exception as exc:  # e.g. another profiler is already running: never end the run
            if os.environ.get("LIBREYOLO_DEBUG"):
                raise
            self.prof = None
            log.warning(f"profile: {what} ({type(exc).__name__}: {exc}); {then}")
            return False

    def _export(self, run_dir: Path) -> dict:
        """Stop the current session and read its Chrome trace back (the temp file is removed)."""
        t = time.perf_counter()
        self.prof.stop()
        self.stop_s += time.perf_counter() - t
        raw = Path(run_dir) / ".profile_trace.kineto.json"
        try:
            self.prof.export_chrome_trace(str(raw))
            return A.load_trace(raw)
        finally:
            raw.unlink(missing_ok=True)
            self.prof = None

    def _end_recording(self, trainer) -> None:
        """The synchronised half is done: stop recording, keep its trace, start the op steps (CUDA)."""
        self._restore_region()
        markers.set_recorder(None)
        try:
            self.trace = self._export(trainer.run_dir)
        except Exception as exc:
            if os.environ.get("LIBREYOLO_DEBUG"):
                raise
            self.state = "done"
            log.warning(f"profile: the trace could not be read ({type(exc).__name__}: {exc}); no profile written, "
                        f"training continues")
            return
        from torch.profiler import ProfilerActivity

        if self.cuda and self._start_session(ProfilerActivity.CPU, "the op steps' profiler did not start",
                                             "the profile has no host-op table"):
            self.state = "ops"
        else:
            self._finish(trainer)

    def _restore_region(self) -> None:
        if self.region is not None:
            ctx, capturable = self.region
            ctx.capturable = capturable
            self.region = None

    def _release(self) -> None:
        """Leave nothing behind: the step's own capturable, no recorder, no profiler session."""
        self._restore_region()
        markers.set_recorder(None)
        if self.prof is not None:
            with contextlib.suppress(Exception):
                self.prof.stop()
            self.prof = None

    def _finish(self, trainer) -> None:
        ops_trace = None
        if self.prof is not None:  # the op steps' session
            try:
                ops_trace = self._export(trainer.run_dir)
            except Exception as exc:
                if os.environ.get("LIBREYOLO_DEBUG"):
                    raise
                log.warning(f"profile: the op steps' trace could not be read ({type(exc).__name__}: {exc}); the "
                            f"profile has no host-op table")
        self.state = "done"
        if self.stop_after_window:
            trainer.stop = True
        t = time.perf_counter()
        try:
            self._analyse_and_write(trainer, ops_trace, t)
        except Exception as exc:  # never let the profiler end a training run
            if os.environ.get("LIBREYOLO_DEBUG"):
                raise
            log.warning(f"profile: analysis failed ({type(exc).__name__}: {exc}); training continues")

    def _analyse_and_write(self, trainer, ops_trace: dict | None, t_analysis: float) -> None:
        from . import artifacts, timeline

        run_dir = Path(trainer.run_dir)
        trace = self.trace
        steps = self._measure(trace)
        recorded = [s for s in steps if s["half"] > 0]
        ops = [r for r in self.window if r["seg"] == "ops"]
        window = {"skip": self.skip, "timed": self.first, "steps": self.steps, "first_half": self.first,
                  "second_half": self.steps - self.first, "ops_steps": len(ops),
                  "first_iteration": steps[0]["iteration"], "last_iteration": recorded[-1]["iteration"]}
        profile = assemble(trainer, steps, trace, self.tid, window, self._overhead(steps),
                           allocator=self._allocator(trace, steps), host_ops=self._host_ops(trace, ops_trace, steps))
        profile["overhead"].update(start_s=self.start_s, stop_s=self.stop_s,
                                   export_analysis_s=time.perf_counter() - t_analysis)
        gantt = timeline.gantt_events(trace, steps, self.cuda, self.tid)  # before our annotations join
        artifacts.annotate_trace(trace, steps, self.pid, self.tid)
        artifacts.write_all(run_dir, profile, trace, timeline.render(profile, gantt))
        self.profile = profile

    def _mapper(self, trace: dict, anchors: list[tuple[float, float]] = ()):
        """perf_counter seconds -> microseconds on `trace`'s clock (corrected by our own syncs)."""
        perf0, unix_ns = self.clock
        origin_us = (unix_ns - int(trace.get("baseTimeNanoseconds", 0))) / 1e3

        def raw(p: float) -> float:
            return origin_us + (p - perf0) * 1e6

        corr = A.clock_correction(trace, [(raw(a), raw(b)) for a, b in anchors])
        return lambda p: raw(p) + corr

    def _measure(self, trace: dict) -> list[dict]:
        """The window's step records (timed and recorded; not the op steps), with phases, in
        trace-clock microseconds where the trace covers them."""
        rec = self.recorder
        us = self._mapper(trace, rec.anchors)
        by_step: dict[int, list[tuple]] = {}
        for r in rec.records:
            by_step.setdefault(r[0], []).append(r)
        measured = [w for w in self.window if w["seg"] != "ops"]
        steps = []
        for k, w in enumerate(measured):
            half = {"timed": 0, "first": 1, "second": 2}[w["seg"]]
            t_start, ev_start = rec.starts[k]
            backward = next((r for r in by_step[k] if r[1] == "backward"), None)
            t_bwd = rec.region_backward.get(k)  # the region's backward began inside the backward phase
            t_bwd = t_bwd if backward is not None and t_bwd is not None and backward[3] <= t_bwd <= backward[4] else None
            fwd = rec.region_forward.get(k, [])
            if half == 0:
                t_stop, ev_stop = rec.ends.get(k) or rec.starts[k + 1]
                wall = (ev_start.elapsed_time(ev_stop) if ev_start is not None and ev_stop is not None
                        else (t_stop - t_start) * 1e3)
                phases = [{"name": r[1], "cpu_ms": (r[4] - r[3]) * 1e3} for r in by_step[k]]
                region = None
                if fwd:
                    region = {"forward": sum(b - a for a, b in fwd) * 1e3,
                              "backward": (backward[4] - t_bwd) * 1e3 if t_bwd is not None else None}
                steps.append({"iteration": w["iteration"], "epoch": w["epoch"], "half": 0, "wall_ms": wall,
                              "host_step_ms": (t_stop - t_start) * 1e3,
                              "data_ms": next(p["cpu_ms"] for p in phases if p["name"] == "data"),
                              "phases": phases, "region_ms": region, **_graph_use(w)})
                continue
            closed = "t_end" in w
            nxt = rec.starts[k + 1][0] if k + 1 in rec.starts else w["t_after"]
            cpu_end, end = (w["t_after"], w["t_end"]) if closed else (nxt, nxt)
            phases = []
            for _, name, _, t0, t_host, t1, ev0, ev1 in by_step[k]:
                phases.append({"name": name, "ts": us(t0), "host_end": us(t_host), "end": us(t1),
                               "cpu_ms": (t_host - t0) * 1e3, "wall_ms": (t1 - t0) * 1e3,
                               "gpu_ms": ev0.elapsed_time(ev1) if ev0 is not None else None})
            data = next(p for p in phases if p["name"] == "data")
            spans = [(us(a), us(b)) for a, b in fwd]
            if t_bwd is not None:
                spans.append((us(t_bwd), us(backward[4])))
            steps.append({"iteration": w["iteration"], "epoch": w["epoch"], "half": half,
                          "ts": us(t_start), "cpu_end": us(cpu_end), "end": us(end),
                          "wall_ms": (end - t_start) * 1e3, "data_ms": data["cpu_ms"], "phases": phases,
                          "region_spans": sorted(spans), **_graph_use(w)})
        _mark_kind(steps)
        return steps

    def _overhead(self, steps: list[dict]) -> dict:
        """The recorded unsynchronised steps' median time against the timed steps' (the same
        steps but for the recording), of the window's kind: a step that captured a CUDA graph, and
        eager steps of a graphed window, are left out (window.py's `_mark_kind`)."""
        ref = [s["wall_ms"] for s in steps if s["half"] == 0 and not s["excluded"]]
        prof = [s["wall_ms"] for s in steps if s["half"] == 1 and not s["excluded"]]
        graphed = _window_graphed(steps)
        out = {"reference_ms": ref, "profiled_ms": prof, "fraction": None, "graphed": graphed,
               "basis": "median recorded unsynchronised step / median unrecorded (timed) step - 1"}
        if ref and prof:
            out["fraction"] = statistics.median(prof) / statistics.median(ref) - 1.0
        elif graphed:
            out["note"] = ("no replayed CUDA-graph step among the timed steps to compare with: raise profile_skip "
                           "(capture happens at a shape's third step)")
        else:
            out["note"] = "no timed step of the window's kind to compare with"
        return out

    def _allocator(self, trace: dict, steps: list[dict]) -> dict | None:
        """The caching allocator over the timed and recorded unsynchronised steps (CUDA): its
        counters' deltas, the trace's device-memory calls, reserved memory and the limit."""
        if self.allocator is None:
            return None
        d = self.allocator.total
        n = sum(s["half"] in (0, 1) and not s["captured"] for s in steps)
        first = [(s["ts"], s["cpu_end"]) for s in steps if s["half"] == 1 and not s["captured"]]
        calls = A.alloc_calls(trace, first)
        trace_calls = sum(c for c, _ in calls) / max(len(first), 1)
        counter_calls = (d["allocs"] + d["frees"]) / max(n, 1)
        props = torch.cuda.get_device_properties(self.recorder.device)
        get_fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)  # newer torch
        fraction = float(get_fraction(self.recorder.device)) if get_fraction is not None else 1.0
        return {"steps": n, "retries": d["retries"], "ooms": d["ooms"], "device_allocs": d["allocs"],
                "device_frees": d["frees"], "counter_calls_per_step": counter_calls,
                "trace_calls_per_step": trace_calls,
                "trace_ms_per_step": sum(t for _, t in calls) / 1e3 / max(len(first), 1),
                "calls_per_step": max(counter_calls, trace_calls), "reserved_mb": self.allocator.reserved / 2**20,
                "limit_mb": props.total_memory * fraction / 2**20, "memory_fraction": fraction,
                "conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")}

    def _host_ops(self, trace: dict, ops_trace: dict | None, steps: list[dict]) -> dict | None:
        """The host operators per step: from the op steps' CPU-only session (CUDA), or from the
        recorded unsynchronised steps, which hold CPU ops on a CPU; outside each step's data phase."""
        if self.cuda:
            ops = [w for w in self.window if w["seg"] == "ops"]
            if ops_trace is None or not ops:
                return None
            us = self._mapper(ops_trace)
            spans = [(us(w["t_before"]), us(w["t_after"])) for w in ops]
            table = A.host_ops(ops_trace, A.step_threads(ops_trace, self.tid), spans, len(ops))
            source = (f"{len(ops)} op steps after the window, recorded with CPU activity only (their own "
                      f"profiler session: CPU-op recording roughly doubles a launch-bound step)")
        else:
            first = [s for s in steps if s["half"] == 1]
            spans = [(next(p["end"] for p in s["phases"] if p["name"] == "data"), s["cpu_end"]) for s in first]
            table = A.host_ops(trace, A.step_threads(trace, self.tid), spans, len(first))
            source = f"the {len(first)} recorded unsynchronised steps (a CPU window records CPU ops)"
        return {"source": source, **table}


def _graph_counts(trainer) -> tuple[int, int]:
    """(replayed steps, captures) of the run's CUDA graphs so far (0, 0 without them)."""
    graphs = getattr(trainer, "graphs", None)
    return getattr(graphs, "replayed_steps", 0), getattr(graphs, "captures", 0)


def _graphs_enabled(trainer) -> bool:
    """Whether the run's CUDA graphs are on. Then any step may capture: the first one at a shape's
    third sighting, a re-capture after an invalidation (YOLOX's L1 switch re-arms the graphs) or a
    new input size under multi_scale."""
    return bool(getattr(getattr(trainer, "graphs", None), "enabled", False))


def _graph_use(w: dict) -> dict:
    """Whether a window step replayed a CUDA graph, and whether it captured one."""
    (r0, c0), (r1, c1) = w["counts0"], w["counts1"]
    return {"replayed": r1 > r0, "captured": c1 > c0}


def _window_graphed(steps: list[dict]) -> bool:
    """The window's kind: most recorded unsynchronised steps replayed a CUDA graph."""
    first = [s for s in steps if s["half"] == 1]
    return sum(s["replayed"] for s in first) * 2 > len(first)


def _mark_kind(steps: list[dict]) -> None:
    """`excluded`: a step that captured a CUDA graph, or one of the other kind (eager in a graphed
    window: the first sightings of a shape before its capture)."""
    graphed = _window_graphed(steps)
    for s in steps:
        s["excluded"] = s["captured"] or s["replayed"] != graphed


class _AllocatorWatch:
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


def _clock_pair() -> tuple[float, int]:
    """(perf_counter seconds, unix ns) read together: maps our host stamps onto the trace clock."""
    best = None
    for _ in range(5):
        a, unix, b = time.perf_counter_ns(), time.time_ns(), time.perf_counter_ns()
        if best is None or b - a < best[0]:
            best = (b - a, (a + b) / 2e9, unix)
    return best[1], best[2]


def loop_mode(trainer) -> str:
    """The kind of step the hook measured: "train" for the Trainer, "infer" for profiler/infer.py's
    loop (its `mode`); the verdict's levers and the phase table follow it."""
    return getattr(trainer, "mode", "train")


def assemble(trainer, steps: list[dict], trace: dict, tid: int, window: dict, overhead: dict,
             allocator: dict | None = None, host_ops: dict | None = None) -> dict:
    """profile.json's content: run metadata, window, per-step records, phases, kernels, the captured
    region, host operators, memory, verdict."""
    from .artifacts import SCHEMA, SCHEMA_VERSION

    mode = loop_mode(trainer)
    device = trainer.device
    cuda = device.type == "cuda"
    index = (device.index if device.index is not None else torch.cuda.current_device()) if cuda else None
    events = A.busy_events(trace, index)
    syncs = A.sync_times(trace, tid)
    # The syncs a training step makes by design (the DETRs' denoising count and matcher) are named,
    # not held against the step.
    designed = float(getattr(getattr(trainer, "model", None), "host_syncs", 0)) if cuda and mode == "train" else 0.0
    alloc = None if allocator is None else {
        "alloc_retries": allocator["retries"], "alloc_calls_per_step": allocator["calls_per_step"],
        "reserved_mb": allocator["reserved_mb"], "limit_mb": allocator["limit_mb"], "alloc_conf": allocator["conf"]}
    figures = A.analyse_window(steps, events, syncs, cuda, trainer.cfg.workers, trainer.precision.describe(),
                               graphed=bool(overhead.get("graphed")), mode=mode, designed_syncs=designed,
                               allocator=alloc, cache=cache_mode(trainer))
    A.second_half_phases(steps, events, cuda)
    memory = {**_memory(device), "allocator": allocator}
    run = _run_metadata(trainer)
    v = figures.pop("verdict")
    headline = {"verdict": v["name"], "step_ms_mean": figures["step_ms"]["mean"],
                "step_ms_std": figures["step_ms"]["std"], "utilisation": figures["utilisation"],
                "kernel_busy_ms": figures["busy_ms"], "data_wait_ms": figures["data_ms"],
                "data_wait_frac": figures["data_frac"], "syncs_per_step": figures["syncs_per_step"],
                "peak_memory_mb": memory["peak_allocated_mb"] if cuda else memory["host_peak_rss_mb"],
                "precision": run["precision"], "cuda_graph": run["cuda_graph"]["enabled"],
                "device": run["device_name"], "overhead_frac": A.finite(overhead["fraction"])}
    return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "run": run, "window": window,
            "headline": headline, "verdict": v, "utilisation": figures, "thresholds": dict(A.THRESHOLDS),
            "phases": A.phase_table(steps, mode), "kernels": _kernel_table(trace, events, steps, cuda, tid),
            "capture": _capture_table(trainer, steps, events, cuda, mode), "host_ops": host_ops,
            "steps": [A.public_step(s) for s in steps], "memory": memory, "overhead": overhead}


def _kernel_table(trace: dict, events: list[dict], steps: list[dict], cuda: bool, tid: int) -> dict:
    """Kernels launched by the window's recorded steps (CPU runs: top-level ops of the training thread)."""
    spans = [(s["ts"], s["cpu_end"]) for s in steps if s["half"] > 0]
    if cuda:
        kernels = [e for e in events if e["cat"] == "kernel"]
        rows = ((e["name"], e["end"] - e["ts"]) for g in A.launched_in(kernels, spans) for e in g)
    else:
        ops = A.top_level(A.cpu_ops(trace, tid))
        rows = ((ev["name"], float(ev.get("dur", 0))) for g in A.launched_in(
            [{**ev, "launch": float(ev["ts"])} for ev in ops], spans) for ev in g)
    return {"kind": "kernel" if cuda else "cpu_op", "rows": A.aggregate(rows, KERNEL_ROWS)}


def _capture_table(trainer, steps: list[dict], events: list[dict], cuda: bool, mode: str) -> dict:
    """What `cuda_graph=true` would capture, and what it costs eager: the region's host time per
    timed step (forward; backward from the first gradient at its outputs to the end of the
    backward phase) and the busy time of the kernels it launched per recorded unsynchronised step.

    Training: the family's capture plan (`FamilySpec.capture`: the network, or the DETRs'
    encoder), timed around the step's `capturable`. Inference: predict's graph captures the
    forward phase (network and decode), so the region is that phase."""
    timed = A.timed_steps(steps)
    first = [s for s in steps if s["half"] == 1]
    if mode == "infer":
        out = {"region": "forward", "note": "predict's CUDA graph: the network and its decode (the forward phase)",
               "source": "the forward phase"}
        fwd = [p["cpu_ms"] for s in timed for p in s["phases"] if p["name"] == "forward"]
        spans = [[(p["ts"], p["host_end"]) for p in s["phases"] if p["name"] == "forward"] for s in first]
        out.update(forward_host_ms=statistics.fmean(fwd) if fwd else None, backward_host_ms=None)
    else:
        plan = getattr(getattr(trainer, "family", None), "capture", None)
        region = getattr(plan, "region", "none")
        out = {"region": region, "note": getattr(plan, "note", "") or getattr(plan, "reason", ""),
               "source": "the step's capturable (model.capturable)"}
        rows = [s["region_ms"] for s in timed if s.get("region_ms")]
        bwd = [r["backward"] for r in rows if r["backward"] is not None]
        out.update(forward_host_ms=statistics.fmean(r["forward"] for r in rows) if rows else None,
                   backward_host_ms=statistics.fmean(bwd) if bwd else None)
        spans = [s.get("region_spans") or [] for s in first]
    known = [x for x in (out["forward_host_ms"], out["backward_host_ms"]) if x is not None]
    out["host_ms"] = sum(known) if known else None
    out["busy_ms"] = out["kernels_per_step"] = None
    if cuda and first and any(spans):
        flat = sorted((lo, hi, i) for i, ss in enumerate(spans) for lo, hi in ss)
        groups = A.launched_in(events, [(lo, hi) for lo, hi, _ in flat])
        per_step: list[list[dict]] = [[] for _ in first]
        for (_, _, i), g in zip(flat, groups):
            per_step[i] += g
        out["busy_ms"] = statistics.fmean(A.union_length((e["ts"], e["end"]) for e in g) / 1e3 for g in per_step)
        out["kernels_per_step"] = statistics.fmean(sum(e["cat"] == "kernel" for e in g) for g in per_step)
    return out


def _memory(device: torch.device) -> dict:
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    out = {"scope": "peak since the process started (includes warm-up)", "host_peak_rss_mb": rss_mb,
           "peak_allocated_mb": None, "peak_reserved_mb": None}
    if device.type == "cuda":
        out["peak_allocated_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
        out["peak_reserved_mb"] = torch.cuda.max_memory_reserved(device) / 2**20
    return out


def _graph_state(trainer) -> dict:
    graphs = getattr(trainer, "graphs", None)
    if graphs is None or not callable(getattr(graphs, "stats", None)):
        return {"enabled": False, "replayed_steps": 0, "pool_mb": None}
    s = graphs.stats()
    pool = s.get("pool_mb")
    return {"enabled": bool(s.get("enabled", True)), "replayed_steps": int(s.get("replayed_steps", 0)),
            "pool_mb": None if pool is None else float(pool)}


def cache_mode(trainer) -> str | bool:
    """The image cache the training loader uses ("ram", "disk" or false): `cache=auto` resolved.
    Loaders that have none (classification, segmentation read their files) report "n/a"."""
    cache = getattr(getattr(getattr(trainer, "train_loader", None), "dataset", None), "cache", None)
    return "n/a" if cache is None else getattr(cache, "mode", None) or False


def _run_metadata(trainer) -> dict:
    cfg, device = trainer.cfg, trainer.device
    cuda = device.type == "cuda"
    return {"mode": loop_mode(trainer), "model": cfg.model, "family": trainer.family.name, "size": trainer.size,
            "arch": trainer.arch, "data": trainer.data_cfg.name,
            "device": str(device), "device_name": torch.cuda.get_device_name(device) if cuda else "cpu",
            "torch": torch.__version__, "cuda": torch.version.cuda if cuda else None,
            "batch": cfg.batch, "imgsz": cfg.imgsz, "workers": cfg.workers, "cache": cache_mode(trainer),
            "precision": trainer.precision.describe(), "channels_last": cfg.channels_last,
            "cudnn_benchmark": bool(torch.backends.cudnn.benchmark) if cuda else None,
            "cudnn_benchmark_limit": int(torch.backends.cudnn.benchmark_limit) if cuda else None,
            "cuda_graph": _graph_state(trainer), "run_dir": str(trainer.run_dir)}
