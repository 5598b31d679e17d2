"""What Python's garbage collector costs a validation's evaluation inside a training process,
with the loop's long-lived objects frozen (engine/trainer.settled_heap, what training does) and
without.

    python benchmarks/collector_cost.py [--model yolo9-t] [--evals 10] [--repeat 3] [--json out.json]

Each arm runs in a process of its own that holds what a training process holds when its loop
starts (torch, torchvision, the model and its AdamW optimizer after one step), then evaluates one
dense validation `--evals` times with the project's evaluator (eval/coco.coco_evaluator and
eval/details.details, as `libreyolo val` does after the network): 24 images of 100 boxes in 4
classes and 300 detections each, the `shapes-dense` regime's sizes at the default max_det. The
evaluation builds a dict per box for faster-coco-eval, and those allocations set off full
collections, each of which walks every tracked object. Prints JSON on stdout (also written to
--json) and a table on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")


def one_arm(arm: str, model: str, evals: int) -> dict:
    sys.path.insert(0, SRC)
    import gc

    import numpy as np
    import torch

    from libreyolo.eval.coco import coco_evaluator
    from libreyolo.eval.details import details
    from libreyolo.model import LibreYOLO

    source = LibreYOLO(model).source
    net = source.spec.build(source.size, 80).train()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    for p in net.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    rng = np.random.default_rng(0)
    gt, dets, sizes = [], [], []
    for i in range(24):
        xy, wh = rng.uniform(0, 490, (100, 2)), rng.uniform(6, 22, (100, 2))
        g = np.c_[np.full(100, i + 1), xy, xy + wh, rng.integers(0, 4, 100)]
        j = rng.integers(0, 100, 300)
        gt.append(g)
        dets.append(np.c_[np.full(300, i + 1), g[j, 1:5] + rng.normal(0, 2, (300, 4)), rng.uniform(0, 1, 300), g[j, 5]])
        sizes.append((512, 512))
    names = ["a", "b", "c", "d"]
    if arm == "frozen":
        gc.collect()
        gc.freeze()
    tracked = len(gc.get_objects())
    before = gc.get_stats()[2]["collections"]
    times = []
    for _ in range(evals):
        t0 = time.perf_counter()
        ev = coco_evaluator(gt, dets, sizes, names)
        details(gt, dets, 24, names, ev.eval["precision"], np.asarray(ev.params.recThrs))
        times.append(time.perf_counter() - t0)
    return {"arm": arm, "tracked_objects": tracked, "eval_s": [round(t, 4) for t in times],
            "total_s": round(sum(times), 3), "full_collections": gc.get_stats()[2]["collections"] - before}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="yolo9-t")
    p.add_argument("--evals", type=int, default=10)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json")
    p.add_argument("--arm", choices=("plain", "frozen"), help=argparse.SUPPRESS)  # one arm, in a child
    args = p.parse_args()
    if args.arm:
        print(json.dumps(one_arm(args.arm, args.model, args.evals)))
        return
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    runs = []
    for _ in range(args.repeat):  # the arms alternate: both meet the same machine load
        for arm in ("plain", "frozen"):
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--model", args.model, "--evals",
                                  str(args.evals), "--arm", arm], capture_output=True, text=True, env=env, check=True)
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            r = runs[-1]
            print(f"{arm}: {r['total_s']} s for {args.evals} evaluations, {r['full_collections']} full collections "
                  f"over {r['tracked_objects']} tracked objects", file=sys.stderr)
    median = {arm: {"total_s": statistics.median(r["total_s"] for r in runs if r["arm"] == arm),
                    "eval_s": statistics.median(t for r in runs if r["arm"] == arm for t in r["eval_s"])}
              for arm in ("plain", "frozen")}
    record = {"what": f"{args.evals} evaluations of a dense validation (24 images x 100 boxes, 300 detections "
                      f"each) beside {args.model} and its AdamW", "date": time.strftime("%Y-%m-%d"),
              "cpus": os.cpu_count(), "python": platform.python_version(), "runs": runs, "median": median}
    text = json.dumps(record, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    print("| arm | evaluations, total s (median of runs) | one evaluation s (median) |", file=sys.stderr)
    print("|---|---|---|", file=sys.stderr)
    for arm, m in median.items():
        print(f"| {arm} | {m['total_s']:.2f} | {m['eval_s']:.3f} |", file=sys.stderr)


if __name__ == "__main__":
    main()
