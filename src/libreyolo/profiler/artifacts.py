"""The profiler's files, their schema, and reading them back (no torch imported).

A run directory gets four files, each written to a temp file and renamed so nothing half-written
is ever left behind:
- `profile.json`: everything (schema `libreyolo-profile`, versioned; `load_profile` checks it);
- `profile_summary.json`: the headline figures only, with stable keys for CI;
- `profile_trace.json`: the profiler's Chrome trace plus our `ProfilerStep#N` and phase slices
  on the training thread and `distributedInfo.rank`, so Perfetto and HolisticTraceAnalysis load it;
- `timeline.html`: self-contained plots (timeline.py).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ..atomic import write_json_atomic, write_text_atomic
from ..errors import ProfileFormatError
from . import trace as T

SCHEMA = "libreyolo-profile"
SUMMARY_SCHEMA = "libreyolo-profile-summary"
REPEAT_SCHEMA = "libreyolo-profile-repeat"  # profile_repeat.json, the aggregate of `profile run --repeat N`
REPEAT_FILE = "profile_repeat.json"
# 2: the verdict's step time and data wait come from unrecorded timed steps (`steps[].half` 0),
# phases' host_ms too; new `capture`, `host_ops`, `memory.allocator`, `window.timed`/`ops_steps`.
# Version-1 profiles still read (summary, phases, kernels, compare against version 1).
SCHEMA_VERSION = 2
FILES = ("profile.json", "profile_summary.json", "profile_trace.json", "timeline.html")
# The top-level keys every reader relies on, and their JSON types.
REQUIRED: dict[str, type] = {"run": dict, "window": dict, "headline": dict, "verdict": dict,
                             "utilisation": dict, "phases": list, "kernels": dict, "steps": list,
                             "memory": dict, "overhead": dict}
SUMMARY_KEYS = ("verdict", "step_ms_mean", "step_ms_std", "utilisation", "kernel_busy_ms", "data_wait_ms",
                "data_wait_frac", "syncs_per_step", "peak_memory_mb", "precision", "cuda_graph", "device",
                "overhead_frac")


# --- writing ------------------------------------------------------------------------------------
def summary(profile: dict) -> dict:
    """profile_summary.json: headline figures under stable keys, plus what was measured."""
    head, run = profile["headline"], profile["run"]
    out = {"schema": SUMMARY_SCHEMA, "schema_version": SCHEMA_VERSION}
    out.update({k: head.get(k) for k in SUMMARY_KEYS})
    out.update(reason=profile["verdict"]["reason"], lever=profile["verdict"]["lever"],
               mode=run.get("mode", "train"), arch=run.get("arch"),
               batch=run.get("batch"), imgsz=run.get("imgsz"), workers=run.get("workers"),
               steps=profile["window"].get("steps"))
    return out


def write_all(run_dir: Path, profile: dict, trace: dict, html: str) -> list[Path]:
    run_dir = Path(run_dir)
    return [write_json_atomic(run_dir / "profile_trace.json", trace, indent=None, clean=False),
            write_text_atomic(run_dir / "timeline.html", html),
            write_json_atomic(run_dir / "profile_summary.json", summary(profile)),
            write_json_atomic(run_dir / "profile.json", profile)]  # last: its presence means "complete"


def annotate_trace(trace: dict, steps: list[dict], pid: int, tid: int) -> dict:
    """Add `ProfilerStep#<iteration>` and phase slices on the training thread, in place.

    Span edges are snapped out of the profiler's own slices on that thread so every slice stays
    strictly nested (our edges come from host clocks mapped onto the trace clock).
    """
    steps = [s for s in steps if s["half"] > 0]  # the timed steps ran before the trace began
    points = []
    for s in steps:
        points += [s["ts"], s["end"], *(x for p in s["phases"] for x in (p["ts"], p["end"]))]
    it = iter(T.snap(points, T.thread_slices(trace, tid)))
    events = trace.setdefault("traceEvents", [])
    half = None
    for s in steps:
        ts, end = next(it), next(it)
        if s["half"] != half:
            half = s["half"]
            label = "unsynchronised: verdict, utilisation" if half == 1 else "synchronised per phase: composition"
            events.append({"ph": "i", "s": "p", "name": f"libreyolo half {half} ({label})", "pid": pid, "tid": tid,
                           "ts": ts})
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s['iteration']}", "pid": pid,
                       "tid": tid, "ts": ts, "dur": end - ts,
                       "args": {"half": s["half"], "epoch": s["epoch"], "wall_ms": round(s["wall_ms"], 4)}})
        for p in s["phases"]:
            a, b = next(it), next(it)
            if b > a:
                events.append({"ph": "X", "cat": "user_annotation", "name": p["name"], "pid": pid, "tid": tid,
                               "ts": a, "dur": b - a, "args": {"phase": p["name"], "half": s["half"]}})
    trace.setdefault("distributedInfo", {"rank": 0, "world_size": 1})  # HTA reads the rank from here
    return trace


# --- reading ------------------------------------------------------------------------------------
def profile_path(path: str | Path) -> Path:
    """The profile.json that `path` (the file, or the run directory holding it) names."""
    p = Path(path)
    return p / "profile.json" if p.is_dir() else p


def load_profile(path: str | Path) -> dict:
    """Read and check a profile.json (or the directory holding one); ProfileFormatError if unusable."""
    p = profile_path(path)
    if not p.is_file():
        repeat = Path(path) / REPEAT_FILE
        if repeat.is_file():
            raise ProfileFormatError(f"'{path}' holds the trials of a --repeat run: 'profile summary' reads it; "
                                     f"for phases and kernels give one trial ({Path(path) / 'prof_1'})")
        raise ProfileFormatError(f"no profile at '{path}' (give profile.json or the run directory holding it)")
    data = _read_json(p)
    schema = data.get("schema") if isinstance(data, dict) else None
    if schema == SUMMARY_SCHEMA:
        raise ProfileFormatError(f"'{p}' is a profile summary; give profile.json (or its directory)")
    if schema == REPEAT_SCHEMA:
        raise ProfileFormatError(f"'{p}' is the aggregate of a --repeat run: 'profile summary' reads it; for "
                                 f"phases and kernels give one trial's profile.json (prof_1, ...)")
    if schema != SCHEMA:
        raise ProfileFormatError(f"'{p}' is not a LibreYOLO profile (no \"schema\": \"{SCHEMA}\")")
    _check_version(p, data)
    bad = [k for k, tp in REQUIRED.items() if not isinstance(data.get(k), tp)]
    if bad:
        raise ProfileFormatError(f"'{p}' is incomplete or edited: missing or malformed {', '.join(bad)}")
    problem = check_shape(data, PROFILE_SHAPE)
    if problem:
        raise ProfileFormatError(f"'{p}' is incomplete or edited: {problem}")
    return data


def _read_json(p: Path) -> Any:
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ProfileFormatError(f"'{p}' is not valid JSON (truncated or corrupt?): {exc.msg} at line "
                                 f"{exc.lineno}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileFormatError(f"cannot read '{p}': {exc}") from None


def _check_version(p: Path, data: dict) -> None:
    version = data.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ProfileFormatError(f"'{p}' has an invalid schema_version: {version!r}")
    if version > SCHEMA_VERSION:
        raise ProfileFormatError(f"'{p}' uses profile schema version {version}; this libreyolo reads up to "
                                 f"version {SCHEMA_VERSION} (upgrade libreyolo)")


def load_for_summary(path: str | Path) -> tuple[str, dict]:
    """('repeat', the aggregate) when `path` is a profile_repeat.json (by its schema) or the
    --repeat run directory holding one and no profile.json; else ('profile', load_profile)."""
    p = Path(path)
    if p.is_dir() and not (p / "profile.json").is_file() and (p / REPEAT_FILE).is_file():
        return "repeat", load_repeat(p / REPEAT_FILE)
    if p.is_file():
        data = _read_json(p)
        if isinstance(data, dict) and data.get("schema") == REPEAT_SCHEMA:
            return "repeat", load_repeat(p)
    return "profile", load_profile(p)


def load_repeat(path: str | Path) -> dict:
    """Read and check a profile_repeat.json (what `print_repeat` reads); ProfileFormatError if unusable."""
    p = Path(path)
    data = _read_json(p)
    if not isinstance(data, dict) or data.get("schema") != REPEAT_SCHEMA:
        raise ProfileFormatError(f"'{p}' is not a LibreYOLO --repeat aggregate (no \"schema\": \"{REPEAT_SCHEMA}\")")
    _check_version(p, data)
    problem = check_shape(data, REPEAT_SHAPE) or next(
        (m for k, v in data["figures"].items() if (m := check_shape(v, FIGURE_SHAPE, f"figures.{k}"))), None)
    if problem:
        raise ProfileFormatError(f"'{p}' is incomplete or edited: {problem}")
    return data


# --- the shape of what the readers read -----------------------------------------------------------
# The whole document is checked before a reader touches it, so a profile.json whose schema and
# version are right but whose inner values are not (a string where a number goes, a row without
# its name) is one ProfileFormatError line instead of a format or key error mid-report. A shape is
# a type name, a {key: shape} mapping (a key ending in '?' may be absent; other keys are free) or
# a one-element list [shape] for a list of such items.
NUM = "number|null"
PROFILE_SHAPE: dict[str, Any] = {
    "run": {"mode?": "string", "arch?": "any", "batch?": "any", "imgsz?": "any", "workers?": "any",
            "device_name?": "any", "precision?": "any", "cuda_graph?": "object|null", "run_dir?": "any"},
    "window": {"skip?": "any", "steps?": "any", "first_half?": "any", "second_half?": "any"},
    "headline": {f"{k}?": NUM for k in ("step_ms_mean", "step_ms_std", "utilisation", "kernel_busy_ms",
                                       "data_wait_ms", "data_wait_frac", "syncs_per_step", "peak_memory_mb",
                                       "overhead_frac")},
    "verdict": {"name": "string", "reason": "string", "lever": "string"},
    "utilisation": {"basis?": "string"},
    "phases": [{"phase": "string", "host_ms?": NUM, "synced_ms?": NUM, "gpu_ms?": NUM, "busy_ms?": NUM,
                "share?": NUM}],
    "kernels": {"kind?": "string|null", "rows": [{"name": "string", "count": "integer", "total_ms": NUM,
                                                  "mean_us": NUM, "share": "number"}]},
    "steps": ["object"],
    "memory": "object",
    "overhead": {"fraction?": NUM, "note?": "string"},
    "capture?": "object|null",
    "host_ops?": "object|null",
}
# What `profile what-if` and `profile ops` read beyond the rest (version 2 profiles).
FINITE = "finite|null"
CAPTURE_SHAPE: dict[str, Any] = {"region": "string", "note?": "string", "whole?": "string", "forward_host_ms": FINITE,
                                 "backward_host_ms": FINITE, "host_ms": FINITE, "busy_ms": FINITE}
WHATIF_SHAPE: dict[str, Any] = {
    "headline": {"step_ms_mean": "positive", "kernel_busy_ms": "finite", "utilisation": "finite"},
    "utilisation": {"idle_data_ms": "finite", "host_step_ms": FINITE},
    "capture": CAPTURE_SHAPE,
}
HOST_OPS_SHAPE: dict[str, Any] = {
    "source": "string", "steps": "integer", "self_ms_per_step": "number", "ops": "integer",
    "rows": [{"name": "string", "calls_per_step": "number", "self_ms_per_step": "number",
              "total_ms_per_step": "number", "self_share": "number"}]}
REPEAT_SHAPE: dict[str, Any] = {"trials": "integer", "figures": "object", "verdicts": ["string"], "verdict": "string",
                                "verdict_count": "integer", "mode?": "string", "arch?": "any", "batch?": "any",
                                "imgsz?": "any"}
FIGURE_SHAPE: dict[str, Any] = {"mean": NUM, "std": NUM, "values": [NUM]}
_KINDS: dict[str, Any] = {
    "any": lambda v: True, "null": lambda v: v is None, "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    # What-if divides by the step and subtracts the busy time: NaN, infinities and a step of 0 ms
    # would print impossible predictions (and NaN is not JSON).
    "finite": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
    "positive": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0,
    "object": lambda v: isinstance(v, dict), "list": lambda v: isinstance(v, list),
}


def check_shape(value: Any, shape: Any, where: str = "") -> str | None:
    """What in `value` does not fit `shape` ('kernels.rows[2].share is "x", not a number'), or None."""
    if isinstance(shape, str):
        if any(_KINDS[kind](value) for kind in shape.split("|")):
            return None
        return f"{where or 'the document'} is {_show(value)}, not {' or '.join(_article(k) for k in shape.split('|'))}"
    if isinstance(shape, list):
        if not isinstance(value, list):
            return f"{where} is {_show(value)}, not a list"
        return next((m for i, item in enumerate(value) if (m := check_shape(item, shape[0], f"{where}[{i}]"))), None)
    if not isinstance(value, dict):
        return f"{where} is {_show(value)}, not an object"
    for key, sub in shape.items():
        name, optional = key.rstrip("?"), key.endswith("?")
        path = f"{where}.{name}" if where else name
        if name not in value:
            if optional:
                continue
            return f"{path} is missing"
        problem = check_shape(value[name], sub, path)
        if problem:
            return problem
    return None


def _show(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _article(kind: str) -> str:
    return {"null": "null", "any": "anything", "integer": "an integer", "object": "an object",
            "finite": "a finite number", "positive": "a number above 0"}.get(kind, f"a {kind}")


def phase_rows(profile: dict) -> list[dict]:
    return list(profile["phases"])


def kernel_rows(profile: dict, top: int | None = 10) -> list[dict]:
    rows = list(profile["kernels"]["rows"])
    return rows if top is None else rows[:top]


def require(profile: dict, shape: dict[str, Any], what: str, path: str | Path | None = None) -> None:
    """ProfileFormatError unless `profile` has what a reader (`what`, e.g. 'profile ops') needs:
    one line naming a profile of an older schema, or the key that is missing or malformed."""
    where = f"'{profile_path(path)}'" if path is not None else "the profile"
    version = profile.get("schema_version")
    if isinstance(version, int) and version < SCHEMA_VERSION:
        raise ProfileFormatError(f"{where} is profile schema version {version}: {what} reads version "
                                 f"{SCHEMA_VERSION} profiles (profile the run again)")
    problem = check_shape(profile, shape)
    if problem:
        raise ProfileFormatError(f"{where} has no usable data for {what}: {problem}")


def host_op_table(profile: dict, top: int | None = 10, path: str | Path | None = None) -> dict:
    """`profile ops`: the host operators by CPU time per step, the top `top` rows."""
    if profile.get("schema_version") == SCHEMA_VERSION and profile.get("host_ops", {}) is None:
        where = f"'{profile_path(path)}'" if path is not None else "the profile"
        raise ProfileFormatError(f"{where} has no host-op table (training ended before its op steps, or they could "
                                 f"not be recorded; the run's log says why)")
    require(profile, {"host_ops": HOST_OPS_SHAPE}, "profile ops", path)
    table = dict(profile["host_ops"])
    table["rows"] = table["rows"] if top is None else table["rows"][:top]
    return table
