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


def print_class_table(metrics: dict[str, Any], file=None) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(file=file or sys.stderr, highlight=False, soft_wrap=True)
    rows = class_rows(metrics)
    if console.is_terminal:
        table = Table(title="validation: P and R at the confidence of the best mean F1; mAP at IoU 0.5 and 0.5:0.95",
                      title_justify="left")
        for i, h in enumerate(HEAD):
            table.add_column(h, justify="left" if i == 0 else "right")
        for i, r in enumerate(rows):
            table.add_row(*(Text(c) for c in r), end_section=i == 0)  # class names are data, not markup
        console.print(table)
        return
    widths = [max(len(r[i]) for r in [HEAD, *rows]) for i in range(len(HEAD))]
    for r in [HEAD, *rows]:
        console.print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))),
                      markup=False)


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"
