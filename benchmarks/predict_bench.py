"""Predict throughput and latency, ours (eager and CUDA-graphed) and the peer's, on the same images.

    python benchmarks/predict_bench.py --models yolo9-t yolox-t rtmdet-t --batches 1 8 32 \
        --arms eager,graph --out predict.json [--peer-python /path/to/python] [--images 256]

Every arm is a fresh process (its own CUDA context, allocator, cuDNN state and graph pool), run one
after another. The images are the built-in shapes set's files (train then val, about 600 px,
cycled to --images), read from disk by each side's own predict: decode, letterbox, upload,
forward, NMS and boxes mapped back to original pixels are all inside the timed loop. Models are
built from scratch (80 classes, random weights: nothing to download here), float16 at
640, conf 0.25, iou 0.7; ours in float16 weights, the peer with `half=True`.

Per arm: images/s over the timed pass (after a warm-up pass over two batches, which also captures
the graph), latency per batch (= per image at batch 1), and the stage split measured in a second,
synchronised pass: prepare (decode + letterbox on the host), infer (upload + forward) and post
(NMS + unletterbox), each ms per batch, with post's share. The peer arm runs its `predict` on
YOLOv9-t only (the peer has no YOLOX or RTMDet models) and reports its own per-image speed split.
Results: one JSON file (rewritten after every arm) and a markdown table on stdout.
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
IMGSZ, CONF, IOU = 640, 0.25, 0.7


def image_files(n: int) -> list[str]:
    from libreyolo.data import load_data_config

    shapes = load_data_config("shapes")
    files = [str(p) for p in [*shapes.train, *shapes.val]]
    return [files[i % len(files)] for i in range(n)]


def ours(model: str, batch: int, arm: str, n: int) -> dict:
    import torch

    from libreyolo import LibreYOLO
    from libreyolo.predict.options import check_options
    from libreyolo.predict.post import PostOptions
    from libreyolo.predict.sources import open_source

    files = image_files(n)
    lib = LibreYOLO(model)
    opts = {"imgsz": IMGSZ, "batch": batch, "conf": CONF, "iou": IOU, "amp_dtype": "float16",
            "cuda_graph": arm == "graph", "device": "cuda", "workers": 4}
    list(lib.predict(files[: 2 * batch], **opts))  # warm-up: cuDNN, allocator, the graph's capture
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    results = lib.predict(files, stream=True, **opts)
    dets = sum(len(r) for r in results)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    predictor = lib._predictor(check_options(opts))
    # The stage split: each stage of each batch synchronised, on the same files; prepare is the
    # decode and the letterbox, on this thread.
    post = PostOptions(CONF, IOU, 300)
    stages: dict[str, list[float]] = {"prepare": [], "infer": [], "post": []}
    frames = iter(open_source(files))
    for _ in range(0, n, batch):
        t = time.perf_counter()
        chunk = [next(frames) for _ in range(batch)]
        prepared = [predictor.prepare(f.image) for f in chunk]
        images = torch.stack([p[0] for p in prepared])
        t1 = time.perf_counter()
        preds = predictor.infer(images)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        with torch.inference_mode():
            predictor.task.results(preds, [p[1] for p in prepared], chunk, predictor.names, post)
        t3 = time.perf_counter()
        for key, value in zip(stages, (t1 - t, t2 - t1, t3 - t2)):
            stages[key].append(value * 1e3)
    split = {k: statistics.median(v) for k, v in stages.items()}
    graph = predictor.graph
    return {"side": "ours", "model": model, "batch": batch, "arm": arm, "conf": CONF, "images": n, "seconds": seconds,
            "images_per_s": n / seconds, "batch_latency_ms": seconds / (n / batch) * 1e3,
            "detections_per_image": dets / n, "stage_ms_per_batch": split,
            "post_share": split["post"] / sum(split.values()),
            "graph": None if graph is None else {"replays": graph.replays, "eager_calls": graph.eager_calls,
                                                 "fallback": graph.fallback_reason},
            "peak_memory_mb": torch.cuda.max_memory_allocated() / 2**20,
            "device": torch.cuda.get_device_name(), "torch": torch.__version__}


PEER = """
import json, sys, time
import torch
from ultralytics import YOLO
files, batch = json.loads(sys.argv[1]), int(sys.argv[2])
IMGSZ, CONF, IOU = (float(v) for v in sys.argv[3:6])
IMGSZ = int(IMGSZ)
model = YOLO("yolov9t.yaml")
kw = dict(batch=batch, half=True, imgsz=IMGSZ, conf=CONF, iou=IOU, device=0, verbose=False, save=False)
list(model.predict(files[:2 * batch], stream=True, **kw))
torch.cuda.synchronize()
t0 = time.perf_counter()
speeds, dets = [], 0
for r in model.predict(files, stream=True, **kw):
    speeds.append(r.speed)
    dets += len(r.boxes)
torch.cuda.synchronize()
s = time.perf_counter() - t0
import ultralytics
split = {k: sorted(x[k] for x in speeds)[len(speeds) // 2] for k in speeds[0]}
print(json.dumps({"seconds": s, "detections": dets, "speed_ms_per_image": split, "version": ultralytics.__version__}))
"""


def peer(python: str, batch: int, n: int) -> dict:
    files = image_files(n)
    proc = subprocess.run([python, "-c", PEER, json.dumps(files), str(batch), str(IMGSZ), str(CONF), str(IOU)], capture_output=True, text=True,
                          env={**os.environ, "YOLO_OFFLINE": "1"}, timeout=900)
    if proc.returncode:
        return {"side": "peer", "model": "yolo9-t", "batch": batch, "error": proc.stderr.strip()[-600:]}
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"side": "peer", "model": "yolo9-t", "batch": batch, "arm": "peer predict", "conf": CONF, "images": n,
            "seconds": r["seconds"], "images_per_s": n / r["seconds"],
            "batch_latency_ms": r["seconds"] / (n / batch) * 1e3, "detections_per_image": r["detections"] / n,
            "peer_speed_ms_per_image": r["speed_ms_per_image"], "peer_version": r["version"]}


def images_for(wanted: int, batch: int) -> int:
    """At least `wanted` images and 8 batches, in whole batches."""
    return -(-max(wanted, 8 * batch) // batch) * batch


def table(rows: list[dict]) -> str:
    out = ["| model | batch | arm | images/s | ms per batch | prepare / infer / post ms | post share | dets/img |",
           "|---|---:|---|---:|---:|---|---:|---:|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['model']} | {r['batch']} | {r['side']} | failed | | | | |")
            continue
        if r["side"] == "ours":
            s = r["stage_ms_per_batch"]
            split = f"{s['prepare']:.2f} / {s['infer']:.2f} / {s['post']:.2f}"
            share = f"{r['post_share']:.0%}"
        else:
            p = r["peer_speed_ms_per_image"]
            split = (f"{p.get('preprocess', 0):.2f} / {p.get('inference', 0):.2f} / {p.get('postprocess', 0):.2f}"
                     " (its own, per image)")
            share = ""
        out.append(f"| {r['model']} | {r['batch']} | {r.get('arm', r['side'])} | {r['images_per_s']:.0f} | "
                   f"{r['batch_latency_ms']:.2f} | {split} | {share} | {r['detections_per_image']:.1f} |")
    return "\n".join(out)


def main() -> None:
    global CONF
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["yolo9-t", "yolox-t", "rtmdet-t"])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8, 32])
    ap.add_argument("--arms", default="eager,graph")
    ap.add_argument("--images", type=int, default=256, help="images per timed pass (at least 8 batches)")
    ap.add_argument("--peer-python", default=None)
    ap.add_argument("--conf", type=float, default=CONF, help="score threshold (1e-6: every anchor of a from-scratch "
                                                                "model reaches NMS)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--one", nargs=3, metavar=("MODEL", "BATCH", "ARM"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    CONF = args.conf
    if args.one:
        model, batch, arm = args.one
        print(json.dumps(ours(model, int(batch), arm, images_for(args.images, int(batch)))))
        return
    rows: list[dict] = []
    for model in args.models:
        for batch in args.batches:
            n = images_for(args.images, batch)
            for arm in args.arms.split(","):
                proc = subprocess.run([sys.executable, __file__, "--out", args.out, "--images", str(n), "--conf", str(CONF),
                                       "--one", model, str(batch), arm], capture_output=True, text=True, timeout=900)
                rows.append(json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else
                            {"side": "ours", "model": model, "batch": batch, "arm": arm,
                             "error": proc.stderr.strip()[-600:]})
                Path(args.out).write_text(json.dumps(rows, indent=1))
            if args.peer_python and model == "yolo9-t":
                rows.append(peer(args.peer_python, batch, n))
                Path(args.out).write_text(json.dumps(rows, indent=1))
    print(table(rows))


if __name__ == "__main__":
    main()
