"""`libreyolo profile compare A B`: two profiles side by side, and what changed from A to B.

Each report says what bounds its own run; neither says why B is faster or slower than A. The
headline figures answer it: the verdict's step (analyze.py: its time W and data wait D from the
timed, unrecorded steps, kernel busy time B from the recorded unsynchronised half) is exactly
kernel busy time + the part of the data wait that left the GPU idle + the rest of the idle time
(the gaps between kernels), per step W = B + min(D, W - B) + the rest. The step's change is the
sum of those three changes, so the change line names each with A's and B's figure, largest change
first, and says "unchanged" for one that moved by at most TOLERANCE of A's step time. The step
itself is unchanged when B's is within TOLERANCE of A's. On a CPU there are no kernels: the step
is compute + data wait, and the idle component is left out.

Only like for like compares: one profile schema version (ProfileFormatError otherwise), one mode
(training against training, inference against inference; a profile without `run.mode` is a
training one) and, unless forced, one batch and imgsz, since every figure here is per step
(ConfigError otherwise). Kernels are compared in ms per step, so windows of different lengths
compare. Reads profile dicts only: no torch, like the other readers.
"""

from __future__ import annotations

from ..errors import ConfigError, ProfileFormatError
from .artifacts import SCHEMA_VERSION, summary

COMPARE_SCHEMA = "libreyolo-profile-compare"
TOLERANCE = 0.05  # a step within 5 % of A's, or a component that moved by at most 5 % of A's step: unchanged
LIKE_FOR_LIKE = ("batch", "imgsz")  # per-step figures of different batches or sizes differ by design
SETUP = ("arch", "batch", "imgsz", "workers", "precision", "cuda_graph", "device")
# The rows of the side-by-side table, summary keys plus the two figures compare derives.
FIGURES = ("step_ms_mean", "utilisation", "kernel_busy_ms", "data_wait_ms", "idle_ms", "syncs_per_step",
           "kernels_per_step", "peak_memory_mb")


def check(a: dict, b: dict, force: bool = False) -> list[str]:
    """Refuse profiles that do not compare; the notes to print when --force let a difference through."""
    va, vb = a["schema_version"], b["schema_version"]
    if va != vb:
        raise ProfileFormatError(f"A is profile schema version {va} and B version {vb}: compare profiles of one "
                                 f"schema version (profile the older run again)")
    ma, mb = _mode(a), _mode(b)
    if ma != mb:
        names = {"train": "training", "infer": "inference"}
        raise ConfigError(f"A profiles {names.get(ma, ma)} and B {names.get(mb, mb)}: compare like with like "
                          f"(profile run with profile run, profile infer with profile infer)")
    differ = [f"{k} ({a['run'].get(k)} vs {b['run'].get(k)})" for k in LIKE_FOR_LIKE
              if a["run"].get(k) != b["run"].get(k)]
    if differ and not force:
        raise ConfigError(f"A and B differ in {' and '.join(differ)}: their per-step figures are not like for "
                          f"like; add --force to compare them anyway")
    verb = "differs" if len(differ) == 1 else "differ"
    return [f"{' and '.join(differ)} {verb}: compared because of --force; per-step figures are not like for "
            f"like"] if differ else []


def figures(profile: dict) -> dict:
    """summary() (the keys CI gates read) plus data_idle_ms (the part of the data wait the GPU sat
    idle through), idle_ms (the rest of the idle: step - kernel busy - data_idle_ms) and
    kernels_per_step (kernel launches per unsynchronised step; None on CPU)."""
    out = summary(profile)
    step, busy, wait = out["step_ms_mean"], out["kernel_busy_ms"], out["data_wait_ms"]
    idle = max(step - busy, 0.0) if _isnum(step) and _isnum(busy) else None
    out["data_idle_ms"] = min(wait, idle) if idle is not None and _isnum(wait) else None
    out["idle_ms"] = idle - out["data_idle_ms"] if out["data_idle_ms"] is not None else None
    counts = [s.get("kernels") for s in profile["steps"] if isinstance(s, dict) and s.get("half") == 1]
    counts = [c for c in counts if _isnum(c)]
    gpu = profile["kernels"].get("kind") == "kernel"
    out["kernels_per_step"] = sum(counts) / len(counts) if gpu and counts else None
    return out


def compare(a: dict, b: dict, *, force: bool = False, top: int = 10, paths: tuple[str | None, str | None] = (None, None)) -> dict:
    """Everything `profile compare` prints (and --json writes): both profiles' figures, their
    deltas, the setup that differs, phase and top-kernel deltas, and the change line. `paths`:
    where A and B were read from, for the output."""
    notes = check(a, b, force)
    fa, fb = figures(a), figures(b)
    gpu = "kernel" in (a["kernels"].get("kind"), b["kernels"].get("kind"))
    table = {k: delta(fa[k], fb[k]) for k in FIGURES}
    table["verdict"] = {"a": fa["verdict"], "b": fb["verdict"], "changed": fa["verdict"] != fb["verdict"]}
    return {"schema": COMPARE_SCHEMA, "schema_version": SCHEMA_VERSION, "tolerance": TOLERANCE, "mode": fa["mode"],
            "kernel_kind": "kernel" if gpu else "cpu_op",
            "a": {"path": paths[0], **fa}, "b": {"path": paths[1], **fb},
            "setup_changes": {k: [fa[k], fb[k]] for k in SETUP if fa[k] != fb[k]}, "notes": notes,
            "figures": table, "phases": phase_deltas(a, b), "kernels": kernel_deltas(a, b, top),
            "change": change(fa, fb, gpu)}


def delta(x, y) -> dict:
    """{a, b, delta (b - a), ratio (b / a)}; delta and ratio None where a figure is missing."""
    both = _isnum(x) and _isnum(y)
    return {"a": x, "b": y, "delta": y - x if both else None, "ratio": y / x if both and x else None}


def phase_deltas(a: dict, b: dict) -> list[dict]:
    """Per phase, A's and B's synchronised ms per step (the time the phase takes, GPU included)
    with delta and ratio, and the unsynchronised host ms; A's phase order, then B's own."""
    rows_a = {r["phase"]: r for r in a["phases"]}
    rows_b = {r["phase"]: r for r in b["phases"]}
    out = []
    for name in [*rows_a, *(n for n in rows_b if n not in rows_a)]:
        ra, rb = rows_a.get(name, {}), rows_b.get(name, {})
        synced = delta(ra.get("synced_ms"), rb.get("synced_ms"))
        out.append({"phase": name, "a_ms": synced["a"], "b_ms": synced["b"], "delta_ms": synced["delta"],
                    "ratio": synced["ratio"], "a_host_ms": ra.get("host_ms"), "b_host_ms": rb.get("host_ms")})
    return out


def kernel_deltas(a: dict, b: dict, top: int = 10) -> list[dict]:
    """The kernels (CPU: top-level ops) in either profile's top `top` by total time, in ms per
    step of each window, largest change first. A kernel missing from a profile's rows took no time
    there when the rows are complete (their shares sum to 1), else it was below the rows kept: None."""
    per_a, per_b = _per_step(a), _per_step(b)
    names = dict.fromkeys(r["name"] for p in (a, b) for r in _top(p, top))
    rows = []
    for name in names:
        x, y = per_a.get(name, 0.0 if _complete(a) else None), per_b.get(name, 0.0 if _complete(b) else None)
        rows.append({"name": name, "a_ms": x, "b_ms": y, "delta_ms": delta(x, y)["delta"]})
    rows.sort(key=lambda r: (r["delta_ms"] is None, -abs(r["delta_ms"] or 0.0), r["name"]))
    return rows


def change(fa: dict, fb: dict, gpu: bool = True, tolerance: float = TOLERANCE) -> dict:
    """The verdict of the change from A to B: faster, slower or unchanged, and from what.

    `fa`, `fb`: figures(); `gpu`: either profile has kernels (else the idle component, always 0
    on a CPU, is left out)."""
    va, vb = fa["verdict"], fb["verdict"]
    verdict = f"verdict {va} (unchanged)" if va == vb else f"verdict {va} -> {vb}"
    sa, sb = fa["step_ms_mean"], fb["step_ms_mean"]
    if not (_isnum(sa) and sa > 0 and _isnum(sb) and sb > 0):
        which = "A" if not (_isnum(sa) and sa > 0) else "B"
        return {"direction": None, "speedup": None, "cause": None, "components": {},
                "line": f"no step time in {which}, so no change to judge; {verdict}"}
    parts = [("idle", "idle between kernels", "idle_ms")] if gpu else []
    parts += [("kernel", "kernel busy" if gpu else "compute", "kernel_busy_ms"), ("data", "data wait", "data_idle_ms")]
    components = {}
    for key, label, field in parts:
        x, y = fa[field], fb[field]
        if _isnum(x) and _isnum(y):
            components[key] = {"label": label, "a_ms": x, "b_ms": y, "delta_ms": y - x,
                               "unchanged": _within(y - x, tolerance * sa)}
    ranked = sorted(components.items(), key=lambda kv: -abs(kv[1]["delta_ms"]))
    if _within(sb - sa, tolerance * sa):
        direction, head = "unchanged", f"B is unchanged within {tolerance:.0%} ({_ms(sa)} -> {_ms(sb)} ms per step)"
    else:
        direction = "faster" if sb < sa else "slower"
        head = f"B is {max(sa, sb) / min(sa, sb):.3g}x {direction} ({_ms(sa)} -> {_ms(sb)} ms per step)"
    cause = next((k for k, c in ranked if not c["unchanged"]), None) if direction != "unchanged" else None
    said = [f"{c['label']} {_ms(c['a_ms'])} -> {_ms(c['b_ms'])} ms{' (unchanged)' if c['unchanged'] else ''}"
            for _, c in ranked]
    return {"direction": direction, "speedup": sa / sb, "cause": cause, "components": components,
            "line": f"{head}: {'; '.join([*said, verdict])}"}


def _within(change: float, limit: float) -> bool:
    """|change| <= limit, with the limit itself inside (16.0 -> 16.8 is 5 %, whatever the float error)."""
    return abs(change) <= limit * (1 + 1e-9)


def _mode(profile: dict) -> str:
    return profile["run"].get("mode", "train")


def _isnum(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _ms(x: float) -> str:
    return format(x, ".1f" if abs(x) >= 1 else ".2f")


def _top(profile: dict, top: int) -> list[dict]:
    return sorted(profile["kernels"]["rows"], key=lambda r: -(r["total_ms"] or 0.0))[:top]


def _per_step(profile: dict) -> dict[str, float]:
    """ms per step of every kernel row (the kernel table covers all of the window's steps)."""
    n = len(profile["steps"])
    return {r["name"]: r["total_ms"] / n for r in profile["kernels"]["rows"] if n and _isnum(r["total_ms"])}


def _complete(profile: dict) -> bool:
    """Whether the profile kept every kernel's row: shares are of the whole window's kernel time."""
    rows = profile["kernels"]["rows"]
    return not rows or sum(r["share"] for r in rows) >= 0.999
