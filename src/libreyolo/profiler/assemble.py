"""From a finished window to profile.json's content.

First the step records: the recorder's phases and stamps (instruments.py) and the hook's per-step
records (window.py) become one record per timed and recorded step, on the trace's clock
(`step_records`), marked by kind (a step that captured a CUDA graph, or an eager step of a graphed
window, is left out of the figures); with them the profiler's own overhead, the allocator's
figures and the host operators' table. Then `assemble`: the run's metadata, the per-step records,
phases, kernels, the captured region, host operators, memory and the verdict (figures and verdict
from analyze.py; the artifacts are written by artifacts.py).
"""

from __future__ import annotations

import os
import resource
import statistics
import time

import torch

from ..engine import fullstep
from . import analyze as A
from . import trace as T
from .instruments import AllocatorWatch, Recorder
from .verdict import THRESHOLDS

KERNEL_ROWS = 50  # kept in profile.json; the report shows the top 10


# --- the step records ---------------------------------------------------------------------------
def trace_clock(clock: tuple[float, int], trace: dict, anchors: list[tuple[float, float]] = ()):
    """perf_counter seconds -> microseconds on `trace`'s clock (corrected by our own syncs), from
    the window's clock pair (instruments.clock_pair)."""
    perf0, unix_ns = clock
    origin_us = (unix_ns - int(trace.get("baseTimeNanoseconds", 0))) / 1e3

    def raw(p: float) -> float:
        return origin_us + (p - perf0) * 1e6

    corr = T.clock_correction(trace, [(raw(a), raw(b)) for a, b in anchors])
    return lambda p: raw(p) + corr

def step_records(rec: Recorder, window: list[dict], clock: tuple[float, int], trace: dict) -> list[dict]:
    """The window's step records (timed and recorded; not the op steps), with phases, in
    trace-clock microseconds where the trace covers them: from the recorder's phases and stamps and
    the hook's per-step records (`window`: segment, graph counts, host times)."""
    us = trace_clock(clock, trace, rec.anchors)
    by_step: dict[int, list[tuple]] = {}
    for r in rec.records:
        by_step.setdefault(r[0], []).append(r)
    measured = [w for w in window if w["seg"] != "ops"]
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
                          "phases": phases, "region_ms": region, **graph_use(w)})
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
                      "region_spans": sorted(spans), **graph_use(w)})
    mark_kind(steps)
    return steps

def overhead(steps: list[dict]) -> dict:
    """The recorded unsynchronised steps' median time against the timed steps' (the same
    steps but for the recording), of the window's kind: a step that captured a CUDA graph, and
    eager steps of a graphed window, are left out (`mark_kind`)."""
    ref = [s["wall_ms"] for s in steps if s["half"] == 0 and not s["excluded"]]
    prof = [s["wall_ms"] for s in steps if s["half"] == 1 and not s["excluded"]]
    graphed = window_graphed(steps)
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

def allocator_figures(watch: AllocatorWatch | None, trace: dict, steps: list[dict]) -> dict | None:
    """The caching allocator over the timed and recorded unsynchronised steps (CUDA; None without
    a watch): its counters' deltas, the trace's device-memory calls, reserved memory and the limit."""
    if watch is None:
        return None
    d = watch.total
    n = sum(s["half"] in (0, 1) and not s["captured"] for s in steps)
    first = [(s["ts"], s["cpu_end"]) for s in steps if s["half"] == 1 and not s["captured"]]
    calls = T.alloc_calls(trace, first)
    trace_calls = sum(c for c, _ in calls) / max(len(first), 1)
    counter_calls = (d["allocs"] + d["frees"]) / max(n, 1)
    props = torch.cuda.get_device_properties(watch.device)
    get_fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)  # newer torch
    fraction = float(get_fraction(watch.device)) if get_fraction is not None else 1.0
    return {"steps": n, "retries": d["retries"], "ooms": d["ooms"], "device_allocs": d["allocs"],
            "device_frees": d["frees"], "counter_calls_per_step": counter_calls,
            "trace_calls_per_step": trace_calls,
            "trace_ms_per_step": sum(t for _, t in calls) / 1e3 / max(len(first), 1),
            "calls_per_step": max(counter_calls, trace_calls), "reserved_mb": watch.reserved / 2**20,
            "limit_mb": props.total_memory * fraction / 2**20, "memory_fraction": fraction,
            "conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")}

def host_op_figures(cuda: bool, window: list[dict], clock: tuple[float, int], tid: int, trace: dict,
                    ops_trace: dict | None, steps: list[dict]) -> dict | None:
    """The host operators per step: from the op steps' CPU-only recording (CUDA), or from the
    recorded unsynchronised steps, which hold CPU ops on a CPU; outside each step's data phase.
    `tid`: the training thread."""
    if cuda:
        ops = [w for w in window if w["seg"] == "ops"]
        if ops_trace is None or not ops:
            return None
        us = trace_clock(clock, ops_trace)
        spans = [(us(w["t_before"]), us(w["t_after"])) for w in ops]
        table = T.host_ops(ops_trace, T.step_threads(ops_trace, tid), spans, len(ops))
        source = (f"{len(ops)} op steps after the window, recorded with CPU activity only (their own "
                  f"profiler recording: CPU-op recording roughly doubles a launch-bound step)")
    else:
        first = [s for s in steps if s["half"] == 1]
        spans = [(next(p["end"] for p in s["phases"] if p["name"] == "data"), s["cpu_end"]) for s in first]
        table = T.host_ops(trace, T.step_threads(trace, tid), spans, len(first))
        source = f"the {len(first)} recorded unsynchronised steps (a CPU window records CPU ops)"
    return {"source": source, **table}


def graph_use(w: dict) -> dict:
    """Whether a window step replayed a CUDA graph, and whether it captured one."""
    (r0, c0), (r1, c1) = w["counts0"], w["counts1"]
    return {"replayed": r1 > r0, "captured": c1 > c0}


def window_graphed(steps: list[dict]) -> bool:
    """The window's kind: most recorded unsynchronised steps replayed a CUDA graph."""
    first = [s for s in steps if s["half"] == 1]
    return sum(s["replayed"] for s in first) * 2 > len(first)


def mark_kind(steps: list[dict]) -> None:
    """`excluded`: a step that captured a CUDA graph, or one of the other kind (eager in a graphed
    window: the first sightings of a shape before its capture)."""
    graphed = window_graphed(steps)
    for s in steps:
        s["excluded"] = s["captured"] or s["replayed"] != graphed


# --- profile.json --------------------------------------------------------------------------------
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
    events = T.busy_events(trace, index)
    syncs = T.sync_times(trace, tid)
    # The syncs a training step makes by design (the DETRs' denoising count and matcher) are named,
    # not held against the step.
    designed = float(getattr(getattr(trainer, "model", None), "host_syncs", 0)) if cuda and mode == "train" else 0.0
    alloc = None if allocator is None else {
        "alloc_retries": allocator["retries"], "alloc_calls_per_step": allocator["calls_per_step"],
        "reserved_mb": allocator["reserved_mb"], "limit_mb": allocator["limit_mb"], "alloc_conf": allocator["conf"]}
    graphed = bool(overhead.get("graphed"))
    whole_on, whole_reason = _whole(trainer, mode)
    figures = A.analyse_window(steps, events, syncs, cuda, trainer.cfg.workers, trainer.precision.describe(),
                               graphed=graphed, mode=mode, designed_syncs=designed, allocator=alloc,
                               cache=cache_mode(trainer), whole_step=graphed and whole_on,
                               whole_reason=whole_reason, compiled=bool(getattr(trainer.cfg, "compile", False)))
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
            "headline": headline, "verdict": v, "utilisation": figures, "thresholds": dict(THRESHOLDS),
            "phases": A.phase_table(steps, mode), "kernels": _kernel_table(trace, events, steps, cuda, tid),
            "capture": _capture_table(trainer, steps, events, cuda, mode), "host_ops": host_ops,
            "steps": [A.public_step(s) for s in steps], "memory": memory, "overhead": overhead}


def _kernel_table(trace: dict, events: list[dict], steps: list[dict], cuda: bool, tid: int) -> dict:
    """Kernels launched by the window's recorded steps (CPU runs: top-level ops of the training thread)."""
    spans = [(s["ts"], s["cpu_end"]) for s in steps if s["half"] > 0]
    if cuda:
        kernels = [e for e in events if e["cat"] == "kernel"]
        rows = ((e["name"], e["end"] - e["ts"]) for g in T.launched_in(kernels, spans) for e in g)
    else:
        ops = T.top_level(T.cpu_ops(trace, tid))
        rows = ((ev["name"], float(ev.get("dur", 0))) for g in T.launched_in(
            [{**ev, "launch": float(ev["ts"])} for ev in ops], spans) for ev in g)
    return {"kind": "kernel" if cuda else "cpu_op", "rows": T.aggregate(rows, KERNEL_ROWS)}


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
               "source": "the step's capturable (model.capturable)",
               "whole": getattr(plan, "whole", "")}  # why cuda_graph=full cannot capture the step, or ""
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
        groups = T.launched_in(events, [(lo, hi) for lo, hi, _ in flat])
        per_step: list[list[dict]] = [[] for _ in first]
        for (_, _, i), g in zip(flat, groups):
            per_step[i] += g
        out["busy_ms"] = statistics.fmean(T.union_length((e["ts"], e["end"]) for e in g) / 1e3 for g in per_step)
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


def whole_step_manager(trainer):
    """The run's whole-step graphs (cuda_graph=full, engine/fullstep.WholeStep), or None."""
    return getattr(getattr(trainer, "ctx", None), "whole", None)


def _whole(trainer, mode: str) -> tuple[bool, str | None]:
    """(the run replays whole-step graphs, why cuda_graph=full would not help it: "" where switching
    it on would capture the step, None where that is not known, as for an inference window)."""
    if mode != "train":
        return False, None
    ctx, family, whole = getattr(trainer, "ctx", None), getattr(trainer, "family", None), whole_step_manager(trainer)
    if whole is not None:
        if whole.enabled:  # on already, whether or not this window's steps replayed it
            return True, "cuda_graph=full is on"
        return False, whole.fallback_reason
    if ctx is None or getattr(family, "capture", None) is None:
        return False, None
    if getattr(trainer.cfg, "cuda_graph", None) == fullstep.FULL:
        return False, "cuda_graph=full was asked for and refused at the start (its log line says why)"
    return False, fullstep.unsupported_reason(ctx, family) or ""


def _graph_state(trainer) -> dict:
    graphs = getattr(trainer, "graphs", None)
    if graphs is None or not callable(getattr(graphs, "stats", None)):
        return {"enabled": False, "replayed_steps": 0, "pool_mb": None}
    s = graphs.stats()
    pool = s.get("pool_mb")
    state = {"enabled": bool(s.get("enabled", True)), "replayed_steps": int(s.get("replayed_steps", 0)),
             "pool_mb": None if pool is None else float(pool)}
    whole = whole_step_manager(trainer)
    if whole is not None:  # cuda_graph=full: its replays are whole steps (the network manager is held)
        w = whole.stats()
        state.update(whole_step=bool(w["enabled"]), replayed_steps=state["replayed_steps"] + w["replayed_steps"])
    return state


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
