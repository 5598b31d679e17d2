"""Markdown tables for docs/training-performance.md from the `bench step` JSON records.

    python benchmarks/tables.py benchmarks/results/h200/step_*.json

Prints three tables: precision (arms side by side, peak memory), eager vs graphed per model x
batch x precision, and the synchronised phase split. A graphed arm's peak allocated memory leaves
out the graph's private pool (replays do not go through the allocator): the pool is added.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

PRECISIONS = {"fp32": "fp32", "float16": "float16", "bfloat16": "bfloat16"}


def load(paths: list[str]) -> list[dict]:
    records = []
    for path in paths:
        records += json.loads(Path(path).read_text())
    return records


def base_arm(arm: str) -> tuple[str, bool]:
    """('float16', True) for 'float16+graph'; layout arms ('+nchw') are kept in the name."""
    parts = arm.split("+")
    return "+".join(p for p in parts if p != "graph"), "graph" in parts


def pairs(records: list[dict]) -> list[tuple[dict, dict | None]]:
    """(eager record, graphed record or None) per model, batch and precision, in input order."""
    index = {(r["arch"], r["batch"], *base_arm(r["arm"])): r for r in records}
    out = []
    for r in records:
        name, graphed = base_arm(r["arm"])
        if not graphed:
            out.append((r, index.get((r["arch"], r["batch"], name, True))))
    return out


def graph_table(records: list[dict]) -> str:
    rows = ["| model | batch | precision | eager ms (min / median) | graphed ms (min / median) | speed-up "
            "| utilisation eager / graphed | network share (eager) | peak MiB eager / graphed + pool | replayed |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for e, g in pairs(records):
        if g is None:
            continue
        rep = g["graph"]
        rows.append(f"| {e['arch']} | {e['batch']} | {base_arm(e['arm'])[0]} | "
                    f"{e['step_ms_min']:.1f} / {e['step_ms_median']:.1f} | {g['step_ms_min']:.1f} / {g['step_ms_median']:.1f} | "
                    f"{e['step_ms_median'] / g['step_ms_median']:.2f}x | {e['utilisation']:.2f} / {g['utilisation']:.2f} | "
                    f"{e['network_share']:.2f} | {e['peak_mem_mb']:.0f} / {g['peak_mem_mb']:.0f} + {rep['pool_mb'] or 0:.0f} | "
                    f"{rep['replayed_steps']}/{rep['replayed_steps'] + rep['eager_steps']} |")
    return "\n".join(rows)


def split_table(records: list[dict]) -> str:
    rows = ["| model | batch | arm | kernel busy ms | synced forward / loss / backward / optimizer+EMA ms |",
            "|---|---|---|---|---|"]
    for r in records:
        s = r["synced_ms"]
        rows.append(f"| {r['arch']} | {r['batch']} | {r['arm']} | {r['kernel_busy_ms']:.1f} | "
                    f"{s['forward']:.1f} / {s['loss']:.1f} / {s['backward']:.1f} / {s['optimizer+ema']:.1f} |")
    return "\n".join(rows)


def precision_table(records: list[dict], arch: str, batch: int) -> str:
    rows = ["| arm | precision | step ms (min / median) | kernel busy ms | utilisation | peak MiB |",
            "|---|---|---|---|---|---|"]
    for r in records:
        if r["arch"] == arch and r["batch"] == batch:
            rows.append(f"| {r['arm']} | {r['precision']} | {r['step_ms_min']:.1f} / {r['step_ms_median']:.1f} | "
                        f"{r['kernel_busy_ms']:.1f} | {r['utilisation']:.2f} | {r['peak_mem_mb']:.0f} |")
    return "\n".join(rows)


def main() -> None:
    records = load(sys.argv[1:])
    if not records:
        sys.exit("usage: python benchmarks/tables.py RESULTS.json [...]")
    r0 = records[0]
    print(f"## precision: {r0['arch']} batch {r0['batch']}\n")
    print(precision_table(records, r0["arch"], r0["batch"]))
    print("\n## eager vs graphed\n")
    print(graph_table(records))
    print("\n## step composition (synchronised per phase)\n")
    print(split_table(records))


if __name__ == "__main__":
    main()
