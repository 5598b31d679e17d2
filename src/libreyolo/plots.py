"""results.html: one self-contained page for a training run (plotly.js inlined, no network).

Built from what the run directory already holds plus the last validation's details:
- per epoch, from results.csv: the training loss items, the task's metrics (mAP50 and mAP50-95,
  or top-1 and top-5; epochs that validated), the learning rate;
- from the last validation: the per-class table, and for detection (eval/details.py) precision-
  recall curves per class at IoU 0.5, mean F1 against confidence (where P and R are read) and the
  confusion matrix.

No PNGs: plotly's static export needs kaleido and a Chrome at run time (seconds per figure), and
drawing every plot a second time in matplotlib would double this module for pictures the page
already shows; a browser's "download plot as a png" button (on every plot) makes one when wanted.
Every name that comes from the data (class names, the dataset) is HTML-escaped.
"""

from __future__ import annotations

import csv
import html
from pathlib import Path
from typing import Any

from .atomic import write_text_atomic

PAGE = "results.html"
# Text in every confusion-matrix cell up to this many classes; beyond, hover only (80 COCO classes
# would be unreadable ink).
CELL_TEXT_MAX_CLASSES = 30


def read_results(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def write_results_html(run_dir: Path, task, details: dict[str, Any] | None, meta: dict[str, Any]) -> Path:
    """Render `run_dir/results.html` from `run_dir/results.csv` and `details` (None: no
    validation yet) for `task` (tasks/); written to a temp file and renamed."""
    run_dir = Path(run_dir)
    # make_dirs=False: a run directory deleted under the run is not made again by its page.
    return write_text_atomic(run_dir / PAGE, render(read_results(run_dir / "results.csv"), task, details, meta),
                             make_dirs=False)


def render(rows: list[dict[str, str]], task, details: dict[str, Any] | None, meta: dict[str, Any]) -> str:
    """The whole page as one string: plotly.js inlined once, in the first figure."""
    figures = [_epoch_curves(rows, task)]
    if details and details.get("curves"):
        curves = details["curves"]
        figures += [_pr_curves(curves["pr"]), _f1_curve(curves["f1"]), _confusion(curves["confusion"])]
    blocks = [fig.to_html(full_html=False, include_plotlyjs=(i == 0), config={"displaylogo": False})
              for i, fig in enumerate(figures)]
    table = _class_table(details, task) if details and details.get("per_class") else (
        "<p class='note'>No validation has run yet (or <code>val=false</code>): only the training curves.</p>")
    return _page(meta, blocks[0], table, blocks[1:])


def esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _floats(rows: list[dict[str, str]], key: str) -> tuple[list[int], list[float]]:
    """(epochs, values) of a results.csv column, leaving out blank cells (epochs not validated)."""
    xs, ys = [], []
    for r in rows:
        try:
            x, y = int(r["epoch"]), float(r[key])
        except (KeyError, TypeError, ValueError):
            continue
        xs.append(x)
        ys.append(y)
    return xs, ys


def _epoch_curves(rows: list[dict[str, str]], task):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=3, subplot_titles=("training loss items (epoch mean)", "validation",
                                                        "learning rate (end of epoch)"))
    losses = [k for k in (rows[0] if rows else {}) if k.startswith("train/")]
    for key in losses:
        xs, ys = _floats(rows, key)
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=esc(key.removeprefix("train/")),
                                 legendgroup="loss"), row=1, col=1)
    for key in task.metrics:
        label = task.labels[key]
        xs, ys = _floats(rows, key)
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=label, legendgroup="map"), row=1, col=2)
    xs, ys = _floats(rows, "lr")
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name="lr", legendgroup="lr"), row=1, col=3)
    for col in (1, 2, 3):
        fig.update_xaxes(title_text="epoch", row=1, col=col)
    fig.update_layout(height=380, margin={"l": 50, "r": 20, "t": 50, "b": 40})
    return fig


def _pr_curves(pr: dict[str, Any]):
    import plotly.graph_objects as go

    fig = go.Figure()
    recall = pr.get("recall") or []
    classes = pr.get("classes") or []
    for c in classes:
        fig.add_trace(go.Scatter(x=recall, y=c["precision"], mode="lines", line={"width": 1},
                                 name=f"{esc(c['class'])} {c['ap50']:.3f}"))
    if classes:
        mean = [sum(col) / len(col) for col in zip(*(c["precision"] for c in classes))]
        area = sum(mean) / len(mean)
        fig.add_trace(go.Scatter(x=recall, y=mean, mode="lines", line={"width": 4, "color": "#1f3b73"},
                                 name=f"all classes: mAP50 {area:.3f}"))
    fig.update_layout(title=f"precision-recall at IoU {pr.get('iou', 0.5)} (legend: AP50 per class)",
                      xaxis={"title": "recall", "range": [0, 1]}, yaxis={"title": "precision", "range": [0, 1.02]},
                      height=480, margin={"l": 50, "r": 20, "t": 50, "b": 40})
    return fig


def _f1_curve(f1: dict[str, Any]):
    import plotly.graph_objects as go

    fig = go.Figure(go.Scatter(x=f1.get("conf") or [], y=f1.get("mean_f1") or [], mode="lines", name="mean F1"))
    best = f1.get("best_conf")
    if best is not None:
        fig.add_vline(x=best, line_dash="dash", annotation_text=f"P and R read at confidence {best:.3f}")
    fig.update_layout(title=f"mean F1 over classes against confidence (IoU {f1.get('iou', 0.5)})",
                      xaxis={"title": "confidence", "range": [0, 1]}, yaxis={"title": "F1", "range": [0, 1.02]},
                      height=360, margin={"l": 50, "r": 20, "t": 50, "b": 40})
    return fig


def _confusion(cm: dict[str, Any]):
    import plotly.graph_objects as go

    names = [esc(n) for n in cm["names"]]
    counts = cm["matrix"]
    # Each column (a true class) as fractions, so a rare class reads as clearly as a common one;
    # the hover shows the counts.
    totals = [sum(row[j] for row in counts) for j in range(len(names))]
    z = [[row[j] / totals[j] if totals[j] else 0.0 for j in range(len(names))] for row in counts]
    text = [[str(v) for v in row] for row in counts]
    show = len(names) - 1 <= CELL_TEXT_MAX_CLASSES
    fig = go.Figure(go.Heatmap(z=z, x=names, y=names, colorscale="Blues", zmin=0, zmax=1, text=text,
                               texttemplate="%{text}" if show else None,
                               hovertemplate="predicted %{y}<br>true %{x}<br>%{text} boxes (%{z:.2f} of the column)"
                                             "<extra></extra>", colorbar={"title": "share of<br>column"}))
    side = max(460, 28 * len(names) + 180)
    fig.update_layout(title=f"confusion matrix: IoU {cm['iou']}, confidence >= {cm['conf']}",
                      xaxis={"title": "true class (background: a detection of nothing)", "tickangle": -45},
                      yaxis={"title": "predicted class (background: missed)", "autorange": "reversed"},
                      height=side, width=side + 160, margin={"l": 130, "r": 20, "t": 60, "b": 130})
    return fig


def _class_table(details: dict[str, Any], task) -> str:
    head_row, rows = task.table(details)
    head = "".join(f"<th>{esc(h)}</th>" for h in head_row)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in rows)
    return (f"<h2>validation per class (the last validation)</h2><p class='note'>{esc(task.table_note)}.</p>"
            f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")


def _page(meta: dict[str, Any], epochs: str, table: str, validation: list[str]) -> str:
    title = f"{meta.get('arch', '')} on {meta.get('data', '')}"
    facts = " · ".join(esc(f"{k} {v}") for k, v in meta.items() if k not in ("arch", "data") and v not in (None, ""))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>LibreYOLO run: {esc(title)}</title>
<style>body{{font-family:system-ui,sans-serif;margin:16px;color:#222}}
.banner{{border-left:8px solid #1f3b73;background:#f6f6f6;padding:10px 16px;margin-bottom:12px}}
.banner h1{{margin:0;font-size:22px;color:#1f3b73}} .banner p{{margin:4px 0}} .note{{color:#555}}
table{{border-collapse:collapse;margin:8px 0 24px}} th,td{{padding:3px 10px;text-align:right;border-bottom:1px solid #ddd}}
th:first-child,td:first-child{{text-align:left}} tbody tr:first-child{{font-weight:bold}}</style></head>
<body><div class="banner"><h1>{esc(title)}</h1><p>{facts}</p></div>
<h2>training, per epoch</h2>
{epochs}
{table}
{"".join(validation)}
</body></html>
"""
