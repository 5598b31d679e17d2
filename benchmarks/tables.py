"""Markdown tables for docs/training-performance.md from the `bench step` JSON records.

    python benchmarks/tables.py benchmarks/results/h200/step_*.json

Prints two tables: every arm with all its figures, and eager vs graphed per model x batch x
precision. A graphed arm's peak allocated memory leaves
out the graph's private pool (replays do not go through the allocator): the pool is added.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


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


def arm_table(records: list[dict]) -> str:
    """One row per arm: every figure of the record (what step_matrix.py prints as it goes)."""
    rows = ["| model | batch | arm | precision | step ms (min / median) | kernel busy ms | utilisation | "
            "synced fwd / loss / bwd / opt+ema ms | network share | peak MiB | graph replays |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        s, whole = r["synced_ms"], r.get("whole_step") or {}
        if whole.get("enabled"):
            # cuda_graph=full: "forward" times the micro-step replay (forward, loss and backward in
            # one graph) and "optimizer" the update's; the network's own share is not separable.
            phases = f"whole {s.get('forward', 0.0):.1f} / - / - / {s.get('optimizer+ema', 0.0):.1f}"
            share, g = "-", whole
        else:  # a phase the step did not mark prints "-"
            phases = " / ".join("-" if s.get(k) is None else f"{s[k]:.1f}" for k in ("forward", "loss", "backward", "optimizer+ema"))
            share, g = f"{r['network_share']:.2f}", r.get("graph") or {}
        busy = "-" if r["kernel_busy_ms"] is None else f"{r['kernel_busy_ms']:.1f}"
        util = "-" if r["utilisation"] is None else f"{r['utilisation']:.2f}"
        peak = "-" if r["peak_mem_mb"] is None else f"{r['peak_mem_mb']:.0f}"
        counted = g.get("requested") or g.get("enabled")
        replays = f"{g['replayed_steps']}/{g['replayed_steps'] + g['eager_steps']}" if counted else "-"
        rows.append(f"| {r['arch']} | {r['batch']} | {r['arm']} | {r['precision']} | "
                    f"{r['step_ms_min']:.1f} / {r['step_ms_median']:.1f} | {busy} | {util} | "
                    f"{phases} | "
                    f"{share} | {peak} | {replays} |")
    return "\n".join(rows)


def main() -> None:
    records = load(sys.argv[1:])
    if not records:
        sys.exit("usage: python benchmarks/tables.py RESULTS.json [...]")
    print("## every arm\n")
    print(arm_table(records))
    print("\n## eager vs graphed\n")
    print(graph_table(records))


if __name__ == "__main__":
    main()
