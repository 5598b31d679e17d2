"""Training-loader throughput on the built-in `shapes` dataset (mosaic on).

    python benchmarks/loader.py [--workers 0 2 4] [--batches N] [--imgsz 640] [--batch 8]
                                [--cache ram|disk] [--json out.json]

For each worker count: build the training loader, drain `--warmup` batches (worker start-up,
first decodes), then time `--batches` batches; images/s = images delivered / wall seconds.
The loader iterates over epochs as needed (persistent workers stay up). Prints JSON on stdout
(also written to --json) and a small table on stderr. Augmentation values are the TrainConfig
defaults, with mosaic forced on; nothing runs on a GPU, so pin_memory follows CUDA availability.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from types import SimpleNamespace

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from libreyolo.data import build_train_loader, load_data_config  # noqa: E402

AUG = dict(mosaic=1.0, mixup=0.0, hsv_h=0.015, hsv_s=0.7, hsv_v=0.4, fliplr=0.5, degrees=0.0,
           translate=0.1, scale=0.5, shear=0.0)


def measure(data_cfg, workers: int, args) -> dict:
    cfg = SimpleNamespace(batch=args.batch, imgsz=args.imgsz, workers=workers, cache=args.cache,
                          seed=0, multi_scale=False, epochs=1000, no_aug_epochs=0, **AUG)
    loader = build_train_loader(data_cfg, cfg)
    it, epoch = iter(loader), 0

    def next_batch():
        nonlocal it, epoch
        try:
            return next(it)
        except StopIteration:
            epoch += 1
            loader.set_epoch(epoch)
            it = iter(loader)
            return next(it)

    for _ in range(args.warmup):
        next_batch()
    images = 0
    t0 = time.perf_counter()
    for _ in range(args.batches):
        images += next_batch().images.shape[0]
    seconds = time.perf_counter() - t0
    return {"workers": workers, "images": images, "seconds": round(seconds, 3),
            "images_per_s": round(images / seconds, 1),
            "ms_per_batch": round(1000 * seconds / args.batches, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 2, 4])
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--cache", choices=["ram", "disk"], default=False)
    ap.add_argument("--json", default=None, help="also write the JSON here")
    args = ap.parse_args()

    data_cfg = load_data_config("shapes")
    results = [measure(data_cfg, w, args) for w in args.workers]
    report = {"benchmark": "train-loader", "dataset": "shapes", "imgsz": args.imgsz,
              "batch": args.batch, "cache": args.cache or "none", "augment": AUG,
              "cpu_count": os.cpu_count(), "torch": torch.__version__,
              "machine": platform.processor() or platform.machine(), "results": results}
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    print(f"{'workers':>8} {'images/s':>10} {'ms/batch':>10}", file=sys.stderr)
    for r in results:
        print(f"{r['workers']:>8} {r['images_per_s']:>10} {r['ms_per_batch']:>10}", file=sys.stderr)


if __name__ == "__main__":
    main()
