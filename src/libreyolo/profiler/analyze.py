"""A window's figures: from its step records and its trace to utilisation, idle and the verdict.

Nothing here imports torch or model code: `libreyolo profile summary|phases|kernels|what-if|ops`
and the tests use it on plain JSON. Times are microseconds on the trace's clock unless a name ends
in `_ms`.

The window (window.py) has an unrecorded timed segment (`half` 0: no activity recording, CUDA
events only), a recorded unsynchronised half (1) and a recorded synchronised half (2). The
verdict reads the first two. W is the mean step time of the timed steps, which the profiler's own
per-launch cost cannot lengthen; B the mean busy union of the kernels each recorded
unsynchronised step launched (kernel durations barely move under the profiler: the cost is on
the host); U = B / W the utilisation and I = W - B the idle time. A window without timed steps
of its kind (a CUDA graph captured in all of them) falls back to the recorded steps' time, and
`utilisation.basis` says so.

The trace arithmetic is in trace.py, the verdict's rules and thresholds in verdict.py.
"""

from __future__ import annotations

import math

from ..markers import PHASES_BY_MODE

# The trace arithmetic and the verdict were this module's until they got their own; `analyze` stays
# the one import for its callers (`from libreyolo.profiler import analyze as A`).
from .trace import (  # noqa: F401
    BUSY_CATEGORIES,
    CPU_SYNC_OPS,
    HOST_CATEGORIES,
    LAUNCH_CATEGORIES,
    MALLOC_CALLS,
    OPS_ROWS,
    SYNC_CALLS,
    Span,
    aggregate,
    alloc_calls,
    busy_events,
    clock_correction,
    cpu_ops,
    gpu_intervals,
    host_ops,
    idle_split,
    in_spans,
    launched_in,
    load_trace,
    merge,
    snap,
    stats,
    step_threads,
    sync_times,
    thread_slices,
    top_level,
    union_length,
)
from .verdict import (  # noqa: F401
    ALLOC_CALLS_PER_STEP,
    ALLOC_RETRIES,
    COMPUTE_BOUND_UTIL,
    HOST_SYNCS_PER_STEP,
    LAUNCH_GAP_US,
    NEAR_LIMIT_FRAC,
    THRESHOLDS,
    memory_signals,
    verdict,
)


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
                   designed_syncs: float = 0.0, allocator: dict | None = None, cache: str | None = None,
                   whole_step: bool = False, whole_reason: str | None = None, compiled: bool = False) -> dict:
    """The window's utilisation, idle split and verdict (per-step figures are filled into `steps`
    too): step time, data wait and host phase times from the timed steps, kernels, syncs and the
    gap split from the recorded unsynchronised half (the module docstring). `graphed`: the window's
    steps replayed a CUDA graph, and `whole_step` whole-step graphs (cuda_graph=full); `whole_reason`:
    why cuda_graph=full would not help the training step, "" where switching it on would capture
    the step, None where not known; `compiled`: the run has compile=true;
    `mode`: "train" or "infer" (the step that was measured); `allocator`: the figures of
    `memory_signals` (CUDA)."""
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
         "cache": cache, "graphed": graphed, "whole_step": whole_step, "whole_reason": whole_reason,
         "compiled": compiled, "mode": mode, "designed_syncs_per_step": designed_syncs, **(allocator or {})}
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
