"""The profiler hook: a window of real training steps, measured twice, then a report.

Lifecycle: skip `profile_skip` steps untouched (their step times are the unprofiled reference for
the profiler's own overhead); start the PyTorch profiler and our phase recorder; run the first
half of `profile_steps` unsynchronised, the second half synchronised around every phase; stop,
analyse, write the four artifacts, print the report when the epoch ends and remove the hook.
Training continues unchanged: the profiler only observes (and, for `libreyolo profile run`,
asks the trainer to stop after the window).

What is recorded. On CUDA the profiler records CUDA activity only: kernels, memcpy/memset and the
CUDA runtime calls, which carry the launch correlation ids and the blocking sync calls. CPU op
recording roughly doubles a launch-bound step, so steps and phases are timed with
host clocks and written into the trace afterwards. On CPU the profiler records CPU ops, the only
activity there is; their cost is part of the measured overhead.

Synchronisation. The device is synchronised once before the first half, after the last step of
each half and after a step that ends an epoch inside the window, so each segment of steps is
charged with all the work it launched; inside a segment the first half adds no synchronisation.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import threading
import time
from pathlib import Path

import torch

from ..engine.hooks import Hook
from . import analyze as A
from . import markers

log = logging.getLogger("libreyolo")

KERNEL_ROWS = 50  # kept in profile.json; the report shows the top 10


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
    """Installed with `markers.set_recorder` for the window: times every phase of every step."""

    def __init__(self, device: torch.device):
        self.device, self.cuda = device, device.type == "cuda"
        self.synced = False
        self.step = -1  # window step index; the `data` phase opens a step
        self.records: list[tuple] = []  # (step, name, t_enter, t0, t_host, t1, ev0, ev1)
        self.anchors: list[tuple[float, float]] = []  # our own device syncs: clock anchors

    def sync(self) -> float:
        if self.cuda:
            t = time.perf_counter()
            torch.cuda.synchronize(self.device)
            self.anchors.append((t, time.perf_counter()))
        return time.perf_counter()

    @contextlib.contextmanager
    def phase(self, name: str):
        t_enter = time.perf_counter()
        if name == "data":
            self.step += 1
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


class ProfilerHook(Hook):
    """Measures `steps` training steps after skipping `skip`."""

    def __init__(self, skip: int, steps: int, *, stop_after_window: bool = False, print_report: bool = True):
        self.skip, self.steps, self.first = skip, steps, max(1, steps // 2)
        self.stop_after_window, self.print_report = stop_after_window, print_report
        self.state = "skip"  # skip -> first -> second -> done
        self.seen = 0
        self.marks: list[float] = []  # before_step times: the overhead comparison
        self.graph_counts: list[tuple[int, int]] = []  # (replays, captures) at each mark
        self.window: list[dict] = []  # one record per window step
        self.profile: dict | None = None
        self.recorder: _Recorder | None = None
        self.prof = None

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
        if self.state == "done":
            return
        self.marks.append(time.perf_counter())
        graphs = getattr(trainer, "graphs", None)
        self.graph_counts.append((getattr(graphs, "replayed_steps", 0), getattr(graphs, "captures", 0)))
        if self.state != "skip":
            self.window.append({"iteration": trainer.iteration, "epoch": trainer.epoch})

    def after_step(self, trainer) -> None:
        if self.state == "done":
            return
        self.seen += 1
        if self.state == "skip":
            if self.seen == self.skip:
                self._begin(trainer)
            return
        rec = self.window[-1]
        rec["half"], rec["t_after"] = (1 if self.state == "first" else 2), time.perf_counter()
        n = len(self.window)
        if self.state == "second" or n == self.first or trainer.batch_index + 1 == trainer.steps_per_epoch:
            rec["t_end"] = self.recorder.sync()  # a segment ends: all the work it launched is done
        if n == self.first:
            self.recorder.synced, self.state = True, "second"
        elif n == self.steps:
            self._finish(trainer)

    def after_epoch(self, trainer) -> None:
        if self.state != "done":
            return
        if self.profile is not None and self.print_report:
            from .report import print_report

            print_report(self.profile)
        trainer.remove_hook(self)

    def after_train(self, trainer) -> None:
        if self.state == "done":
            return
        self._stop()
        log.warning(f"profile: training ended {len(self.window)} steps into the {self.steps}-step window "
                    f"(after {min(self.seen, self.skip)} of {self.skip} skipped steps); no profile written: "
                    f"train longer or lower profile_skip/profile_steps")

    # --- window -----------------------------------------------------------------------------------
    def _begin(self, trainer) -> None:
        try:
            self._start(trainer)
        except Exception as exc:  # e.g. another profiler is already running: never end the run
            if os.environ.get("LIBREYOLO_DEBUG"):
                raise
            markers.set_recorder(None)
            self.state = "done"
            log.warning(f"profile: the PyTorch profiler did not start ({type(exc).__name__}: {exc}); "
                        f"no profile written, training continues")

    def _start(self, trainer) -> None:
        from torch.profiler import ProfilerActivity, profile

        # Kineto writes straight to stderr, into the middle of our report: an error line on CPU-only
        # machines ("gpuGetDeviceCount failed", level 4) and, in newer torch, a "USDT: ...
        # profiler_start" / "profiler_stop" marker pair (level 5). 6 is above every level; Kineto
        # reads it at each start. A user's own setting is kept.
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
        self.cuda = trainer.device.type == "cuda"
        self.recorder = _Recorder(trainer.device)
        t = time.perf_counter()
        self.prof = profile(activities=[ProfilerActivity.CUDA if self.cuda else ProfilerActivity.CPU])
        self.prof.start()
        self.start_s = time.perf_counter() - t
        self.recorder.sync()
        self.clock = _clock_pair()
        self.tid, self.pid = threading.get_native_id(), os.getpid()
        markers.set_recorder(self.recorder)
        self.state = "first"

    def _stop(self) -> float:
        markers.set_recorder(None)
        t = time.perf_counter()
        if self.prof is not None:
            self.prof.stop()
        return time.perf_counter() - t

    def _finish(self, trainer) -> None:
        stop_s = self._stop()
        self.state = "done"
        if self.stop_after_window:
            trainer.stop = True
        t = time.perf_counter()
        try:
            self._analyse_and_write(trainer, stop_s, t)
        except Exception as exc:  # never let the profiler end a training run
            if os.environ.get("LIBREYOLO_DEBUG"):
                raise
            log.warning(f"profile: analysis failed ({type(exc).__name__}: {exc}); training continues")

    def _analyse_and_write(self, trainer, stop_s: float, t_analysis: float) -> None:
        from . import artifacts, timeline

        run_dir = Path(trainer.run_dir)
        raw = run_dir / ".profile_trace.kineto.json"
        self.prof.export_chrome_trace(str(raw))
        trace = A.load_trace(raw)
        raw.unlink(missing_ok=True)
        steps = self._measure(trace)
        window = {"skip": self.skip, "steps": self.steps, "first_half": self.first,
                  "second_half": self.steps - self.first, "first_iteration": steps[0]["iteration"],
                  "last_iteration": steps[-1]["iteration"]}
        profile = assemble(trainer, steps, trace, self.tid, window, self._overhead())
        profile["overhead"].update(start_s=self.start_s, stop_s=stop_s,
                                   export_analysis_s=time.perf_counter() - t_analysis)
        gantt = timeline.gantt_events(trace, steps, self.cuda, self.tid)  # before our annotations join
        artifacts.annotate_trace(trace, steps, self.pid, self.tid)
        artifacts.write_all(run_dir, profile, trace, timeline.render(profile, gantt))
        self.profile = profile

    def _measure(self, trace: dict) -> list[dict]:
        """The window's step records, with phases, in trace-clock microseconds."""
        perf0, unix_ns = self.clock
        base_ns = int(trace.get("baseTimeNanoseconds", 0))
        origin_us = (unix_ns - base_ns) / 1e3

        def us(p: float, corr: float = 0.0) -> float:
            return origin_us + (p - perf0) * 1e6 + corr

        corr = A.clock_correction(trace, [(us(a), us(b)) for a, b in self.recorder.anchors])
        by_step: dict[int, list[tuple]] = {}
        for r in self.recorder.records:
            by_step.setdefault(r[0], []).append(r)
        starts = [by_step[k][0][2] for k in range(len(self.window))]
        steps = []
        for k, rec in enumerate(self.window):
            closed = "t_end" in rec
            cpu_end = rec["t_after"] if closed else starts[k + 1]
            end = rec["t_end"] if closed else starts[k + 1]
            phases = []
            for _, name, _, t0, t_host, t1, ev0, ev1 in by_step[k]:
                phases.append({"name": name, "ts": us(t0, corr), "host_end": us(t_host, corr), "end": us(t1, corr),
                               "cpu_ms": (t_host - t0) * 1e3, "wall_ms": (t1 - t0) * 1e3,
                               "gpu_ms": ev0.elapsed_time(ev1) if ev0 is not None else None})
            data = next(p for p in phases if p["name"] == "data")
            steps.append({"iteration": rec["iteration"], "epoch": rec["epoch"], "half": rec["half"],
                          "ts": us(starts[k], corr), "cpu_end": us(cpu_end, corr), "end": us(end, corr),
                          "wall_ms": (end - starts[k]) * 1e3, "data_ms": data["cpu_ms"], "phases": phases})
        return steps

    def _overhead(self) -> dict:
        """Median step interval of the profiled first half against unprofiled skip steps of the
        same kind.

        Intervals between consecutive `before_step` calls. The reference leaves out the first skip
        step (warm-up), any interval that contains one of our boundary syncs or the profiler's
        start, a step that captured a CUDA graph, and steps of the other kind: under cuda_graph
        the skip steps before the capture run eager, and comparing those with replayed window
        steps would report the graph's speed-up as a negative overhead.
        """
        iv = [b - a for a, b in zip(self.marks, self.marks[1:])]
        replayed = [b[0] > a[0] for a, b in zip(self.graph_counts, self.graph_counts[1:])]
        captured = [b[1] > a[1] for a, b in zip(self.graph_counts, self.graph_counts[1:])]
        window = range(self.skip, self.skip + self.first - 1)
        prof = [iv[i] * 1e3 for i in window if i < len(iv)]
        graphed = sum(replayed[i] for i in window if i < len(iv)) * 2 > len(prof)  # the window's kind
        ref = [iv[i] * 1e3 for i in range(1, max(self.skip - 1, 1))
               if i < len(iv) and not captured[i] and replayed[i] == graphed]
        out = {"reference_ms": ref, "profiled_ms": prof, "fraction": None, "graphed": graphed}
        if ref and prof:
            out["fraction"] = A.stats(prof)["median"] / A.stats(ref)["median"] - 1.0
        elif graphed:
            out["note"] = ("no replayed CUDA-graph step among the skipped steps to compare with: raise "
                           "profile_skip (capture happens at a shape's third step)")
        else:
            out["note"] = "needs profile_skip >= 3 and profile_steps >= 4 to compare step times"
        return out


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


def assemble(trainer, steps: list[dict], trace: dict, tid: int, window: dict, overhead: dict) -> dict:
    """profile.json's content: run metadata, window, per-step records, phases, kernels, verdict."""
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
    figures = A.analyse_first_half(steps, events, syncs, cuda, trainer.cfg.workers, trainer.precision.describe(),
                                   graphed=bool(overhead.get("graphed")), mode=mode, designed_syncs=designed)
    A.second_half_phases(steps, events, cuda)
    memory = _memory(device)
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
            "steps": [A.public_step(s) for s in steps], "memory": memory, "overhead": overhead}


def _kernel_table(trace: dict, events: list[dict], steps: list[dict], cuda: bool, tid: int) -> dict:
    """Kernels launched by the window's steps (CPU runs: top-level ops of the training thread)."""
    spans = [(s["ts"], s["cpu_end"]) for s in steps]
    if cuda:
        kernels = [e for e in events if e["cat"] == "kernel"]
        rows = ((e["name"], e["end"] - e["ts"]) for g in A.launched_in(kernels, spans) for e in g)
    else:
        ops = A.top_level(A.cpu_ops(trace, tid))
        rows = ((ev["name"], float(ev.get("dur", 0))) for g in A.launched_in(
            [{**ev, "launch": float(ev["ts"])} for ev in ops], spans) for ev in g)
    return {"kind": "kernel" if cuda else "cpu_op", "rows": A.aggregate(rows, KERNEL_ROWS)}


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


def _run_metadata(trainer) -> dict:
    cfg, device = trainer.cfg, trainer.device
    cuda = device.type == "cuda"
    return {"mode": loop_mode(trainer), "model": cfg.model, "family": trainer.family.name, "size": trainer.size,
            "arch": trainer.arch, "data": trainer.data_cfg.name,
            "device": str(device), "device_name": torch.cuda.get_device_name(device) if cuda else "cpu",
            "torch": torch.__version__, "cuda": torch.version.cuda if cuda else None,
            "batch": cfg.batch, "imgsz": cfg.imgsz, "workers": cfg.workers, "cache": cfg.cache,
            "precision": trainer.precision.describe(), "channels_last": cfg.channels_last,
            "cuda_graph": _graph_state(trainer), "run_dir": str(trainer.run_dir)}
