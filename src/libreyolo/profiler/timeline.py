"""timeline.html: one self-contained page (plotly.js inlined, no network) for a profile.

Panels: the verdict banner; step time per step (the timed unrecorded steps, then both recorded
halves); each step's phases stacked (timed steps and first half: host time unsynchronised; second
half: synchronised time); a Gantt of the first two measured steps (kernels by stream on CUDA, top-level CPU ops on
CPU, with our phase spans); the top kernels by total time. Every name that comes from the trace
is HTML-escaped: kernel names are full of `<`, `>` and `&` (templates), which plotly would
otherwise read as markup and a browser could read as the end of the script.
"""

from __future__ import annotations

import html

from . import trace as T

GANTT_MAX_EVENTS = 4000  # a browser draws this many bars without effort

PHASE_COLOURS = {"data": "#8c564b", "h2d": "#7f7f7f", "forward": "#1f77b4", "loss": "#ff7f0e",
                 "backward": "#2ca02c", "optimizer": "#d62728", "ema": "#9467bd", "postprocess": "#e377c2",
                 "other": "#bcbd22"}
VERDICT_COLOURS = {"dataloader-bound": "#8c564b", "launch-bound": "#d62728", "host-bound": "#ff7f0e",
                   "compute-bound": "#2ca02c", "memory-bound": "#9467bd"}


def gantt_events(trace: dict, steps: list[dict], cuda: bool, tid: int) -> list[dict]:
    """What the timeline draws for the first two steps: kernels by stream (CPU: top-level ops)."""
    first = [s for s in steps if s["half"] == 1][:2]
    lo, hi = first[0]["ts"], first[-1]["end"]
    if cuda:
        spans = [(s["ts"], s["cpu_end"]) for s in first]
        rows = [(f"stream {e['stream']}", e["name"], e["ts"], e["end"])
                for group in T.launched_in(T.busy_events(trace), spans) for e in group]
    else:
        rows = [("CPU ops", ev["name"], float(ev["ts"]), float(ev["ts"]) + float(ev.get("dur", 0)))
                for ev in T.top_level(T.cpu_ops(trace, tid)) if lo <= float(ev["ts"]) < hi]
    rows = rows[:GANTT_MAX_EVENTS] + [("phases", p["name"], p["ts"], p["end"]) for s in first for p in s["phases"]]
    return [{"row": r, "name": n, "start_ms": (s - lo) / 1e3, "dur_ms": (e - s) / 1e3} for r, n, s, e in rows]


def esc(text: object, width: int | None = None) -> str:
    s = str(text)
    if width is not None and len(s) > width:
        s = s[: width - 3] + "..."
    return html.escape(s, quote=True)


def _step_series(fig, go, profile: dict) -> None:
    steps = profile["steps"]
    if not any(s["half"] == 0 for s in steps):  # schema 1: the unprofiled skipped steps, left of 0
        ref = profile["overhead"].get("reference_ms") or []
        if ref:
            fig.add_trace(go.Scatter(x=list(range(-len(ref), 0)), y=ref, mode="lines+markers",
                                     name="unprofiled (skip)", line={"color": "#999999"}), row=1, col=1)
    for half, name in ((0, "timed, unrecorded"), (1, "recorded, unsynchronised"), (2, "synchronised")):
        xs = [i for i, s in enumerate(steps) if s["half"] == half]
        if xs:
            fig.add_trace(go.Scatter(x=xs, y=[steps[i]["wall_ms"] for i in xs], mode="lines+markers",
                                     name=f"step ms ({name})"), row=1, col=1)
    fig.add_trace(go.Scatter(x=list(range(len(steps))), y=[s["data_ms"] for s in steps], mode="lines",
                             name="data wait ms", line={"dash": "dot"}), row=1, col=1)
    busy = [(i, s["busy_ms"]) for i, s in enumerate(steps) if s.get("busy_ms") is not None]
    if busy:
        fig.add_trace(go.Scatter(x=[i for i, _ in busy], y=[b for _, b in busy], mode="lines",
                                 name="busy ms", line={"dash": "dash"}), row=1, col=1)


def _stacked_phases(fig, go, profile: dict) -> None:
    steps = profile["steps"]
    base = [0.0] * len(steps)
    names = [r["phase"] for r in profile["phases"] if r["phase"] != "other"]
    for name in names:
        ys = []
        for s in steps:
            if s["half"] in (0, 1):
                ys.append((s.get("host_ms") or {}).get(name, 0.0))
            else:
                ys.append(((s.get("phases") or {}).get(name) or {}).get("wall_ms") or 0.0)
        fig.add_trace(go.Bar(x=list(range(len(steps))), y=ys, base=list(base), name=name,
                             marker_color=PHASE_COLOURS.get(name), legendgroup="phases"), row=2, col=1)
        base = [b + y for b, y in zip(base, ys)]


def _gantt(fig, go, gantt: list[dict]) -> None:
    rows: dict[str, list[dict]] = {}
    for ev in gantt:
        rows.setdefault(ev["row"], []).append(ev)
    for row, evs in rows.items():
        colours = [PHASE_COLOURS.get(e["name"], "#1f77b4") for e in evs] if row == "phases" else None
        fig.add_trace(go.Bar(y=[esc(row)] * len(evs), x=[e["dur_ms"] for e in evs], base=[e["start_ms"] for e in evs],
                             orientation="h", hovertext=[esc(e["name"], 200) for e in evs], hoverinfo="text+x",
                             name=esc(row), marker_color=colours, showlegend=False), row=3, col=1)


def _top_kernels(fig, go, profile: dict, top: int = 10) -> None:
    rows = profile["kernels"]["rows"][:top][::-1]
    fig.add_trace(go.Bar(y=[f"{i}. {esc(r['name'], 60)}" for i, r in zip(range(len(rows), 0, -1), rows)],
                         x=[r["total_ms"] for r in rows], orientation="h", showlegend=False,
                         hovertext=[esc(r["name"], 300) for r in rows], marker_color="#1f77b4"), row=4, col=1)


def render(profile: dict, gantt: list[dict]) -> str:
    """The whole page as one string."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    kind = "kernels" if profile["kernels"].get("kind") == "kernel" else "top-level CPU ops"
    fig = make_subplots(rows=4, cols=1, vertical_spacing=0.08, row_heights=[0.25, 0.25, 0.25, 0.25],
                        subplot_titles=("step time (ms): timed (unrecorded), recorded, synchronised steps",
                                        "phases per step (ms): host time unsynchronised, then synchronised",
                                        f"first two measured steps: {kind} and phases (ms)", f"top {kind} (total ms)"))
    _step_series(fig, go, profile)
    _stacked_phases(fig, go, profile)
    _gantt(fig, go, gantt)
    _top_kernels(fig, go, profile)
    fig.update_layout(barmode="overlay", height=1500, margin={"l": 260, "r": 30, "t": 40, "b": 30},
                      legend={"orientation": "v"})
    body = fig.to_html(full_html=False, include_plotlyjs=True)
    return _page(profile, body)


def _page(profile: dict, body: str) -> str:
    v, h, run = profile["verdict"], profile["headline"], profile["run"]
    colour = VERDICT_COLOURS.get(v["name"], "#333333")
    figures = (f"step {h.get('step_ms_mean') or 0:.1f} ± {h.get('step_ms_std') or 0:.1f} ms · utilisation "
               f"{h.get('utilisation') or 0:.2f} · data wait {h.get('data_wait_ms') or 0:.1f} ms · syncs/step "
               f"{h.get('syncs_per_step') or 0:.2f} · {run.get('precision')}")
    title = (f"{'inference: ' if run.get('mode') == 'infer' else ''}{run.get('arch')} batch {run.get('batch')} "
             f"imgsz {run.get('imgsz')} on {run.get('device_name')}")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>LibreYOLO profile: {esc(title)}</title>
<style>body{{font-family:system-ui,sans-serif;margin:16px}}
.banner{{border-left:8px solid {colour};background:#f6f6f6;padding:10px 16px;margin-bottom:12px}}
.banner h1{{margin:0;font-size:22px;color:{colour}}} .banner p{{margin:4px 0}}</style></head>
<body><div class="banner"><h1>{esc(v['name'])}</h1><p>{esc(v['reason'])}</p><p><b>lever:</b> {esc(v['lever'])}</p>
<p>{esc(title)} · {esc(figures)}</p></div>
{body}
</body></html>
"""
