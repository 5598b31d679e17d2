"""Where RTMDet's negative class loss lies, step by step, in a training run at the defaults.

    python benchmarks/rtmdet_negatives.py --seeds 0 1 2 --out rtmdet_negatives.json [--beta 1] [--min-k 3]

Trains RTMDet-t (30 epochs at 320, batch 8, one loader worker, on the CPU unless --device says
otherwise) on a generated regime (`shapes-sparse` unless --data says otherwise), one process (and
one thread) a seed, side by side. At every training step it re-runs the assignment on the
step's own outputs and splits the quality focal loss of every (prior, class) pair whose target
is 0 by where the prior lies:

    fg_wrong   a positive prior, any class but its gt's
    in_same    a prior inside a gt box, that gt's class, not chosen as a positive
    in_other   a prior inside a gt box, a class no gt containing it has, not a positive
    near       outside every gt box, within one stride of one
    far        everything else

Recorded: each epoch's sums of those five and of the normaliser (the positives' IoU sum), each
step whose class loss exceeds --spike times the run's median step with the images that carry it
(their boxes, positives, normaliser, the five sums and the highest score in each), and each
epoch's val mAP50-95.

--beta replaces the focal exponent of the loss (RTMDet and GFL use 2; 0 is plain BCE against
the IoU soft label) in the loss only, not in the assigner's cost; --min-k raises the assigner's
floor of dynamic k (each gt's positives; mmdet's 1). Both are patches of this process, for the
experiment, not keys of the package.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CATEGORIES = ("fg_wrong", "in_same", "in_other", "near", "far")


def _patch(beta: float, min_k: int, steps: list) -> None:
    """Wrap RTMDetLoss._per_image: optionally another focal exponent or k floor; record every grad-enabled call."""
    import functools

    import torch
    import torch.nn.functional as F

    from libreyolo.families.common import flatten_levels
    from libreyolo.families.rtmdet import loss as rtm
    from libreyolo.families.rtmdet.boxes import box_giou
    from libreyolo.families.rtmdet.net import decode_boxes

    original = rtm.RTMDetLoss._per_image
    if min_k != 1:  # the loss module's own name for it, which both the loss and terms() call
        rtm.assign = functools.partial(rtm.assign, min_k=min_k)

    def terms(self, preds, targets):
        x = flatten_levels(preds, torch.float32)
        logits, dist = x.split((self.num_classes, 4), -1)
        points, strides = self.priors(preds)
        boxes = decode_boxes(dist, points)
        gt = rtm.assign(logits.detach(), boxes.detach(), points, strides, targets.labels,
                        targets.boxes.float(), targets.valid)
        soft = torch.zeros_like(logits).scatter_(-1, gt.labels.unsqueeze(-1), gt.ious.unsqueeze(-1))
        p = logits.sigmoid()
        qfl = F.binary_cross_entropy_with_logits(logits, soft, reduction="none") * (soft - p).abs().pow(beta)
        return logits, boxes, points, strides, gt, p, qfl

    def per_image(self, preds, targets):
        if beta == 2.0:
            raw, norm = original(self, preds, targets)
        else:
            _, boxes, _, _, gt, _, qfl = terms(self, preds, targets)
            box = ((1.0 - box_giou(boxes, gt.boxes)) * gt.ious).sum(1)
            g_box, g_cls = self.gains
            raw, norm = torch.stack((box * g_box, qfl.sum((1, 2)) * g_cls), 1), gt.ious.sum(1)
        if torch.is_grad_enabled():  # a training step (validation runs under no_grad)
            with torch.no_grad():
                steps.append(_where(self, preds, targets, terms, raw, norm))
        return raw, norm

    rtm.RTMDetLoss._per_image = per_image


def _where(loss, preds, targets, terms, raw, norm) -> dict:
    import torch
    import torch.nn.functional as F

    _, _, points, strides, gt, p, qfl = terms(loss, preds, targets)
    c = p.shape[-1]
    positive = torch.zeros_like(p, dtype=torch.bool).scatter_(-1, gt.labels.unsqueeze(-1), gt.fg.unsqueeze(-1))
    negative = qfl * ~positive
    boxes, valid, labels = targets.boxes.float(), targets.valid, targets.labels
    x1, y1, x2, y2 = (t.unsqueeze(-1) for t in boxes.unbind(-1))
    px, py = points[:, 0], points[:, 1]
    s = strides.view(1, 1, -1)
    inside = (px > x1) & (py > y1) & (px < x2) & (py < y2) & valid.unsqueeze(-1)                  # [B, M, A]
    near = (px > x1 - s) & (py > y1 - s) & (px < x2 + s) & (py < y2 + s) & valid.unsqueeze(-1)
    onehot = F.one_hot(labels.clamp(0, c - 1), c).bool() & valid.unsqueeze(-1)                        # [B, M, C]
    in_same = (inside.unsqueeze(-1) & onehot.unsqueeze(2)).any(1)                                     # [B, A, C]
    in_any = inside.any(1).unsqueeze(-1).expand_as(in_same)
    near_any = near.any(1).unsqueeze(-1).expand_as(in_same)
    fg = gt.fg.unsqueeze(-1).expand_as(in_same)
    masks = dict(zip(CATEGORIES, (fg, in_same & ~fg, in_any & ~in_same & ~fg, near_any & ~in_any & ~fg,
                                  ~near_any & ~fg)))
    images = []
    for i in range(p.shape[0]):
        image = {"boxes_wh_class": [[round(b[2] - b[0], 1), round(b[3] - b[1], 1), int(k)]
                                    for b, k, ok in zip(boxes[i].tolist(), labels[i].tolist(), valid[i].tolist()) if ok],
                 "positives": int(gt.fg[i].sum()), "normaliser": round(norm[i].item(), 3)}
        for name, m in masks.items():
            sel = m[i] & ~positive[i]
            image[name] = round(negative[i][sel].sum().item(), 3)
            image[name + "_max_score"] = round(p[i][sel].max().item(), 3) if sel.any() else 0.0
        images.append(image)
    total = norm.sum().clamp(min=1).item()
    return {"cls": raw[:, 1].sum().item() / total, "normaliser": norm.sum().item(), "images": images}


def child(args) -> None:
    steps: list = []
    _patch(args.beta, args.min_k, steps)
    from libreyolo import LibreYOLO

    run = Path(args.work) / f"s{args.seed}"
    LibreYOLO(args.model).train(data=args.data, epochs=args.epochs, imgsz=args.imgsz, batch=args.batch,
                                seed=args.seed, workers=1, device=args.device, project=str(run.parent),
                                name=run.name, exist_ok=True, tensorboard=False)
    with (run / "results.csv").open(newline="") as f:
        curve = [float(r["map50_95"]) for r in csv.DictReader(f) if r.get("map50_95", "").strip()]
    per_epoch = len(steps) // args.epochs
    epochs = []
    for e in range(args.epochs):
        chunk = steps[e * per_epoch:(e + 1) * per_epoch]
        epochs.append({"epoch": e + 1, "normaliser_per_step": round(sum(s["normaliser"] for s in chunk) / len(chunk), 2),
                       **{k: round(sum(im[k] for s in chunk for im in s["images"]), 2) for k in CATEGORIES}})
    median = statistics.median(s["cls"] for s in steps)
    spikes = [{"step": i, "epoch": i // per_epoch + 1, "cls": round(s["cls"], 2), "normaliser": round(s["normaliser"], 2),
               "images": [im for im in s["images"] if sum(im[k] for k in CATEGORIES) > 1.0]}
              for i, s in enumerate(steps) if s["cls"] > args.spike * median]
    json.dump({"seed": args.seed, "beta": args.beta, "min_k": args.min_k, "median_step_cls": round(median, 3), "map50_95": curve,
               "epochs": epochs, "spikes": spikes}, open(run / "negatives.json", "w"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--beta", type=float, default=2.0, help="focal exponent of the loss (default 2, RTMDet's)")
    p.add_argument("--min-k", type=int, default=1, help="the floor of the assigner's dynamic k (default 1, mmdet's)")
    p.add_argument("--model", default="rtmdet-t")
    p.add_argument("--data", default="shapes-sparse")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--imgsz", type=int, default=320)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--device", default="cpu")
    p.add_argument("--spike", type=float, default=3.0, help="a spike: a step's class loss over this many medians")
    p.add_argument("--work", default="/tmp/rtmdet_negatives")
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, help=argparse.SUPPRESS)  # set in each seed's own process
    args = p.parse_args()
    if args.seed is not None:
        return child(args)
    work = Path(args.work) / (f"beta{args.beta:g}" + (f"_mink{args.min_k}" if args.min_k != 1 else ""))
    work.mkdir(parents=True, exist_ok=True)
    procs = []
    for seed in args.seeds:  # one thread a run: the runs share the cores
        cmd = [sys.executable, __file__, *sys.argv[1:], "--seed", str(seed), "--work", str(work)]
        with open(work / f"s{seed}.log", "w") as log:
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                          env={**os.environ, "OMP_NUM_THREADS": "1"}))
    if any(proc.wait() for proc in procs):
        sys.exit(f"a seed's run failed: see {work}/s*.log")
    runs = [json.load(open(work / f"s{seed}" / "negatives.json")) for seed in args.seeds]
    Path(args.out).write_text(json.dumps({"model": args.model, "data": args.data, "epochs": args.epochs,
                                          "imgsz": args.imgsz, "batch": args.batch, "device": args.device,
                                          "beta": args.beta, "min_k": args.min_k, "runs": runs}, indent=1) + "\n")
    for r in runs:
        print(f"seed {r['seed']}: best {max(r['map50_95']):.3f}, last {r['map50_95'][-1]:.3f}, "
              f"{len(r['spikes'])} spike steps")


if __name__ == "__main__":
    main()
