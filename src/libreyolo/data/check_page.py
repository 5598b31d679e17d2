"""The `libreyolo data check` page: one self-contained HTML file (plotly.js inlined, no network).

Charts: boxes per class and split, images per split (with boxes / backgrounds / unreadable), and
the histogram of the boxes' shorter side at the planned imgsz with the `TINY_PX` line. Then the
verdict and every problem with its first examples. Every name from the data is HTML-escaped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..atomic import write_text_atomic
from ..plots import esc


def write_page(path: str | Path, report: dict[str, Any]) -> Path:
    return write_text_atomic(path, render(report))


def render(report: dict[str, Any]) -> str:
    figures = [_per_class(report), _images(report), _sizes(report)]
    blocks = [fig.to_html(full_html=False, include_plotlyjs=(i == 0), config={"displaylogo": False})
              for i, fig in enumerate(figures)]
    return _page(report, blocks)


def _per_class(report):
    import plotly.graph_objects as go

    fig = go.Figure()
    for s, v in report["splits"].items():
        fig.add_trace(go.Bar(x=[esc(r["class"]) for r in v["per_class"]], y=[r["boxes"] for r in v["per_class"]],
                             name=s, customdata=[r["images"] for r in v["per_class"]],
                             hovertemplate="%{x}: %{y} boxes in %{customdata} images<extra>" + s + "</extra>"))
    fig.update_layout(title="boxes per class", barmode="group", height=380, xaxis={"tickangle": -45},
                      yaxis={"title": "boxes"}, margin={"l": 50, "r": 20, "t": 50, "b": 100})
    return fig


def _images(report):
    import plotly.graph_objects as go

    splits = list(report["splits"])
    v = report["splits"]
    unreadable = [v[s]["unreadable_images"] for s in splits]
    background = [v[s]["backgrounds"] for s in splits]
    labelled = [v[s]["images"] - u - b for s, u, b in zip(splits, unreadable, background)]
    fig = go.Figure([go.Bar(x=splits, y=labelled, name="with boxes"),
                     go.Bar(x=splits, y=background, name="backgrounds (no box)"),
                     go.Bar(x=splits, y=unreadable, name="unreadable", marker_color="#c0392b")])
    fig.update_layout(title="images per split", barmode="stack", height=340, yaxis={"title": "images"},
                      margin={"l": 50, "r": 20, "t": 50, "b": 40})
    return fig


def _sizes(report):
    import plotly.graph_objects as go

    sizes = report["box_sizes"]
    edges = sizes["edges"]
    labels = [f"{a}-{b}" for a, b in zip(edges, edges[1:])] + [f">= {edges[-1]}"]
    fig = go.Figure([go.Bar(x=labels, y=counts, name=s) for s, counts in sizes["counts"].items()])
    tiny = edges.index(int(sizes["tiny_px"])) if int(sizes["tiny_px"]) in edges else None
    if tiny is not None:
        fig.add_vline(x=tiny - 0.5, line_dash="dash", line_color="#c0392b",
                      annotation_text=f"{sizes['tiny_px']:g} px: smaller boxes vanish")
    fig.update_layout(title=f"box size at imgsz {report['imgsz']} (shorter side, px; the long side resized to imgsz)",
                      barmode="group", height=360, xaxis={"title": "pixels"}, yaxis={"title": "boxes"},
                      margin={"l": 50, "r": 20, "t": 50, "b": 50})
    return fig


def _problems(report) -> str:
    if not report["problems"]:
        return "<p>No problem found.</p>"
    items = []
    for p in report["problems"]:
        examples = "".join(f"<li><code>{esc(e)}</code></li>" for e in p["examples"])
        more = f"<p class='note'>first {len(p['examples'])} of {p['count']}</p>" if p["count"] > len(p["examples"]) \
            and p["examples"] else ""
        items.append(f"<li class='{esc(p['level'])}'><b>{esc(p['level'])}</b>: {esc(p['text'])}"
                     + (f"<ul>{examples}</ul>{more}" if examples else "") + "</li>")
    return f"<ul class='problems'>{''.join(items)}</ul>"


def _table(report) -> str:
    splits = list(report["splits"])
    head = "".join(f"<th>{esc(s)} boxes</th><th>{esc(s)} images</th>" for s in splits)
    rows = []
    for k, name in enumerate(report["names"]):
        cells = "".join(f"<td>{report['splits'][s]['per_class'][k]['boxes']}</td>"
                        f"<td>{report['splits'][s]['per_class'][k]['images']}</td>" for s in splits)
        rows.append(f"<tr><td>{esc(name)}</td>{cells}</tr>")
    return f"<table><thead><tr><th>class</th>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _page(report: dict[str, Any], blocks: list[str]) -> str:
    facts = " · ".join(esc(f"{s}: {v['images']} images, {v['boxes']} boxes, {v['backgrounds']} backgrounds"
                           + (f", {v['crowd']} crowd" if v["crowd"] else "")) for s, v in report["splits"].items())
    depth = "full check: every image decoded and hashed" if report["full"] else "quick check: labels and sizes only"
    colour = "#1e8449" if report["ok"] else "#c0392b"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>LibreYOLO data check: {esc(report['data'])}</title>
<style>body{{font-family:system-ui,sans-serif;margin:16px;color:#222}}
.banner{{border-left:8px solid {colour};background:#f6f6f6;padding:10px 16px;margin-bottom:12px}}
.banner h1{{margin:0;font-size:22px;color:#1f3b73}} .banner p{{margin:4px 0}} .note{{color:#555}}
li.error b{{color:#c0392b}} li.warning b{{color:#b9770e}} code{{font-size:12px}}
table{{border-collapse:collapse;margin:8px 0 24px}} th,td{{padding:3px 10px;text-align:right;border-bottom:1px solid #ddd}}
th:first-child,td:first-child{{text-align:left}}</style></head>
<body><div class="banner"><h1>data check: {esc(report['data'])}</h1><p><b>{esc(report['verdict'])}</b></p>
<p>{facts} · imgsz {esc(report['imgsz'])} · {esc(depth)}</p></div>
<h2>problems</h2>
{_problems(report)}
{"".join(blocks)}
<h2>per class</h2>
{_table(report)}
</body></html>
"""
