"""Multi-GPU scaling: YOLOv9-t at 640 px, float16, batch 16 per GPU, on 1 GPU and on 2 (DDP).

    python3 benchmarks/ddp_scaling.py --epochs 10 --seeds 0 1 --work /tmp/ddp --out ddp_scaling.json

Each arm is the real command: `libreyolo train ... device=0` and `libreyolo train ... batch=32
device=0,1` (which starts its two processes under torch's elastic launcher, as torchrun does).
Both train on the generated 800/100 set (benchmarks/time_to_accuracy.py's) with the default
nominal batch (nbs 64: 4 x 16 images per optimizer step on one GPU, 2 x 32 on two), so they make
the same optimizer steps per epoch and their mAP at equal epochs is comparable.

Throughput: train images / the steady epoch time of timings.json (median of the epochs after the
first; the step loop with data loading, without validation and checkpoints), all ranks' images.
Scaling efficiency: img/s on 2 GPUs / (2 x img/s on 1 GPU). mAP50-95 after the last epoch, per
seed; the 1-GPU seeds give the run-to-run noise the 2-GPU figure is judged against. The machine's
NCCL settings (NVLink multicast off) are left as they are.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from time_to_accuracy import make_data  # noqa: E402

from libreyolo.data.shapes import NAMES  # noqa: E402  (make_data's classes)

MODEL, AMP_DTYPE, BATCH_PER_GPU = "yolo9-t", "float16", 16
ARMS = {"1gpu": {"batch": BATCH_PER_GPU, "device": "0"}, "2gpu": {"batch": 2 * BATCH_PER_GPU, "device": "0,1"}}


def run(arm: str, seed: int, args, data: Path) -> dict:
    keys = {"model": MODEL, "data": str(data), "imgsz": args.imgsz, "epochs": args.epochs, "workers": args.workers,
            "amp_dtype": AMP_DTYPE, "seed": seed, "eval_interval": args.epochs, "project": str(args.work),
            "name": f"{arm}-s{seed}", "exist_ok": "true", **ARMS[arm]}
    cmd = [sys.executable, "-m", "libreyolo", "train", *(f"{k}={v}" for k, v in keys.items()), "--json"]
    log = args.work / f"{arm}-s{seed}.log"
    t0 = time.time()
    with log.open("w") as f:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=f, text=True)
    wall = time.time() - t0
    record = {"arm": arm, "seed": seed, "rc": proc.returncode, "wall_s": round(wall, 1), **ARMS[arm]}
    if proc.returncode:
        record["error"] = log.read_text()[-500:]
        return record
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    timings = result["timings"]
    images = args.train
    record.update(map50_95=result["metrics"].get("map50_95"), map50=result["metrics"].get("map50"),
                  steady_epoch_s=timings["steady_epoch_s"], first_epoch_s=timings["first_epoch_s"],
                  img_s=round(images / timings["steady_epoch_s"], 1) if timings["steady_epoch_s"] else None)
    return record


def summarise(records: list[dict]) -> dict:
    def ok(arm):
        return [r for r in records if r["arm"] == arm and r["rc"] == 0 and r.get("img_s")]

    one, two = ok("1gpu"), ok("2gpu")
    out: dict = {}
    if one and two:
        s1, s2 = statistics.median(r["img_s"] for r in one), statistics.median(r["img_s"] for r in two)
        out = {"img_s_1gpu": s1, "img_s_2gpu": s2, "scaling_efficiency": round(s2 / (2 * s1), 3),
               "map50_95_1gpu": [r["map50_95"] for r in one], "map50_95_2gpu": [r["map50_95"] for r in two]}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--train", type=int, default=800)
    p.add_argument("--val", type=int, default=100)
    p.add_argument("--work", type=Path, default=Path("/tmp/ddp"))
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    data = make_data(args.work, args.train, args.val)
    records: list[dict] = []
    # `setup` is what benchmarks/scaling_model.py --check reads to predict this run
    setup = {"model": MODEL, "imgsz": args.imgsz, "amp_dtype": AMP_DTYPE, "batch_per_gpu": BATCH_PER_GPU,
             "gpus": len(ARMS["2gpu"]["device"].split(",")), "classes": len(NAMES)}
    doc = {"method": __doc__.split("\n\n", 2)[2].strip(), "setup": setup, "epochs": args.epochs, "train_images": args.train,
           "env": {k: os.environ[k] for k in sorted(os.environ) if k.startswith("NCCL_")}, "runs": records}
    for seed in args.seeds:  # interleaved, so a drifting machine affects both arms alike
        for arm in ARMS:
            records.append(run(arm, seed, args, data))
            doc["summary"] = summarise(records)
            args.out.write_text(json.dumps(doc, indent=1))
            print(json.dumps(records[-1]), flush=True)
    print(json.dumps(doc["summary"]))


if __name__ == "__main__":
    main()
