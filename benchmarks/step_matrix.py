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

from tables import arm_table  # benchmarks/tables.py, beside this script

from libreyolo.bench import bench_step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["yolo9-t"])
    ap.add_argument("--batches", nargs="+", type=int, default=[8])
    ap.add_argument("--arms", default="fp32,float16,bfloat16")
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--data", default="shapes", help="dataset the batch comes from (shapes-cls for classifiers)")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=1, help="processes per arm (arms interleaved)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    records = []
    for model in args.models:
        for batch in args.batches:
            user = {"model": model, "data": args.data, "batch": batch, "imgsz": args.imgsz, "device": args.device}
            got = bench_step(user, args.arms.split(","), steps=args.steps, warmup=args.warmup, repeat=args.repeat)
            records += got
            if args.out:  # after every (model, batch): a time-boxed device call keeps what finished
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(records, indent=1))
            print("\n".join(arm_table(got).splitlines()[2:]), file=sys.stderr, flush=True)  # progress
    print(arm_table(records))


if __name__ == "__main__":
    main()
