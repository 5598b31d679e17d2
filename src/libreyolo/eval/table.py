"""The per-class validation table: a rich table on a terminal, plain aligned text in a log.

On stderr by default: stdout carries the command's result (`val --json`).
"""

from __future__ import annotations

import sys
from typing import Any

HEAD = ["class", "images", "instances", "P", "R", "mAP50", "mAP50-95"]


def class_rows(metrics: dict[str, Any]) -> list[list[str]]:
    """The `all` row, then one row per class (`-` where a class has no ground truth to measure)."""
    per_class = metrics.get("per_class") or []
    instances = sum(r["instances"] for r in per_class)
    rows = [["all", str(metrics.get("num_images", 0)), str(instances), _f(metrics.get("precision")),
             _f(metrics.get("recall")), _f(metrics.get("map50")), _f(metrics.get("map50_95"))]]
    rows += [[r["class"], str(r["images"]), str(r["instances"]), _f(r["precision"]), _f(r["recall"]),
              _f(r["map50"]), _f(r["map50_95"])] for r in per_class]
    return rows


def detect_table(metrics: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Detection's per-class table: (head, rows)."""
    return HEAD, class_rows(metrics)


CLASSIFY_HEAD = ["class", "images", "top-1", "top-5"]


def classify_table(metrics: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Classification's per-class table: (head, rows), the `all` row first."""
    rows = [["all", str(metrics.get("num_images", 0)), _f(metrics.get("top1")), _f(metrics.get("top5"))]]
    rows += [[r["class"], str(r["images"]), _f(r["top1"]), _f(r["top5"])] for r in metrics.get("per_class") or []]
    return CLASSIFY_HEAD, rows


POINTS_HEAD = ["class", "images", "instances", "P", "R", "F1"]


def points_table(metrics: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Point detection's per-class table: (head, rows), the `all` row first."""
    per_class = metrics.get("per_class") or []
    rows = [["all", str(metrics.get("num_images", 0)), str(sum(r["instances"] for r in per_class)),
             _f(metrics.get("precision")), _f(metrics.get("recall")), _f(metrics.get("f1"))]]
    rows += [[r["class"], str(r["images"]), str(r["instances"]), _f(r["precision"]), _f(r["recall"]), _f(r["f1"])]
             for r in per_class]
    return POINTS_HEAD, rows


SEGMENT_HEAD = ["class", "pixels", "IoU", "acc"]


def segment_table(metrics: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Segmentation's per-class table: (head, rows), the `all` row first (mIoU, pixel accuracy);
    `-` for a class absent from both the ground truth and the predictions."""
    per_class = metrics.get("per_class") or []
    rows = [["all", str(sum(r["pixels"] for r in per_class)), _f(metrics.get("miou")), _f(metrics.get("pixel_acc"))]]
    rows += [[r["class"], str(r["pixels"]), _f(r["iou"]), _f(r["acc"])] for r in per_class]
    return SEGMENT_HEAD, rows


def print_rows(head: list[str], rows: list[list[str]], title: str, file=None) -> None:
    """A rich table on a terminal, plain aligned columns in a log; the first row is the total."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(file=file or sys.stderr, highlight=False, soft_wrap=True)
    if console.is_terminal:
        table = Table(title=title, title_justify="left")
        for i, h in enumerate(head):
            table.add_column(h, justify="left" if i == 0 else "right")
        for i, r in enumerate(rows):
            table.add_row(*(Text(c) for c in r), end_section=i == 0)  # class names are data, not markup
        console.print(table)
        return
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, *rows]:
        console.print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))),
                      markup=False)


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"
