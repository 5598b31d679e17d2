"""Trace arithmetic: intervals, and what a Chrome (Kineto) trace says a window did.

Nothing here imports torch or model code: the profiler, the step benchmark (bench.py) and the
`profile` subcommands that read artifacts use it on plain JSON. Times are microseconds on the
trace's clock unless a name ends in `_ms`.

Busy time: per device, the union of `kernel`, `gpu_memcpy` and `gpu_memset`
intervals over all streams; never `gpu_user_annotation` spans, which run from the first to the
last GPU op of a CPU range and so count idle gaps as busy. A kernel belongs to the step whose CPU
span *launched* it (joined through the correlation id), not to the step during which it ran: an
unsynchronised CPU runs ahead of the GPU, and attributing by launch makes a window's busy time
the work that window asked for. Kernels that start before their own launch are dropped (repeated
profiler recordings in one process corrupt the first timestamps, pytorch issue 192021).
"""

from __future__ import annotations

import json
import statistics
from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from pathlib import Path

from .verdict import LAUNCH_GAP_US

BUSY_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
LAUNCH_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})
HOST_CATEGORIES = frozenset({"cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "python_function"})
# Runtime/driver calls that block the host until the GPU catches up. `.item()`, `.cpu()` and
# `.tolist()` of a CUDA tensor, `nonzero` and boolean-mask indexing all end in one of these.
SYNC_CALLS = frozenset({
    "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy",
    "cudaMemcpy2D", "cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize", "cuMemcpyDtoH",
    "cuMemcpyDtoH_v2"})
# On a CPU run nothing blocks, so we count the ops that *would* block on a GPU: reading a scalar
# (`.item()`, `float(t)`, `bool(t)`) and ops whose output size depends on the data.
CPU_SYNC_OPS = frozenset({"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select"})

# Device-memory calls of the CUDA runtime and driver: the caching allocator's cudaMalloc/cudaFree,
# expandable segments' cuMem* mapping calls, and allocations that bypass the cache.
MALLOC_CALLS = frozenset({
    "cudaMalloc", "cudaFree", "cudaMallocAsync", "cudaFreeAsync", "cuMemAlloc_v2", "cuMemFree_v2",
    "cuMemCreate", "cuMemRelease", "cuMemMap", "cuMemUnmap"})
OPS_ROWS = 30  # host operators kept in profile.json's host_ops table

Span = tuple[float, float]


# --- intervals ----------------------------------------------------------------------------------
def merge(intervals: Iterable[Span]) -> list[Span]:
    """Sorted, non-overlapping union of `(start, end)` intervals (empty ones dropped)."""
    out: list[Span] = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def union_length(intervals: Iterable[Span], lo: float = float("-inf"), hi: float = float("inf")) -> float:
    """Total length covered by `(start, end)` intervals, clipped to [lo, hi]; overlaps count once."""
    return sum(e - s for s, e in merge((max(s, lo), min(e, hi)) for s, e in intervals))


def _gaps(busy: list[Span], lo: float, hi: float) -> list[Span]:
    """The complement of merged `busy` within [lo, hi]."""
    out, cur = [], lo
    for s, e in busy[max(bisect_right(busy, (lo, float("inf"))) - 1, 0):]:
        if s >= hi:
            break
        if e <= cur:
            continue
        if s > cur:
            out.append((cur, s))
        cur = max(cur, e)
    if cur < hi:
        out.append((cur, hi))
    return out


def idle_split(busy: list[Span], spans: list[Span], waits: list[Span],
               short_us: float = LAUNCH_GAP_US) -> tuple[float, float]:
    """(short, long) idle time inside `spans` and outside `waits`, by gap length; `busy` merged."""
    short = long = 0.0
    for lo, hi in spans:
        for s, e in _gaps(busy, lo, hi):
            pieces = [(s, e)]
            for ws, we in waits:
                if we > s and ws < e:
                    pieces = [p for a, b in pieces for p in ((a, min(b, ws)), (max(a, we), b)) if p[1] > p[0]]
            for a, b in pieces:
                if b - a < short_us:
                    short += b - a
                else:
                    long += b - a
    return short, long


def snap(points: list[float], slices: list[Span]) -> list[float]:
    """Move each point that falls strictly inside one of the merged `slices` to its nearer edge.

    Our step/phase spans come from host clocks mapped onto the trace clock (a few us of error);
    snapping keeps them strictly nested with the profiler's own slices on the same thread, which
    Perfetto and HTA require. Order is preserved: two points in one slice never swap sides.
    """
    out = []
    for p in points:
        i = bisect_right(slices, (p, float("inf"))) - 1
        if i >= 0 and slices[i][0] < p < slices[i][1]:
            s, e = slices[i]
            p = s if p - s <= e - p else e
        out.append(p)
    return out


def in_spans(times: list[float], spans: list[Span]) -> list[int]:
    """How many of the sorted `times` fall in each [lo, hi) span."""
    return [bisect_left(times, hi) - bisect_left(times, lo) for lo, hi in spans]


# --- trace events -------------------------------------------------------------------------------
def load_trace(trace: dict | str | Path) -> dict:
    return trace if isinstance(trace, dict) else json.loads(Path(trace).read_text())


def busy_events(trace: dict | str | Path, device: int | None = None) -> list[dict]:
    """Kernel/memcpy/memset events as {ts, end, launch, name, cat, stream}, sorted by start."""
    events = load_trace(trace).get("traceEvents", [])
    launches = {}
    for ev in events:
        if ev.get("ph") == "X" and ev.get("cat") in LAUNCH_CATEGORIES:
            corr = (ev.get("args") or {}).get("correlation")
            if corr is not None:
                launches[corr] = float(ev["ts"])
    out = []
    for ev in events:
        if ev.get("ph") != "X" or ev.get("cat") not in BUSY_CATEGORIES:
            continue
        args = ev.get("args") or {}
        if device is not None and args.get("device", ev.get("pid")) != device:
            continue
        ts = float(ev["ts"])
        launch = launches.get(args.get("correlation"))
        if launch is not None and ts < launch:
            continue
        out.append({"ts": ts, "end": ts + float(ev.get("dur", 0.0)), "launch": ts if launch is None else launch,
                    "name": str(ev.get("name", "")), "cat": ev["cat"], "stream": args.get("stream", ev.get("tid"))})
    out.sort(key=lambda e: e["ts"])
    return out


def gpu_intervals(trace: dict | str | Path, device: int | None = None) -> list[Span]:
    """(start, end) in microseconds of every kernel/memcpy/memset event of a Chrome trace."""
    return [(e["ts"], e["end"]) for e in busy_events(trace, device)]


def launched_in(events: list[dict], spans: list[Span]) -> list[list[dict]]:
    """The busy events launched within each [lo, hi) span."""
    out: list[list[dict]] = [[] for _ in spans]
    starts = [lo for lo, _ in spans]
    for ev in events:
        i = bisect_right(starts, ev["launch"]) - 1
        if i >= 0 and ev["launch"] < spans[i][1]:
            out[i].append(ev)
    return out


def cpu_ops(trace: dict, tid: int | None = None) -> list[dict]:
    """`cpu_op` slices (optionally of one thread), sorted by start, outermost first on ties."""
    ops = [ev for ev in trace.get("traceEvents", []) if ev.get("ph") == "X" and ev.get("cat") == "cpu_op"
           and (tid is None or ev.get("tid") == tid)]
    return sorted(ops, key=lambda ev: (float(ev["ts"]), -float(ev.get("dur", 0.0))))


def top_level(slices: list[dict]) -> list[dict]:
    """The outermost of sorted slices on one thread (children end inside their parent)."""
    out, end = [], float("-inf")
    for ev in slices:
        ts = float(ev["ts"])
        if ts >= end:
            out.append(ev)
            end = ts + float(ev.get("dur", 0.0))
    return out


def thread_slices(trace: dict, tid: int) -> list[Span]:
    """Outermost host slices the profiler recorded on thread `tid` (ops, runtime calls), sorted."""
    mine = sorted((ev for ev in trace.get("traceEvents", []) if ev.get("ph") == "X" and ev.get("tid") == tid
                   and ev.get("cat") in HOST_CATEGORIES),
                  key=lambda ev: (float(ev["ts"]), -float(ev.get("dur", 0.0))))
    return [(float(ev["ts"]), float(ev["ts"]) + float(ev.get("dur", 0.0))) for ev in top_level(mine)]


def sync_times(trace: dict, tid: int | None = None) -> list[float]:
    """Sorted start times of host syncs: blocking CUDA calls on GPU traces, would-be syncs on CPU.

    With `tid`, only that thread's (the training loop's): a sync on the pin-memory thread blocks
    nobody. If the trace has no host events on `tid` at all (thread ids recorded differently), all
    threads count rather than none.
    """
    events = [ev for ev in trace.get("traceEvents", []) if ev.get("ph") == "X"]
    if any(ev.get("cat") in LAUNCH_CATEGORIES for ev in events):
        hits = [ev for ev in events if ev.get("cat") in LAUNCH_CATEGORIES and ev.get("name") in SYNC_CALLS]
    else:
        hits = [ev for ev in events if ev.get("cat") == "cpu_op" and ev.get("name") in CPU_SYNC_OPS]
    if tid is not None and any(ev.get("tid") == tid and ev.get("cat") in HOST_CATEGORIES for ev in events):
        hits = [ev for ev in hits if ev.get("tid") == tid]
    return sorted(float(ev["ts"]) for ev in hits)


def alloc_calls(trace: dict, spans: list[Span]) -> list[tuple[int, float]]:
    """(calls, total us) of device-memory runtime/driver calls (MALLOC_CALLS) starting in each
    [lo, hi) span, any thread (backward allocates on autograd's device thread)."""
    hits = sorted((float(ev["ts"]), float(ev.get("dur", 0.0))) for ev in trace.get("traceEvents", [])
                  if ev.get("ph") == "X" and ev.get("cat") in LAUNCH_CATEGORIES and ev.get("name") in MALLOC_CALLS)
    times = [t for t, _ in hits]
    out = []
    for lo, hi in spans:
        i, j = bisect_left(times, lo), bisect_left(times, hi)
        out.append((j - i, sum(d for _, d in hits[i:j])))
    return out


def step_threads(trace: dict, tid: int) -> set:
    """The threads a training or inference step's host work runs on: the loop's `tid`, and the
    threads that run autograd's backward functions (the engine's device threads on CUDA). A
    pin-memory thread works beside the step, not in it, and is left out."""
    out = {tid}
    for ev in trace.get("traceEvents", []):
        if ev.get("ph") == "X" and ev.get("cat") == "cpu_op" and \
                str(ev.get("name", "")).startswith("autograd::engine::evaluate_function"):
            out.add(ev.get("tid"))
    return out


def host_ops(trace: dict, threads: set, spans: list[Span] | None, steps: int, top: int | None = OPS_ROWS) -> dict:
    """The host operators by CPU time per step: `cpu_op` slices on `threads` that start inside
    one of the sorted, disjoint `spans` (None: anywhere in the trace), over `steps` steps.

    Per name: calls, self time (the slice less the slices nested in it on its thread: the op's own
    Python, dispatch and launch cost) and total time (counted at the outermost slice of that name,
    so a recursive op is not counted twice), each per step, and the share of all ops' self time.
    """
    los = [lo for lo, _ in spans] if spans is not None else None

    def inside(ts: float) -> bool:
        if los is None:
            return True
        i = bisect_right(los, ts) - 1
        return i >= 0 and ts < spans[i][1]

    agg: dict[str, list[float]] = {}
    for tid in threads:
        stack: list[list] = []  # open slices: [end, name, nested us]
        open_names: dict[str, int] = {}
        seen = []
        for ev in cpu_ops(trace, tid):
            ts, dur, name = float(ev["ts"]), float(ev.get("dur", 0.0)), str(ev.get("name", ""))
            while stack and stack[-1][0] <= ts:
                open_names[stack.pop()[1]] -= 1
            if stack:
                stack[-1][2] += dur
            entry = [ts + dur, name, 0.0]
            seen.append((ts, dur, entry, open_names.get(name, 0) == 0))
            stack.append(entry)
            open_names[name] = open_names.get(name, 0) + 1
        for ts, dur, entry, outermost in seen:
            if inside(ts):
                row = agg.setdefault(entry[1], [0, 0.0, 0.0])
                row[0] += 1
                row[1] += max(dur - entry[2], 0.0)
                row[2] += dur if outermost else 0.0
    n = max(steps, 1)
    total_self = sum(r[1] for r in agg.values())
    rows = [{"name": k, "calls_per_step": v[0] / n, "self_ms_per_step": v[1] / 1e3 / n,
             "total_ms_per_step": v[2] / 1e3 / n, "self_share": v[1] / total_self if total_self else 0.0}
            for k, v in agg.items()]
    rows.sort(key=lambda r: (-r["self_ms_per_step"], r["name"]))
    return {"steps": steps, "self_ms_per_step": total_self / 1e3 / n, "ops": len(rows),
            "rows": rows if top is None else rows[:top]}


def clock_correction(trace: dict, anchors: list[Span], tolerance_us: float = 20_000.0) -> float:
    """Median offset (trace - ours) between our own device syncs and the trace's records of them.

    Our timestamps are host clocks mapped to the trace clock; the `cudaDeviceSynchronize` calls we
    make ourselves are anchors present in both. 0.0 when there are none (CPU runs).
    """
    mids = sorted(float(ev["ts"]) + float(ev.get("dur", 0.0)) / 2 for ev in trace.get("traceEvents", [])
                  if ev.get("ph") == "X" and ev.get("cat") in LAUNCH_CATEGORIES
                  and ev.get("name") in ("cudaDeviceSynchronize", "cuCtxSynchronize"))
    diffs = []
    for lo, hi in anchors:
        mid = (lo + hi) / 2
        i = bisect_left(mids, mid)
        near = [mids[j] for j in (i - 1, i) if 0 <= j < len(mids)]
        if near:
            best = min(near, key=lambda m: abs(m - mid))
            if abs(best - mid) <= tolerance_us:
                diffs.append(best - mid)
    return statistics.median(diffs) if diffs else 0.0


# --- tables and figures -------------------------------------------------------------------------
def aggregate(rows: Iterable[tuple[str, float]], top: int | None = 10) -> list[dict]:
    """(name, duration us) pairs grouped by name: count, total ms, mean us, share of the total."""
    agg: dict[str, list[float]] = {}
    for name, dur in rows:
        agg.setdefault(name, []).append(dur)
    total = sum(sum(v) for v in agg.values()) or 1.0
    out = [{"name": k, "count": len(v), "total_ms": sum(v) / 1e3, "mean_us": sum(v) / len(v),
            "share": sum(v) / total} for k, v in agg.items()]
    out.sort(key=lambda r: (-r["total_ms"], r["name"]))
    return out if top is None else out[:top]


def stats(values: Iterable[float | None]) -> dict:
    """mean, std (sample), median, min, max of the non-None values; all None when there are none."""
    v = [float(x) for x in values if x is not None]
    if not v:
        return {"mean": None, "std": None, "median": None, "min": None, "max": None, "n": 0}
    return {"mean": statistics.fmean(v), "std": statistics.stdev(v) if len(v) > 1 else 0.0,
            "median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}
