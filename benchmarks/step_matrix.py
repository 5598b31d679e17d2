"""Run `libreyolo bench step` over a matrix of sizes and batches; save JSON, print a markdown table.

    python benchmarks/step_matrix.py --models yolo9-t yolo9-s --batches 2 8 32 \
        --arms fp32,float16,bfloat16 --imgsz 640 --out benchmarks/results/step_h200.json

Every record is what `libreyolo bench step --json` prints (method in src/libreyolo/bench.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from libreyolo.bench import bench_step


def markdown(records: list[dict]) -> str:
    lines = ["| model | batch | arm | precision | step ms (min / median) | kernel busy ms | utilisation | "
             "synced fwd / loss / bwd / opt+ema ms | network share | peak MiB | graph replays |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        s = r["synced_ms"]
        busy = "-" if r["kernel_busy_ms"] is None else f"{r['kernel_busy_ms']:.1f}"
        util = "-" if r["utilisation"] is None else f"{r['utilisation']:.2f}"
        peak = "-" if r["peak_mem_mb"] is None else f"{r['peak_mem_mb']:.0f}"
        g = r.get("graph") or {}
        replays = f"{g['replayed_steps']}/{g['replayed_steps'] + g['eager_steps']}" if g.get("requested") else "-"
        lines.append(f"| {r['arch']} | {r['batch']} | {r['arm']} | {r['precision']} | "
                     f"{r['step_ms_min']:.1f} / {r['step_ms_median']:.1f} | {busy} | {util} | "
                     f"{s['forward']:.1f} / {s['loss']:.1f} / {s['backward']:.1f} / {s['optimizer+ema']:.1f} | "
                     f"{r['network_share']:.2f} | {peak} | {replays} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["yolo9-t"])
    ap.add_argument("--batches", nargs="+", type=int, default=[8])
    ap.add_argument("--arms", default="fp32,float16,bfloat16")
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=1, help="processes per arm (arms interleaved)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    records = []
    for model in args.models:
        for batch in args.batches:
            user = {"model": model, "data": "shapes", "batch": batch, "imgsz": args.imgsz, "device": args.device}
            got = bench_step(user, args.arms.split(","), steps=args.steps, warmup=args.warmup, repeat=args.repeat)
            records += got
            print("\n".join(markdown(got).splitlines()[2:]), file=sys.stderr, flush=True)  # progress
            if args.out:  # after every (model, batch): a time-boxed session keeps what finished
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(records, indent=1))
    print(markdown(records))


if __name__ == "__main__":
    main()
