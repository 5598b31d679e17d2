"""Trace arithmetic shared by the profiler and the step benchmark (no model code imported).

Busy time follows GPU_NOTES.md: per device, the union of `kernel`, `gpu_memcpy` and `gpu_memset`
intervals over all streams, clipped to the window; never `gpu_user_annotation` spans, which run
from the first to the last GPU op of a CPU range and so count idle gaps as busy.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

BUSY_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})


def union_length(intervals: Iterable[tuple[float, float]], lo: float = float("-inf"),
                 hi: float = float("inf")) -> float:
    """Total length covered by `(start, end)` intervals, clipped to [lo, hi]; overlaps count once."""
    clipped = sorted((max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi)
    total, cur_s, cur_e = 0.0, None, None
    for s, e in clipped:
        if e <= s:
            continue
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def gpu_intervals(trace: dict | str | Path) -> list[tuple[float, float]]:
    """(start, end) in microseconds of every kernel/memcpy/memset event of a Chrome trace."""
    if not isinstance(trace, dict):
        trace = json.loads(Path(trace).read_text())
    out = []
    for ev in trace.get("traceEvents", []):
        if ev.get("ph") == "X" and ev.get("cat") in BUSY_CATEGORIES:
            start = float(ev["ts"])
            out.append((start, start + float(ev.get("dur", 0.0))))
    return out


def kernel_table(trace: dict, top: int = 10) -> list[dict]:
    """Kernels aggregated by name: count, total and mean microseconds, share of kernel time."""
    agg: dict[str, list[float]] = {}
    for ev in trace.get("traceEvents", []):
        if ev.get("ph") == "X" and ev.get("cat") == "kernel":
            agg.setdefault(ev["name"], []).append(float(ev.get("dur", 0.0)))
    total = sum(sum(v) for v in agg.values()) or 1.0
    rows = [{"name": k, "count": len(v), "total_us": sum(v), "mean_us": sum(v) / len(v),
             "share": sum(v) / total} for k, v in agg.items()]
    rows.sort(key=lambda r: -r["total_us"])
    return rows[:top]
