"""One training run of the peer trainer (Ultralytics), timed like ours, for time_to_accuracy.py.

Runs only in an environment where `ultralytics` is installed (never a dependency of LibreYOLO).
It trains `yolov9t.yaml` from scratch with the given settings through the peer's public API, times
the run through the peer's public callbacks, then predicts the val split with the peer's own
validator (`save_json=True`, COCO-format boxes in original pixels) outside the timed part, and
prints ONE JSON line: the timings and the predictions as (file stem, class, score, xyxy) rows, so
the caller scores them with the same evaluator as ours.

    python benchmarks/peer_train.py --data DATA.yaml --epochs 5 --batch 8 --imgsz 640 --workers 8 \
        --seed 0 --optimizer auto|SGD --project DIR --name NAME [--extra key=value ...] [--defaults]

`--defaults` gives the peer only what a user types (data, epochs, batch, imgsz, workers, seed, the
run's place and device, and any --extra): no pinned nbs, augmentation or validation settings. Its
output then adds the per-epoch val mAP50-95 curve of its results.csv (parity.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

T_IMPORT = time.time()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--optimizer", default="auto")
    p.add_argument("--project", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--device", default="0")
    p.add_argument("--extra", nargs="*", default=[], help="more train keys as key=value (numbers parsed)")
    p.add_argument("--defaults", action="store_true", help="only what a user types: no pinned settings")
    args = p.parse_args()
    try:
        from ultralytics import YOLO
    except ImportError:
        print("peer_train.py needs the peer trainer installed (pip install ultralytics)", file=sys.stderr)
        return 2

    marks: dict[str, list[float]] = {"epoch_start": [], "epoch_end": [], "val_start": [], "val_end": []}
    first_step: list[float] = []

    def on(name):
        return lambda _trainer_or_validator: marks[name].append(time.perf_counter())

    model = YOLO("yolov9t.yaml")
    model.add_callback("on_train_epoch_start", on("epoch_start"))
    model.add_callback("on_train_epoch_end", on("epoch_end"))
    model.add_callback("on_val_start", on("val_start"))
    model.add_callback("on_val_end", on("val_end"))
    model.add_callback("on_train_batch_start", lambda _t: first_step or first_step.append(time.time()))
    extra = {}
    for kv in args.extra:
        key, value = kv.split("=", 1)
        extra[key] = _number(value)
    typed = dict(data=args.data, epochs=args.epochs, batch=args.batch, imgsz=args.imgsz, workers=args.workers,
                 seed=args.seed, project=args.project, name=args.name, exist_ok=True, device=args.device)
    pinned = dict(nbs=args.batch, optimizer=args.optimizer, mosaic=1.0, mixup=0.0, scale=0.5, close_mosaic=0,
                  val=False, amp=True)
    train_kw = {**typed, **({} if args.defaults else pinned), **extra}
    t0 = time.perf_counter()
    model.train(**train_kw)
    train_s = time.perf_counter() - t0
    train_end = time.time()
    best = Path(args.project) / args.name / "weights" / "best.pt"

    # The peer's own validator writes its predictions; not part of the timed run.
    val_dir = Path(args.project) / f"{args.name}-val"
    metrics = YOLO(str(best)).val(data=args.data, imgsz=args.imgsz, batch=args.batch, conf=0.001, iou=0.7,
                                  save_json=True, project=str(val_dir.parent), name=val_dir.name,
                                  exist_ok=True, device=args.device, plots=False)
    rows = [[str(d["image_id"]), int(d["category_id"]) - 1, float(d["score"]),
             [d["bbox"][0], d["bbox"][1], d["bbox"][0] + d["bbox"][2], d["bbox"][1] + d["bbox"][3]]]
            for d in json.loads((val_dir / "predictions.json").read_text())]
    epochs = [e - s for s, e in zip(marks["epoch_start"], marks["epoch_end"])]
    vals = [e - s for s, e in zip(marks["val_start"], marks["val_end"])]
    steady = statistics.median(epochs[1:]) if len(epochs) > 1 else None
    print(json.dumps({
        "timings": {
            "import_unix": round(T_IMPORT, 3),
            "first_step_unix": round(first_step[0], 3) if first_step else None,
            "epochs_s": [round(e, 4) for e in epochs],
            "first_epoch_s": round(epochs[0], 4) if epochs else None,
            "steady_epoch_s": None if steady is None else round(steady, 4),
            "first_epoch_overhead_s": None if steady is None else round(epochs[0] - steady, 4),
            # every validation the training ran (the last epoch's, and the final one of best.pt)
            "validations_s": [round(v, 4) for v in vals],
            "train_s": round(train_s, 4),
            "train_end_unix": round(train_end, 3),
        },
        "curve": _curve(Path(args.project) / args.name / "results.csv"),
        "peer_map50_95": float(metrics.box.map), "peer_map50": float(metrics.box.map50),
        "predictions": rows,
    }))
    return 0


def _curve(path: Path) -> list[float]:
    """The val mAP50-95 of every epoch, from the peer's results.csv (blank when it did not validate)."""
    import csv

    if not path.exists():
        return []
    with path.open(newline="") as f:
        rows = [{k.strip(): v for k, v in row.items()} for row in csv.DictReader(f)]
    return [float(r["metrics/mAP50-95(B)"]) for r in rows if r.get("metrics/mAP50-95(B)", "").strip()]


def _number(text: str):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


if __name__ == "__main__":
    sys.exit(main())
