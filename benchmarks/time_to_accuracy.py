"""Time to accuracy: our trainer and the peer's on the same generated data, same settings.

    python benchmarks/time_to_accuracy.py --arms ours-graph,ours-eager,peer-default,peer-sgd \
        --epochs 5 --seeds 0 1 --out results.json [--peer-python /path/to/python] [--train 800 --val 100]

The data set is `generate_shapes(seed 0)` with the given train/val split sizes. Every arm is a
fresh process (imports, data scan, model build and worker start count, as a user pays them), run
one after another, never side by side. Both trainers get YOLOv9-t from scratch, batch = nbs, the
same image size and workers, mosaic 1.0 to the end, mixup 0, scale 0.5, and validation only
after the last epoch. Arms:

    ours-graph, ours-eager       our defaults with cuda_graph=true, and with cuda_graph=false
    ours-sgd-graph               ours with SGD lr0 0.01 (the peer's SGD arm's optimizer)
    peer-default, peer-sgd       the peer at its defaults (optimizer=auto), and with SGD lr0 0.01

An arm may add keys: `ours-graph+cudnn_benchmark=false` is ours-graph with that key set.

One metric: the peer's val predictions (its own NMS, COCO json) and ours (our validator) are both
scored by the same faster-coco-eval code against the same ground truth (our val loader's).
Recorded per run: wall clock from process start, time to the first step, first and steady epoch
seconds, first-epoch overhead, validation seconds, mAP50-95 and mAP50. Results: one JSON file
(written after every run) and a markdown table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHARED = {"mosaic": 1.0, "mixup": 0.0, "scale": 0.5}
ARMS = {
    "ours-graph": {"cuda_graph": "true"},
    "ours-eager": {"cuda_graph": "false"},
    "ours-sgd-graph": {"cuda_graph": "true", "optimizer": "sgd", "lr0": "0.01"},
    "peer-default": {"optimizer": "auto"},
    "peer-sgd": {"optimizer": "SGD", "lr0": "0.01"},
}


def arm_keys(arm: str) -> dict[str, str]:
    """The keys of `base+key=value+...`: the base arm's, then the added ones."""
    base, *extra = arm.split("+")
    return {**ARMS[base], **dict(kv.split("=", 1) for kv in extra)}


def make_data(root: Path, train: int, val: int) -> Path:
    """The generated set and a dataset yaml both trainers read."""
    from libreyolo.data.shapes import NAMES, generate_shapes

    data = root / f"shapes-{train}-{val}"
    if not (data / "VERSION").exists():
        generate_shapes(data, seed=0, splits={"train": train, "val": val})
    yaml_path = root / f"shapes-{train}-{val}.yaml"
    names = "\n".join(f"  {i}: {n}" for i, n in enumerate(NAMES))
    yaml_path.write_text(f"path: {data}\ntrain: images/train\nval: images/val\nnames:\n{names}\n")
    return yaml_path


def run_ours(arm: str, args, data: Path, seed: int, work: Path) -> dict:
    keys = {"model": "yolo9-t", "data": str(data), "epochs": args.epochs, "batch": args.batch,
            "nbs": args.batch, "imgsz": args.imgsz, "workers": args.workers, "seed": seed,
            "no_aug_epochs": 0, "eval_interval": args.epochs, "device": args.device,
            "project": str(work), "name": f"{arm}-s{seed}", "exist_ok": "true",
            **SHARED, **arm_keys(arm), **dict(kv.split("=", 1) for kv in args.ours_extra)}
    cmd = [sys.executable, "-m", "libreyolo", "train", *(f"{k}={v}" for k, v in keys.items()), "--json"]
    t0 = time.time()
    out = _run(cmd, work / f"{arm}-s{seed}.log")
    wall = time.time() - t0
    result = json.loads(out.strip().splitlines()[-1])
    t = result["timings"]
    return {"wall_s": wall, "time_to_first_step_s": t["first_step_unix"] - t0,
            "first_epoch_s": t["first_epoch_s"], "steady_epoch_s": t["steady_epoch_s"],
            "first_epoch_overhead_s": t["first_epoch_overhead_s"], "epochs_s": t["epochs_s"],
            "validation_s": t["validation_s"], "val_img_s": t["val_img_s"],
            "map50_95": result["metrics"]["map50_95"], "map50": result["metrics"]["map50"]}


def run_peer(arm: str, args, data: Path, seed: int, work: Path) -> dict:
    kw = arm_keys(arm)
    cmd = [args.peer_python, str(HERE / "peer_train.py"), "--data", str(data), "--epochs", str(args.epochs),
           "--batch", str(args.batch), "--imgsz", str(args.imgsz), "--workers", str(args.workers),
           "--seed", str(seed), "--optimizer", kw["optimizer"], "--project", str(work),
           "--name", f"{arm}-s{seed}", "--device", "cpu" if args.device == "cpu" else "0",
           "--extra", *(f"{k}={v}" for k, v in kw.items() if k != "optimizer"), *args.peer_extra]
    t0 = time.time()
    out = _run(cmd, work / f"{arm}-s{seed}.log")
    wall = time.time() - t0
    result = json.loads(out.strip().splitlines()[-1])
    t = result["timings"]
    map50_95, map50 = score_rows(data, result["predictions"], args)
    vals = t["validations_s"]
    return {"wall_s": wall, "time_to_first_step_s": t["first_step_unix"] - t0,
            "first_epoch_s": t["first_epoch_s"], "steady_epoch_s": t["steady_epoch_s"],
            "first_epoch_overhead_s": t["first_epoch_overhead_s"], "epochs_s": t["epochs_s"],
            "validation_s": sum(vals), "val_img_s": args.val / vals[0] if vals else None,
            "map50_95": map50_95, "map50": map50,
            "peer_own_map50_95": result["peer_map50_95"], "peer_own_map50": result["peer_map50"]}


def score_rows(data: Path, rows: list, args) -> tuple[float, float]:
    """Score (stem, class, score, xyxy) rows in original pixels against our val loader's truth."""
    import numpy as np
    import torch

    from libreyolo.config import build_config
    from libreyolo.data import build_val_loader, load_data_config
    from libreyolo.eval.coco import _Collector, coco_map

    data_cfg = load_data_config(str(data))
    cfg = build_config({"data": str(data), "imgsz": args.imgsz, "workers": 0, "batch": 16})
    loader = build_val_loader(data_cfg, cfg)
    collector = _Collector()
    for batch in loader:
        collector.add(batch, [torch.zeros((0, 6))] * len(batch.images))
    dense = {Path(f).stem: collector.ids[i] for i, f in enumerate(loader.files)}
    dets = np.array([[dense[stem], *box, score, cls] for stem, cls, score, box in rows], np.float64)
    return coco_map(collector.gt, [dets] if len(dets) else [], collector.sizes, data_cfg.names)


def _run(cmd: list[str], log: Path) -> str:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log.open("w") as err:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[1]} exited {proc.returncode}; see {log}")
    return proc.stdout


def table(runs: list[dict]) -> str:
    cols = ["wall_s", "time_to_first_step_s", "first_epoch_s", "steady_epoch_s", "first_epoch_overhead_s",
            "validation_s", "val_img_s", "map50_95", "map50"]
    lines = ["| arm | seed | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
    for r in runs:
        cells = [_fmt(r.get(c)) for c in cols]
        lines.append(f"| {r['arm']} | {r['seed']} | " + " | ".join(cells) + " |")
    by_arm: dict[str, list[dict]] = {}
    for r in runs:
        by_arm.setdefault(r["arm"], []).append(r)
    lines += ["", "| arm | runs | median wall s | median mAP50-95 |", "|---|---|---|---|"]
    for arm, rs in by_arm.items():
        lines.append(f"| {arm} | {len(rs)} | {statistics.median(r['wall_s'] for r in rs):.1f} | "
                     f"{statistics.median(r['map50_95'] for r in rs):.3f} |")
    return "\n".join(lines)


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.3f}" if isinstance(v, float) and abs(v) < 10 else f"{v:.1f}" \
        if isinstance(v, float) else str(v)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arms", default="ours-graph,ours-eager,peer-default,peer-sgd")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--train", type=int, default=800)
    p.add_argument("--val", type=int, default=100)
    p.add_argument("--device", default="0")
    p.add_argument("--work", type=Path, default=Path("/tmp/tta"))
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--peer-python", default=os.environ.get("PEER_PYTHON", sys.executable))
    p.add_argument("--ours-extra", nargs="*", default=[], help="more key=value for our arms")
    p.add_argument("--peer-extra", nargs="*", default=[], help="more key=value for the peer's arms")
    args = p.parse_args()
    arms = args.arms.split(",")
    unknown = [a for a in arms if a.split("+")[0] not in ARMS or any("=" not in kv for kv in a.split("+")[1:])]
    if unknown:
        print(f"unknown arm(s) {', '.join(unknown)}; choose from {', '.join(ARMS)}", file=sys.stderr)
        return 2
    args.work.mkdir(parents=True, exist_ok=True)
    data = make_data(args.work, args.train, args.val)
    runs = []
    for seed in args.seeds:
        for arm in arms:
            run = run_peer if arm.startswith("peer") else run_ours
            try:
                r = run(arm, args, data, seed, args.work)
            except Exception as exc:  # one failed arm must not lose the others' results
                r = {"error": str(exc)}
                print(f"{arm} seed {seed}: {exc}", file=sys.stderr)
            runs.append({"arm": arm, "seed": seed, "epochs": args.epochs, "batch": args.batch,
                         "imgsz": args.imgsz, "workers": args.workers, **r})
            args.out.write_text(json.dumps({"settings": vars(args) | {"work": str(args.work), "out": str(args.out)},
                                            "runs": runs}, indent=1, default=str))
    print(table([r for r in runs if "error" not in r]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
