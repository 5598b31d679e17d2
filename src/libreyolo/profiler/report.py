"""The printed report: rich tables on a terminal, plain aligned text otherwise (logs, CI, pipes).

Reads only profile dicts (as written to profile.json), so `libreyolo profile summary` can print
it from a copied file without importing torch. An inference profile (`run.mode` "infer", from
`libreyolo profile infer`) says so in its title and names the images it read; a profile without
`mode` (written before inference profiles existed) is a training one and reads as before.
"""

from __future__ import annotations

import statistics
import sys

from rich.console import Console
from rich.table import Table
from rich.text import Text

SECTIONS = ("headline", "verdict", "phases", "kernels")


def _num(x, fmt: str = ".1f", none: str = "-") -> str:
    return none if x is None else format(x, fmt)


def is_infer(profile: dict) -> bool:
    return profile["run"].get("mode") == "infer"


def headline_lines(profile: dict) -> list[str]:
    run, h, u = profile["run"], profile["headline"], profile["utilisation"]
    graph = run.get("cuda_graph") or {}
    graph_text = f"on ({graph.get('replayed_steps', 0)} replayed steps)" if graph.get("enabled") else "off"
    w = profile["window"]
    images = f"  images {run.get('data')}" if is_infer(profile) else ""
    designed = u.get("designed_syncs_per_step") or 0  # the model's own (model.host_syncs): a DETR's 3
    by_design = f" ({designed:g} by design)" if designed else ""
    if w.get("timed") is not None:  # schema 2: timed steps before the recorded ones
        ops = f" + {w['ops_steps']} op steps" if w.get("ops_steps") else ""
        layout = (f"window: {w['timed']} timed (unrecorded) + {w.get('first_half')} recorded unsynchronised + "
                  f"{w.get('second_half')} synchronised steps{ops} after {w.get('skip')} skipped")
    else:
        layout = (f"window: {w.get('first_half')} unsynchronised + {w.get('second_half')} synchronised steps after "
                  f"{w.get('skip')} skipped")
    return [
        f"{run.get('arch')}  batch {run.get('batch')}  imgsz {run.get('imgsz')}  workers {run.get('workers')}  "
        f"on {run.get('device_name')}  precision {run.get('precision')}  CUDA graphs {graph_text}{images}",
        layout,
        f"step {_num(h.get('step_ms_mean'))} ± {_num(h.get('step_ms_std'))} ms   utilisation "
        f"{_num(h.get('utilisation'), '.2f')} ({u.get('basis', '')})",
        f"{'kernel busy' if profile['kernels'].get('kind') == 'kernel' else 'compute'} "
        f"{_num(h.get('kernel_busy_ms'))} ms   data wait {_num(h.get('data_wait_ms'))} ms   "
        f"syncs/step {_num(h.get('syncs_per_step'), '.2f')}{by_design}   peak memory {_num(h.get('peak_memory_mb'), '.0f')} MB",
    ]


def verdict_lines(profile: dict) -> list[str]:
    v = profile["verdict"]
    return [f"verdict: {v['name']}: {v['reason']}", f"lever: {v['lever']}"]


def phase_table(profile: dict) -> tuple[list[str], list[list[str]]]:
    head = ["phase", "host ms (unsynced)", "synced ms", "gpu ms", "kernel busy ms", "share"]
    rows = [[r["phase"], _num(r.get("host_ms"), ".2f"), _num(r.get("synced_ms"), ".2f"), _num(r.get("gpu_ms"), ".2f"),
             _num(r.get("busy_ms"), ".2f"), _num(None if r.get("share") is None else 100 * r["share"], ".0f") + "%"]
            for r in profile["phases"]]
    return head, rows


def kernel_table(profile: dict, top: int = 10) -> tuple[list[str], list[list[str]]]:
    kind = "kernel" if profile["kernels"].get("kind") == "kernel" else "CPU op (top level)"
    head = [kind, "count", "total ms", "mean us", "share"]
    rows = [[_short(r["name"]), str(r["count"]), _num(r["total_ms"], ".2f"), _num(r["mean_us"], ".1f"),
             f"{100 * r['share']:.1f}%"] for r in profile["kernels"]["rows"][:top]]
    return head, rows


def _short(name: str, width: int = 70) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


def plain_table(head: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(head, *rows)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in [head, *rows]]
    return "\n".join(lines)


# Fewer unprofiled reference steps than this make the overhead figure a rough one.
STEADY_REFERENCE = 5


def overhead_line(o: dict) -> str:
    """The profiler's overhead as measured, with what it rests on and how noisy that is.

    The figure compares the median recorded step with the median of the unrecorded timed steps
    (schema 1: a few unprofiled skipped steps), so its noise is theirs: with skipped steps as the
    reference, similar runs measured +417 %, -85.7 % and +16.2 %. A negative figure is printed as
    measured and explained (the profiler cannot make a step faster: the reference steps were
    slower)."""
    frac = o.get("fraction")
    if frac is None:
        return f"profiler overhead on measured steps: n/a ({o.get('note', '')})"
    ref, prof = _numbers(o.get("reference_ms")), _numbers(o.get("profiled_ms"))
    text = f"profiler overhead on measured steps: {100 * frac:+.1f}%"
    if not ref or not prof:
        return text
    ref_mid = statistics.median(ref)
    spread = (max(ref) - min(ref)) / ref_mid if ref_mid > 0 else 0.0
    text += (f" (median of {len(prof)} profiled against {len(ref)} unprofiled step{'s' if len(ref) > 1 else ''}, "
             f"which spread {100 * spread:.0f}%)")
    if frac < 0:
        text += ("; negative: profiling cannot speed a step up, so the unprofiled steps were slower (warm-up, "
                 "a busy machine); read it as no measurable overhead")
    elif frac <= spread:
        text += "; within the unprofiled steps' own spread"
    if len(ref) < STEADY_REFERENCE:
        # Schema 2: the reference is the timed steps, profile_steps // 2 of them; schema 1: the
        # skipped steps but the first and the one before the window.
        hint = (f"profile_steps={2 * STEADY_REFERENCE}" if str(o.get("basis", "")).startswith("median recorded")
                else f"profile_skip={STEADY_REFERENCE + 2}")
        text += f"; {hint} or more gives a steadier figure"
    return text


def where_line(profile: dict, read_from=None) -> str:
    """Where the artifacts are: the run directory, or for a copied profile.json where it was read
    from and where the run wrote its files (the recorded path is relative to the run's working
    directory)."""
    recorded = profile["run"].get("run_dir")
    if read_from is None or recorded is None:
        return f"artifacts in {recorded}"
    from pathlib import Path

    if Path(read_from).resolve() == Path(recorded).resolve():
        return f"artifacts in {read_from}"
    return f"read from {read_from}; the run wrote its artifacts in {recorded}"


def _numbers(xs) -> list[float]:
    return [float(x) for x in xs or [] if isinstance(x, (int, float)) and not isinstance(x, bool)]


def print_table(console: Console, title: str, head: list[str], rows: list[list[str]]) -> None:
    """A titled table: rich on a terminal, plain aligned text otherwise."""
    if console.is_terminal:
        table = Table(title=title, title_justify="left")
        for i, h in enumerate(head):
            table.add_column(h, justify="left" if i == 0 else "right", overflow="fold")
        for r in rows:
            table.add_row(*(Text(c) for c in r))  # names are data, not markup
        console.print(table)
    else:
        console.print(f"\n{title}", markup=False)
        console.print(plain_table(head, rows) if rows else "(none recorded)", markup=False)


def print_report(profile: dict, file=None, sections=SECTIONS, top: int = 10, read_from=None) -> None:
    """The report; `file` defaults to stderr (stdout may carry a machine-readable result).

    `read_from`: the directory the profile.json was read from (`profile summary` of a copy)."""
    console = Console(file=file or sys.stderr, highlight=False, soft_wrap=True)
    rich = console.is_terminal

    def out(text: str) -> None:  # data (kernel names) may contain [brackets]: never markup
        console.print(text, markup=False)

    if "headline" in sections:
        out("profile (inference)" if is_infer(profile) else "profile")
        for line in headline_lines(profile):
            out(line)
    if "verdict" in sections:
        for i, line in enumerate(verdict_lines(profile)):
            if rich and i == 0:
                console.print(line, style="bold magenta", markup=False)
            else:
                out(line)
    kinds = "kernels" if profile["kernels"].get("kind") == "kernel" else "CPU ops"
    for section, build, title in (("phases", phase_table, "phases (mean ms per step)"),
                                  ("kernels", lambda p: kernel_table(p, top), f"top {top} {kinds}")):
        if section not in sections:
            continue
        print_table(console, title, *build(profile))
    if "headline" in sections:
        out(overhead_line(profile["overhead"]))
        out(where_line(profile, read_from))


def print_repeat(rep: dict, file=None) -> None:
    """Mean ± std of every headline figure over the trials, and each trial's verdict."""
    console = Console(file=file or sys.stderr, highlight=False, soft_wrap=True)
    out = (lambda s: console.print(s, markup=False))
    kind = "inference profile" if rep.get("mode") == "infer" else "profile"
    out(f"{kind} over {rep['trials']} trials ({rep.get('arch')}, batch {rep.get('batch')}, imgsz {rep.get('imgsz')})")
    rows = [[k, _num(v["mean"], ".4g"), _num(v["std"], ".3g"), ", ".join(_num(x, ".4g") for x in v["values"])]
            for k, v in rep["figures"].items()]
    out(plain_table(["figure", "mean", "± std", "trials"], rows))
    out("verdicts: " + ", ".join(f"{i + 1}: {v}" for i, v in enumerate(rep["verdicts"])))
    out(f"verdict: {rep['verdict']} ({rep['verdict_count']} of {rep['trials']} trials)")


# --- profile compare ------------------------------------------------------------------------------
COMPARE_ROWS = (("step_ms_mean", "step ms", ".1f"), ("utilisation", "utilisation", ".2f"),
                ("kernel_busy_ms", "kernel busy ms", ".2f"), ("data_wait_ms", "data wait ms", ".2f"),
                ("idle_ms", "idle between kernels ms", ".2f"), ("syncs_per_step", "syncs/step", ".2f"),
                ("kernels_per_step", "kernels/step", ".0f"), ("peak_memory_mb", "peak memory MB", ".0f"))


def setup_line(f: dict) -> str:
    """What a compared profile ran: its summary's setup keys, as the report's first line has them."""
    return (f"{f.get('arch')}  batch {f.get('batch')}  imgsz {f.get('imgsz')}  workers {f.get('workers')}  on "
            f"{f.get('device')}  precision {f.get('precision')}  CUDA graphs {'on' if f.get('cuda_graph') else 'off'}")


def compare_tables(cmp: dict, top: int = 10) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, head, rows) of the figures, phases and kernels tables of a compare() result."""
    cpu = cmp["kernel_kind"] != "kernel"
    figures = []
    for key, label, fmt in COMPARE_ROWS:
        if cpu and key in ("idle_ms", "kernels_per_step"):
            continue  # a CPU step has no kernels to idle between
        d = cmp["figures"][key]
        a, b = _num(d["a"], fmt), _num(d["b"], fmt)
        if key == "step_ms_mean":
            a += f" ± {_num(cmp['a']['step_ms_std'], fmt)}"
            b += f" ± {_num(cmp['b']['step_ms_std'], fmt)}"
        figures.append([("compute ms" if cpu and key == "kernel_busy_ms" else label), a, b,
                        _num(d["delta"], "+" + fmt), _num(d["ratio"], ".2f") + ("x" if d["ratio"] is not None else "")])
    v = cmp["figures"]["verdict"]
    figures.append(["verdict", v["a"], v["b"], "changed" if v["changed"] else "same", ""])
    phases = [[r["phase"], _num(r["a_ms"], ".2f"), _num(r["b_ms"], ".2f"), _num(r["delta_ms"], "+.2f"),
               _num(r["ratio"], ".2f") + ("x" if r["ratio"] is not None else ""), _num(r["a_host_ms"], ".2f"),
               _num(r["b_host_ms"], ".2f")] for r in cmp["phases"]]
    kernels = [[_short(r["name"]), _num(r["a_ms"], ".3f"), _num(r["b_ms"], ".3f"), _num(r["delta_ms"], "+.3f")]
               for r in cmp["kernels"]]
    kind = "CPU ops (top level)" if cpu else "kernels"
    return [("figures (per step; B/A: the ratio)", ["figure", "A", "B", "delta", "B/A"], figures),
            ("phases (synchronised ms per step; host: unsynchronised)",
             ["phase", "A ms", "B ms", "delta ms", "B/A", "A host ms", "B host ms"], phases),
            (f"{kind} in A's or B's top {top} (ms per step, largest change first)",
             ["CPU op" if cpu else "kernel", "A ms", "B ms", "delta ms"], kernels)]


def _setting(key: str, value) -> str:
    return ("on" if value else "off") if key == "cuda_graph" else str(value)


def print_compare(cmp: dict, file=None, top: int = 10) -> None:
    """A compare() result: both setups, what differs, the three tables, then the change line."""
    console = Console(file=file or sys.stderr, highlight=False, soft_wrap=True)
    out = (lambda s: console.print(s, markup=False))
    out("compare (inference)" if cmp["mode"] == "infer" else "compare")
    for side in ("a", "b"):
        path = cmp[side]["path"]
        out(f"{side.upper()}: {setup_line(cmp[side])}" + (f"  ({path})" if path else ""))
    changes = [f"{'CUDA graphs' if k == 'cuda_graph' else k} {_setting(k, x)} -> {_setting(k, y)}"
               for k, (x, y) in cmp["setup_changes"].items()]
    out(f"setup changed: {', '.join(changes)}" if changes else "setup: the same")
    for note in cmp["notes"]:
        out(f"note: {note}")
    for title, head, rows in compare_tables(cmp, top):
        print_table(console, title, head, rows)
    if any(r["a_ms"] is None or r["b_ms"] is None for r in cmp["kernels"]):
        out("-: not among the rows that profile kept (below its smallest)")
    line = f"change: {cmp['change']['line']}"
    if console.is_terminal:
        console.print(line, style="bold magenta", markup=False)
    else:
        out(f"\n{line}")


# --- profile what-if and profile ops --------------------------------------------------------------
def print_whatif(result: dict, file=None) -> None:
    """A what_if() result: the measured step, one row per lever, then each prediction's assumption."""
    console = Console(file=file or sys.stdout, highlight=False, soft_wrap=True)
    out = (lambda s: console.print(s, markup=False))
    m = result["measured"]
    kind = "inference" if result["mode"] == "infer" else "training"
    out(f"what-if ({kind}): {result['arch']}  batch {result['batch']}  imgsz {result['imgsz']}  on "
        f"{result['device']}  precision {result['precision']}  CUDA graphs {'on' if result['cuda_graph'] else 'off'}")
    gpu = result.get("kernel_kind") == "kernel"
    idle = f" ({_num(m['data_idle_ms'], '.2f')} ms of it with the GPU idle)" if gpu else ""
    out(f"measured: step {_num(m['step_ms'])} ms, {'kernel busy' if gpu else 'compute'} {_num(m['kernel_busy_ms'])} ms "
        f"(utilisation {_num(m['utilisation'], '.2f')}), host {_num(m['host_step_ms'])} ms per step, of which the "
        f"captured region ({m['region']}) {_num(m['region_host_ms'])} ms; data wait {_num(m['data_wait_ms'], '.2f')} "
        f"ms{idle}; verdict {m['verdict']}")
    rows = []
    for p in result["predictions"]:
        span = p["step_ms_range"]
        rng = f"{_num(span[0])}-{_num(span[1])}" if span and span[0] != span[1] else ""
        rows.append([p["lever"], _num(p["step_ms"]), rng, _num(p["speedup"], ".2f") + ("x" if p["speedup"] else ""),
                     p["bound"] or ("n/a" if not p["applies"] else "")])
    print_table(console, "predicted step (ms per step)", ["lever", "step ms", "range", "speed-up", "bound by"], rows)
    out("\nassumptions:")
    for p in result["predictions"]:
        out(f"- {p['lever']}: {p['assumption'] if p['applies'] else 'n/a: ' + p['assumption']}")


def print_ops(table: dict, file=None, top: int = 10) -> None:
    """The host operators by self CPU time per step (a host_op_table())."""
    console = Console(file=file or sys.stdout, highlight=False, soft_wrap=True)
    out = (lambda s: console.print(s, markup=False))
    out(f"host operators: {table['self_ms_per_step']:.2f} ms of self CPU time per step over {table['ops']} operators; "
        f"from {table['source']}")
    rows = [[_short(r["name"]), _num(r["calls_per_step"], ".1f"), _num(r["self_ms_per_step"], ".3f"),
             _num(r["total_ms_per_step"], ".3f"), f"{100 * r['self_share']:.1f}%"] for r in table["rows"][:top]]
    print_table(console, f"top {top} host operators by self CPU time per step",
                ["operator", "calls/step", "self ms/step", "total ms/step", "self share"], rows)
    out("self: the operator's own host time (Python, dispatch, kernel launches), its nested operators left out; "
        "total: with them")
