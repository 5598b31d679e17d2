"""Trace arithmetic and the verdict, shared by the profiler and the step benchmark.

Nothing here imports torch or model code: `libreyolo profile summary|phases|kernels|what-if|ops`
and the tests use it on plain JSON. Times are microseconds on the trace's clock unless a name ends
in `_ms`.

Busy time: per device, the union of `kernel`, `gpu_memcpy` and `gpu_memset`
intervals over all streams; never `gpu_user_annotation` spans, which run from the first to the
last GPU op of a CPU range and so count idle gaps as busy. A kernel belongs to the step whose CPU
span *launched* it (joined through the correlation id), not to the step during which it ran: an
unsynchronised CPU runs ahead of the GPU, and attributing by launch makes a window's busy time
the work that window asked for. Kernels that start before their own launch are dropped (repeated
profiler sessions in one process corrupt the first timestamps, pytorch issue 192021).

The window (window.py) has an unrecorded timed segment (`half` 0: no activity recording, CUDA
events only), a recorded unsynchronised half (1) and a recorded synchronised half (2). The
verdict reads the first two. W is the mean step time of the timed steps, which the profiler's own
per-launch cost cannot lengthen; B the mean busy union of the kernels each recorded
unsynchronised step launched (kernel durations barely move under the profiler: the cost is on
the host); U = B / W the utilisation and I = W - B the idle time. A window without timed steps
of its kind (a CUDA graph captured in all of them) falls back to the recorded steps' time, and
`utilisation.basis` says so.

1. `memory-bound` when the caching allocator shows pressure (the allocator's counters over the
   timed and recorded steps, the trace's runtime calls in the recorded ones, the reserved memory
   at the window's edges): at least ALLOC_RETRIES (1) retry, i.e. a failed cudaMalloc after which
   the allocator synchronised, freed its cached blocks and tried again; or at least
   ALLOC_CALLS_PER_STEP (1.0) cudaMalloc/cudaFree (cuMemMap/cuMemUnmap under expandable
   segments) per step, where a warm caching allocator serves a steady step from its cache with
   none (PyTorch CUDA semantics notes: the cache makes frees "without device synchronizations");
   or reserved memory at least NEAR_LIMIT_FRAC (0.95) of the allocator's limit (the device's
   memory times the per-process fraction). It comes first: allocator pressure changes what every
   other lever does (a larger batch, the compute-bound lever, would not fit; a retry's device
   sync and cudaFree calls would read as host-bound gaps).
2. `compute-bound` when U >= COMPUTE_BOUND_UTIL (0.80). Above 80 % busy, removing every idle
   microsecond wins at most 1.25x, while faster kernels (bf16/fp16 tensor cores, a larger batch
   that amortises fixed per-kernel costs) commonly win 1.5-3x: the kernels are the prize.
3. `dataloader-bound` when the wait for the next batch (time blocked in `next(loader)`, capped at
   I) is at least as large as each idle class below: it is the biggest single piece of idle.
4. The idle time outside data waits is split by gap length in the recorded steps, and that split
   is applied to the timed steps' idle (the recorded gaps carry the profiler's host cost). A gap
   shorter than LAUNCH_GAP_US (100 us) is what launching costs: an eager op is ~5-30 us of Python,
   dispatcher and cudaLaunchKernel, so a sub-100 us gap is a few launches back to back. Longer
   gaps mean the CPU did something else (Python logic, a CPU-side assigner, allocator work,
   waiting on a sync). `host-bound` when host syncs per step >= HOST_SYNCS_PER_STEP (1.0; the
   syncs a model makes by design, `model.host_syncs`, not counted) or long-gap idle exceeds
   short-gap idle. The step is meant to be sync-free (the loop's loss read-back once per
   `log_interval` is deferred on CUDA: it waits at most for the previous interval's copy,
   normally long done, and for the device at an epoch's end); a sync every step means the step
   waits on the GPU, which also keeps CUDA graphs from capturing it. `launch-bound` otherwise.

On CPU there are no kernels: U = (W - data wait) / W, and the verdict is `compute-bound` when
U >= COMPUTE_BOUND_UTIL, else `dataloader-bound` (waiting for data is the only idle a CPU step has).

Inference windows (`libreyolo profile infer`, mode "infer") use the same rules and thresholds with
two differences. The step must bring its results to the host: NMS (`nonzero`, data-dependent
shapes) and the copy of the detections sync by design, once per batch, so the syncs inside the
`postprocess` phase do not count towards HOST_SYNCS_PER_STEP (the long gaps they leave still do).
And the levers are inference's: prepare threads (`workers`) and the source's decoding for a data
wait, `cuda_graph=true` (the forward captured at the first batch) for launches, amp and the
batch/imgsz for compute, the batch and conf for postprocess.
"""

from __future__ import annotations

import json
import math
import statistics
from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from pathlib import Path

from ..markers import PHASES_BY_MODE

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

COMPUTE_BOUND_UTIL = 0.80
LAUNCH_GAP_US = 100.0
HOST_SYNCS_PER_STEP = 1.0
ALLOC_RETRIES = 1
ALLOC_CALLS_PER_STEP = 1.0
NEAR_LIMIT_FRAC = 0.95
THRESHOLDS = {"compute_bound_util": COMPUTE_BOUND_UTIL, "launch_gap_us": LAUNCH_GAP_US,
              "host_syncs_per_step": HOST_SYNCS_PER_STEP, "alloc_retries": ALLOC_RETRIES,
              "alloc_calls_per_step": ALLOC_CALLS_PER_STEP, "near_limit_frac": NEAR_LIMIT_FRAC}
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


def memory_signals(f: dict) -> list[str]:
    """The allocator-pressure findings of window figures `f` (empty: none), each one phrase.

    Optional keys: alloc_retries (the caching allocator's retries in the window), alloc_calls_per_step
    (device-memory calls per step), reserved_mb and limit_mb (reserved memory at the window's
    edges, the allocator's limit)."""
    if not f.get("cuda"):
        return []
    out = []
    retries = f.get("alloc_retries") or 0
    if retries >= ALLOC_RETRIES:
        out.append(f"the caching allocator retried {retries} time{'s' if retries != 1 else ''} in the window (a "
                   "cudaMalloc failed: it synchronised, freed its cached blocks and tried again)")
    calls = f.get("alloc_calls_per_step") or 0.0
    if calls >= ALLOC_CALLS_PER_STEP:
        out.append(f"{calls:.1f} cudaMalloc/cudaFree calls per step (a warm caching allocator makes none)")
    reserved, limit = f.get("reserved_mb"), f.get("limit_mb")
    if reserved is not None and limit and reserved >= NEAR_LIMIT_FRAC * limit:
        out.append(f"reserved memory {reserved:.0f} of {limit:.0f} MB ({reserved / limit:.0%} of the allocator's limit)")
    return out


def _memory_verdict(f: dict, signals: list[str]) -> dict:
    """`memory-bound`, with the levers that fit what was seen: capacity (retries, reserved memory
    near the limit) wants less memory per step; churn (allocator calls every step, retries) wants
    fewer allocations per step."""
    infer = f.get("mode") == "infer"
    retries = (f.get("alloc_retries") or 0) >= ALLOC_RETRIES
    near = any(s.startswith("reserved memory") for s in signals)
    churn = retries or (f.get("alloc_calls_per_step") or 0.0) >= ALLOC_CALLS_PER_STEP
    levers = []
    if retries or near:
        levers.append("a smaller batch" if infer else "a smaller batch or imgsz")
        if f.get("precision") == "float32":
            levers.append("amp=true (float16 weights and activations)" if infer else
                          "amp=true (activations in half the bytes)")
    if churn and not retries:
        levers.append("no torch.cuda.empty_cache() or other cache flush inside the step")
    if "expandable_segments:true" not in str(f.get("alloc_conf") or "").replace(" ", "").lower():
        levers.append("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (segments grow in place instead of "
                      "fragmenting into blocks the next step cannot reuse)")
    if churn and not f.get("graphed"):
        levers.append("cuda_graph=true (replays allocate nothing: the graph's private pool is allocated once, at "
                      "capture; it holds about one eager step's peak)")
    reason = "; ".join(signals) + f"; GPU kernels busy {f['utilisation']:.0%} of the step"
    return {"name": "memory-bound", "reason": reason, "lever": "; or ".join(levers)}


def verdict(f: dict) -> dict:
    """The verdict from window figures (see the module docstring for the rules and their order).

    `f` keys: cuda, utilisation, step_ms, data_ms, idle_data_ms, idle_short_ms, idle_long_ms,
    syncs_per_step, kernels_per_step, kernel_median_us, host_phases [(name, ms)], workers, precision;
    optional: graphed, mode ("train" when absent, or "infer"), for "infer"
    postprocess_syncs_per_step, and designed_syncs_per_step (the syncs a training step makes by
    design, `model.host_syncs`: the DETRs' denoising count and matcher), which, like the
    postprocess syncs, do not count towards HOST_SYNCS_PER_STEP; the allocator figures of
    `memory_signals` and alloc_conf (PYTORCH_CUDA_ALLOC_CONF as the run had it).
    """
    signals = memory_signals(f)
    if signals:
        return _memory_verdict(f, signals)
    infer = f.get("mode") == "infer"
    util, data_share = f["utilisation"], f["data_ms"] / max(f["step_ms"], 1e-9)
    if infer:
        wait = (f"the loop waited for the next prepared batch (decode, then letterbox or crop) {data_share:.0%} of "
                f"the step ({f['data_ms']:.1f} of {f['step_ms']:.1f} ms)")
        data_lever = (f"more decode threads (workers={f['workers']} now: each decodes and letterboxes whole "
                      "images), or a source that decodes faster (JPEG rather than PNG, smaller files, frames "
                      "already in memory)")
    else:
        wait = f"the loop waited for the next batch {data_share:.0%} of the step ({f['data_ms']:.1f} of {f['step_ms']:.1f} ms)"
        cache_note = {"ram": "; the images are cached in RAM already)",
                      "n/a": "; this task's loader reads its files, cache does not apply)"}
        data_lever = f"more dataloader workers (workers={f['workers']} now" + cache_note.get(f.get("cache"), ") or cache=ram")
    if util >= COMPUTE_BOUND_UTIL:
        reason = (f"GPU kernels busy {util:.0%} of the step" if f["cuda"] else
                  f"the CPU computes {util:.0%} of the step ({1 - util:.0%} waiting for data)")
        if not f["cuda"]:
            lever = "a CUDA device (amp and CUDA graphs are GPU-only); on CPU, a smaller imgsz or model"
        elif infer and f["precision"] == "float32":
            lever = "amp=true (float16, or amp_dtype=bfloat16), then a larger batch for more images/s"
        elif infer:
            lever = ("a smaller imgsz or model (kernels are already in reduced precision); a larger batch raises "
                     "images/s at the cost of latency")
        elif f["precision"] == "float32":
            lever = "amp=True with amp_dtype=bfloat16 (or float16 before Ampere), then a larger batch"
        else:
            lever = "a larger batch (kernels are already in reduced precision), or a smaller model/imgsz"
        return {"name": "compute-bound", "reason": reason, "lever": lever}
    if not f["cuda"] or f["idle_data_ms"] >= max(f["idle_short_ms"], f["idle_long_ms"]):
        return {"name": "dataloader-bound", "reason": wait, "lever": data_lever}
    top = ", ".join(f"{n} {ms:.1f} ms" for n, ms in f["host_phases"][:3])
    post = f.get("postprocess_syncs_per_step", 0.0)  # inference's syncs by design (module docstring)
    designed = f.get("designed_syncs_per_step", 0.0)  # a training step's by design (model.host_syncs)
    syncs = f["syncs_per_step"] - post - designed
    if infer and (syncs >= HOST_SYNCS_PER_STEP or f["idle_long_ms"] > f["idle_short_ms"]):
        reason = (f"GPU idle {1 - util:.0%} of the step while the CPU does other work: {syncs:.1f} host syncs per "
                  f"step outside postprocess ({post:.1f} in it: NMS and the copy of the results); top host "
                  f"phases: {top}")
        lever = ("remove the host syncs outside postprocess (in the phases above)" if syncs >= HOST_SYNCS_PER_STEP
                 else "a larger batch (postprocess and its syncs are paid once per batch), or a higher conf "
                      "(fewer boxes into NMS)")
        return {"name": "host-bound", "reason": reason, "lever": lever}
    if syncs >= HOST_SYNCS_PER_STEP or f["idle_long_ms"] > f["idle_short_ms"]:
        return {"name": "host-bound",
                "reason": (f"GPU idle {1 - util:.0%} of the step while the CPU does other work: "
                           f"{f['syncs_per_step']:.1f} host syncs per step"
                           + (f" ({designed:g} of them the model's by design)" if designed else "")
                           + f"; top host phases: {top}"),
                "lever": "fix the code path (host syncs, CPU work in those phases); CUDA graphs help little"}
    reason = (f"GPU busy {util:.0%}: idle between {f['kernels_per_step']:.0f} kernels per step "
              f"(median {f['kernel_median_us']:.0f} us) while the CPU launches them")
    if f.get("graphed"):
        # The network already replays as one graph: what still launches one kernel at a time is
        # the eager part of the step (training: loss, its backward, optimizer, EMA; inference: NMS).
        if infer:
            return {"name": "launch-bound", "reason": f"{reason}; the forward already replays as a CUDA graph",
                    "lever": f"a larger batch (amortises the eager postprocess launches; top host phases: {top})"}
        return {"name": "launch-bound", "reason": f"{reason}; the network already runs as a CUDA graph",
                "lever": f"a larger batch (amortises the eager loss/optimizer launches; top host phases: {top})"}
    if infer:
        return {"name": "launch-bound", "reason": reason,
                "lever": "cuda_graph=true (inference capture: the forward replays as one graph), or a larger batch"}
    return {"name": "launch-bound", "reason": reason,
            "lever": "cuda_graph=True (launch the network as one graph), or a larger batch"}


def finite(x: float | None) -> float | None:
    """None for None/NaN/inf, so figures serialise as JSON null."""
    return None if x is None or not math.isfinite(x) else float(x)


# --- a window's figures (window.py measures, these summarise) ------------------------------
def _fill_first_half(first: list[dict], events: list[dict], syncs: list[float], cuda: bool) -> list[list[dict]]:
    """Per-step syncs, kernels and busy ms (CPU: compute ms) into `first`; the events per step."""
    spans = [(s["ts"], s["cpu_end"]) for s in first]
    groups = launched_in(events, spans) if cuda else [[] for _ in first]
    # On CPU the loader's own tensor ops (CPU tensors on a GPU run too) are no would-be syncs.
    sync_spans = spans if cuda else [(next(p["end"] for p in s["phases"] if p["name"] == "data"), s["cpu_end"])
                                     for s in first]
    for s, group, n in zip(first, groups, in_spans(syncs, sync_spans)):
        s["syncs"] = n
        s["kernels"] = sum(e["cat"] == "kernel" for e in group)
        s["busy_ms"] = (union_length((e["ts"], e["end"]) for e in group) / 1e3 if cuda
                        else s["wall_ms"] - s["data_ms"])
    return groups


def timed_steps(steps: list[dict]) -> list[dict]:
    """The unrecorded timed steps (`half` 0) that stand for the window: of its kind (under CUDA
    graphs, replayed steps), none that captured a graph (window.py marks the others `excluded`)."""
    return [s for s in steps if s["half"] == 0 and not s.get("excluded")]


def analyse_window(steps: list[dict], events: list[dict], syncs: list[float], cuda: bool,
                   workers: int, precision: str, graphed: bool = False, mode: str = "train",
                   designed_syncs: float = 0.0, allocator: dict | None = None, cache: str | None = None) -> dict:
    """The window's utilisation, idle split and verdict (per-step figures are filled into `steps`
    too): step time, data wait and host phase times from the timed steps, kernels, syncs and the
    gap split from the recorded unsynchronised half (the module docstring). `graphed`: the window's
    steps replayed a CUDA graph; `mode`: "train" or "infer" (the step that was measured);
    `allocator`: the figures of `memory_signals` (CUDA)."""
    first = [s for s in steps if s["half"] == 1]
    groups = _fill_first_half(first, events, syncs, cuda)
    timed = timed_steps(steps)
    basis_steps = timed or first  # a window with no timed step of its kind: the recorded steps' time
    n, m = len(first), len(basis_steps)
    wall_r = sum(s["wall_ms"] for s in first)
    wall, data = sum(s["wall_ms"] for s in basis_steps) / m, sum(s["data_ms"] for s in basis_steps) / m
    busy_iv = merge((e["ts"], e["end"]) for g in groups for e in g)
    busy = sum(e - s for s, e in busy_iv) / 1e3 / n if cuda else wall - data
    idle_data = min(data, max(wall - busy, 0.0))
    short = long = 0.0
    if cuda:  # the recorded steps' split of their idle by gap length, applied to the timed steps' idle
        waits = [(p["ts"], p["end"]) for s in first for p in s["phases"] if p["name"] == "data"]
        short_r, long_r = idle_split(busy_iv, [(s["ts"], s["end"]) for s in first], waits)
        rest = max(wall - busy - idle_data, 0.0)
        if short_r + long_r > 0:
            short, long = rest * short_r / (short_r + long_r), rest * long_r / (short_r + long_r)
    durs = sorted(e["end"] - e["ts"] for g in groups for e in g if e["cat"] == "kernel")
    host: dict[str, float] = {}
    for p in (p for s in basis_steps for p in s["phases"] if p["name"] != "data"):
        host[p["name"]] = host.get(p["name"], 0.0) + p["cpu_ms"] / m
    f = {"cuda": cuda, "utilisation": busy / max(wall, 1e-9), "step_ms": wall, "data_ms": data,
         "idle_data_ms": idle_data, "idle_short_ms": short, "idle_long_ms": long,
         "syncs_per_step": sum(s["syncs"] for s in first) / n, "kernels_per_step": len(durs) / n,
         "kernel_median_us": stats(durs)["median"] or 0.0,
         "host_phases": sorted(host.items(), key=lambda kv: -kv[1]), "workers": workers, "precision": precision,
         "cache": cache, "graphed": graphed, "mode": mode, "designed_syncs_per_step": designed_syncs, **(allocator or {})}
    where = "unrecorded steps" if timed else "recorded steps: no unrecorded step of the window's kind"
    out = {"basis": (f"kernel busy (recorded steps) / step time ({where})" if cuda else
                     f"(step - data wait) / step time ({where})"),
           "utilisation": f["utilisation"], "busy_ms": busy, "data_ms": data,
           "data_frac": data / max(wall, 1e-9), "step_ms": stats(s["wall_ms"] for s in basis_steps),
           "step_ms_recorded": stats(s["wall_ms"] for s in first),
           "host_step_ms": stats(s.get("host_step_ms") for s in timed)["mean"],
           "timed_steps": len(timed), "recorded_steps": n,
           "idle_data_ms": idle_data, "idle_short_gap_ms": short, "idle_long_gap_ms": long,
           "syncs_per_step": f["syncs_per_step"], "kernels_per_step": f["kernels_per_step"],
           "kernel_median_us": f["kernel_median_us"], "host_phases_ms": dict(f["host_phases"]),
           "designed_syncs_per_step": designed_syncs, "utilisation_recorded": busy * n / max(wall_r, 1e-9)}
    if mode == "infer":
        post = [(p["ts"], p["host_end"]) for s in first for p in s["phases"] if p["name"] == "postprocess"]
        out["postprocess_syncs_per_step"] = f["postprocess_syncs_per_step"] = sum(in_spans(syncs, post)) / n
    out["verdict"] = verdict(f)
    return out


def second_half_phases(steps: list[dict], events: list[dict], cuda: bool) -> None:
    """Kernel busy time per synchronised phase: the work each phase launched."""
    second = [p for s in steps if s["half"] == 2 for p in s["phases"]]
    groups = launched_in(events, [(p["ts"], p["host_end"]) for p in second]) if cuda else [None] * len(second)
    for p, group in zip(second, groups):
        p["busy_ms"] = union_length((e["ts"], e["end"]) for e in group) / 1e3 if group is not None else None


def phase_table(steps: list[dict], mode: str = "train") -> list[dict]:
    """Mean ms per step of each phase of the `mode`'s step (markers.PHASES_BY_MODE): host time
    unsynchronised and unrecorded (the timed steps; without them the recorded first half), synced
    times (second)."""
    first = timed_steps(steps) or [s for s in steps if s["half"] == 1]
    second = [s for s in steps if s["half"] == 2]
    synced_step = sum(s["wall_ms"] for s in second) / max(len(second), 1)
    rows = []
    for name in (*PHASES_BY_MODE[mode], "other"):
        row = {"phase": name, "host_ms": None, "synced_ms": 0.0, "cpu_ms": None, "gpu_ms": None, "busy_ms": None,
               "steps": 0, "share": 0.0}
        if name == "other":  # inside the step, outside every phase: hooks, loss bookkeeping, the loop
            row["synced_ms"] = synced_step - sum(p["wall_ms"] for s in second for p in s["phases"]) / max(len(second), 1)
        else:
            row["host_ms"] = sum(p["cpu_ms"] for s in first for p in s["phases"] if p["name"] == name) / max(len(first), 1)
            mine = [p for s in second for p in s["phases"] if p["name"] == name]
            row["steps"] = len(mine)
            for key in ("wall_ms", "cpu_ms", "gpu_ms", "busy_ms"):
                vals = [p[key] for p in mine if p.get(key) is not None]
                out = "synced_ms" if key == "wall_ms" else key
                row[out] = sum(vals) / max(len(second), 1) if vals else (0.0 if key == "wall_ms" else None)
        row["share"] = row["synced_ms"] / synced_step if synced_step > 0 else 0.0
        rows.append(row)
    return rows


def public_step(s: dict) -> dict:
    out = {k: s[k] for k in ("half", "iteration", "epoch", "wall_ms", "data_ms")}
    if s["half"] == 0:
        out.update(host_step_ms=s["host_step_ms"], host_ms={p["name"]: p["cpu_ms"] for p in s["phases"]},
                   region_ms=s.get("region_ms"), excluded=bool(s.get("excluded")))
    elif s["half"] == 1:
        out.update(busy_ms=s["busy_ms"], kernels=s["kernels"], syncs=s["syncs"],
                   host_ms={p["name"]: p["cpu_ms"] for p in s["phases"]})
    else:
        out["phases"] = {p["name"]: {k: p.get(k) for k in ("wall_ms", "cpu_ms", "gpu_ms", "busy_ms")}
                         for p in s["phases"]}
    return out
