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
4. op steps (CUDA only): OPS_STEPS steps under a second, CPU-only profiler recording, for the host
   operators' table (`profile ops`). Recording CPU ops roughly doubles a launch-bound step, so they
   get steps of their own that time nothing else; on a CPU the recorded steps hold CPU ops anyway.

Segments rather than interleaving: the profiler starts once (a start costs tens of ms to seconds,
and repeated recordings in one process corrupt the first kernel timestamps, pytorch issue 192021).
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

This module is the hook: when each segment starts and ends. What it installs to measure is in
instruments.py; how a finished window becomes step records and profile.json, in assemble.py.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import torch

from .. import markers
from ..engine.run import Hook
from . import trace as T
from .assemble import allocator_figures, assemble, host_op_figures, overhead, step_records, whole_step_manager
from .instruments import AllocatorWatch, Recorder, RegionTimer, clock_pair

log = logging.getLogger("libreyolo")

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
        self.recorder: Recorder | None = None
        self.prof = None  # the recording (then the op steps' recording)
        self.trace: dict | None = None
        self.region: tuple[Any, Any] | None = None  # (step context, its own capturable) while timed
        self.allocator: AllocatorWatch | None = None  # CUDA: the caching allocator over the timed and first-half steps
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
        self.recorder = Recorder(trainer.device)
        self.recorder.sync()
        if self.cuda:
            self.allocator = AllocatorWatch(trainer.device)  # counting from the first timed step's start
        ctx = getattr(trainer, "ctx", None)  # the training step's context (inference has none)
        if ctx is not None and callable(getattr(ctx, "capturable", None)):
            self.region = (ctx, ctx.capturable)
            ctx.capturable = RegionTimer(ctx.capturable, self.recorder)
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
        if not self._start_profiler(ProfilerActivity.CUDA if self.cuda else ProfilerActivity.CPU,
                                   "the PyTorch profiler did not start", "no profile written, training continues"):
            self._release()
            self.state = "done"
            return
        self.start_s = time.perf_counter() - t
        self.recorder.timing = False
        self.recorder.sync()
        self.clock = clock_pair()
        self.state = "first"

    def _start_profiler(self, activity, what: str, then: str) -> bool:
        """Start a profiler recording recording `activity`; False (and one warning line: `what`,
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
        """Stop the current recording and read its Chrome trace back (the temp file is removed)."""
        t = time.perf_counter()
        self.prof.stop()
        self.stop_s += time.perf_counter() - t
        raw = Path(run_dir) / ".profile_trace.kineto.json"
        try:
            self.prof.export_chrome_trace(str(raw))
            return T.load_trace(raw)
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

        if self.cuda and self._start_profiler(ProfilerActivity.CPU, "the op steps' profiler did not start",
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
        """Leave nothing behind: the step's own capturable, no recorder, no profiler recording."""
        self._restore_region()
        markers.set_recorder(None)
        if self.prof is not None:
            with contextlib.suppress(Exception):
                self.prof.stop()
            self.prof = None

    def _finish(self, trainer) -> None:
        ops_trace = None
        if self.prof is not None:  # the op steps' recording
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
        steps = step_records(self.recorder, self.window, self.clock, trace)
        recorded = [s for s in steps if s["half"] > 0]
        ops = [r for r in self.window if r["seg"] == "ops"]
        window = {"skip": self.skip, "timed": self.first, "steps": self.steps, "first_half": self.first,
                  "second_half": self.steps - self.first, "ops_steps": len(ops),
                  "first_iteration": steps[0]["iteration"], "last_iteration": recorded[-1]["iteration"]}
        host_ops = host_op_figures(self.cuda, self.window, self.clock, self.tid, trace, ops_trace, steps)
        profile = assemble(trainer, steps, trace, self.tid, window, overhead(steps),
                           allocator=allocator_figures(self.allocator, trace, steps), host_ops=host_ops)
        profile["overhead"].update(start_s=self.start_s, stop_s=self.stop_s,
                                   export_analysis_s=time.perf_counter() - t_analysis)
        gantt = timeline.gantt_events(trace, steps, self.cuda, self.tid)  # before our annotations join
        artifacts.annotate_trace(trace, steps, self.pid, self.tid)
        artifacts.write_all(run_dir, profile, trace, timeline.render(profile, gantt))
        self.profile = profile


def _managers(trainer) -> list:
    """The run's CUDA graph managers: the network's (cuda_graph=true; held under full) and the
    whole step's (cuda_graph=full, engine/fullstep.py), where the run has them."""
    return [m for m in (getattr(trainer, "graphs", None), whole_step_manager(trainer)) if m is not None]


def _graph_counts(trainer) -> tuple[int, int]:
    """(replayed steps, captures) of the run's CUDA graphs so far (0, 0 without them)."""
    managers = _managers(trainer)
    return (sum(getattr(m, "replayed_steps", 0) for m in managers),
            sum(getattr(m, "captures", 0) for m in managers))


def _graphs_enabled(trainer) -> bool:
    """Whether the run's CUDA graphs are on. Then any step may capture: the first one at a shape's
    third sighting, a re-capture after an invalidation (YOLOX's L1 switch re-arms the graphs) or a
    new input size under multi_scale."""
    return any(bool(getattr(m, "enabled", False)) for m in _managers(trainer))
