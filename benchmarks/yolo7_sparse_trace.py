"""YOLOv7-t's val mAP, step by step, on a sparse regime: what moves when it falls.

    python benchmarks/yolo7_sparse_trace.py --out /tmp/y7/trace_s0.json [--seed 0] [key=value ...]

Trains one run (yolo7-t, `shapes-sparse`, 30 epochs at 320, batch 8, one loader worker, CPU,
unless --model/--data/... or the trailing key=value overrides say otherwise: they are passed to
`LibreYOLO(model).train()` as typed) with a train hook and two patches of this process only:

  YOLO7Loss._per_image  per training step: the batch's loss items (box, obj, cls, as the meter
                        sees them), images with objects, gts, positives, the objectness sum split
                        into empty and non-empty images, and the normaliser;
  Precision.step        per optimizer step: the total gradient norm before clipping, and the
                        norms of the head's last convs' gradient in their box / obj / cls channels.

Per step it also keeps the learning rate of each parameter group and the EMA's decay. Per epoch:
the validation's scalars (mAP50-95, mAP50, precision, recall, detections), the per-class rows,
and a probe of the validated (EMA) weights over the val images: for each gt the best score of its
class among predictions overlapping it at IoU >= 0.5, the best wrong-class score there, and their
objectness; on images without objects the highest score anywhere. With --save-ema every epoch's
EMA weights are written next to the JSON (for post-hoc checks).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import time
from pathlib import Path


def _patch(steps: list, updates: list, head: dict) -> None:
    import torch

    from libreyolo.engine import precision as prec
    from libreyolo.families.yolo7 import loss as y7

    original = y7.YOLO7Loss._per_image

    def per_image(self, preds, targets):
        raw, norm = original(self, preds, targets)
        if torch.is_grad_enabled():
            with torch.no_grad():
                valid = targets.valid
                has = valid.any(1)
                n = norm.sum().clamp(min=1)
                steps.append({
                    "items": [round(v, 5) for v in (raw.sum(0) / n).tolist()],
                    "images_with_objects": int(has.sum()), "gts": int(valid.sum()),
                    "normaliser": float(norm.sum()),
                    "obj_empty": round(float(raw[~has, 1].sum() / n), 5),
                    "obj_nonempty": round(float(raw[has, 1].sum() / n), 5),
                })
        return raw, norm

    y7.YOLO7Loss._per_image = per_image

    original_step = prec.Precision.step

    def step(self, optimizer, params, clip_grad):
        with torch.no_grad():
            grads = [p.grad for p in params if p.grad is not None]
            total = float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))) if grads else 0.0
            parts = {}
            for w, no in head.values():  # the last 1x1 conv of each level
                g = w.grad
                if g is None:
                    continue
                g = g.view(3, no, -1)
                for k, sl in (("box", slice(0, 4)), ("obj", slice(4, 5)), ("cls", slice(5, no))):
                    parts[k] = parts.get(k, 0.0) + float(g[:, sl].square().sum())
            updates.append({"grad_norm": round(total, 4),
                            **{f"head_{k}": round(v ** 0.5, 5) for k, v in parts.items()}})
        return original_step(self, optimizer, params, clip_grad)

    prec.Precision.step = step


def _probe(model, loader, device) -> dict:
    """Scores of the validated weights at the val gts and on the empty val images."""
    import torch

    from libreyolo.eval.loop import to_input
    from libreyolo.families.common import bbox_iou
    from libreyolo.families.yolo7.net import rows

    net = getattr(model, "net", model)
    was = model.training
    model.eval()
    per_gt, empty_max, bg_obj = [], [], []
    with torch.inference_mode():
        for batch in loader:
            preds = net(to_input(batch.images, device))
            layout = model.layouts(preds)
            x = rows(preds, torch.float32)
            boxes = layout.decode(x[..., :4])
            obj = x[..., 4].sigmoid()
            cls = x[..., 5:].sigmoid()
            score = obj.unsqueeze(-1) * cls
            t = batch.targets
            for i in range(x.shape[0]):
                ok = t.valid[i]
                if not bool(ok.any()):
                    empty_max.append(float(score[i].max()))
                    continue
                gtb, gtl = t.boxes[i][ok].float(), t.labels[i][ok]
                iou = bbox_iou(gtb.unsqueeze(1), boxes[i].unsqueeze(0))  # [M, A]
                overlap = iou >= 0.5
                bg_obj.append(float(obj[i][~(iou >= 0.1).any(0)].max()))
                for j in range(gtb.shape[0]):
                    m = overlap[j]
                    if not bool(m.any()):
                        per_gt.append({"right": 0.0, "wrong": 0.0, "obj": 0.0, "best_iou": round(float(iou[j].max()), 3)})
                        continue
                    s = score[i][m]  # [K, C]
                    c = int(gtl[j])
                    wrong = torch.cat((s[:, :c], s[:, c + 1:]), 1)
                    per_gt.append({"right": round(float(s[:, c].max()), 4), "wrong": round(float(wrong.max()), 4),
                                   "obj": round(float(obj[i][m].max()), 4), "best_iou": round(float(iou[j].max()), 3)})
    model.train(was)
    right = [g["right"] for g in per_gt]
    return {
        "gts": len(per_gt),
        "right_mean": round(statistics.fmean(right), 4) if right else None,
        "right_median": round(statistics.median(right), 4) if right else None,
        "wrong_mean": round(statistics.fmean(g["wrong"] for g in per_gt), 4) if per_gt else None,
        "obj_at_gt_mean": round(statistics.fmean(g["obj"] for g in per_gt), 4) if per_gt else None,
        "wrong_beats_right": sum(g["wrong"] > g["right"] for g in per_gt),
        "no_box_iou50": sum(g["best_iou"] < 0.5 for g in per_gt),
        "empty_images": len(empty_max),
        "empty_max_score_mean": round(statistics.fmean(empty_max), 4) if empty_max else None,
        "bg_obj_max_mean": round(statistics.fmean(bg_obj), 4) if bg_obj else None,
        "per_gt": per_gt,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="yolo7-t")
    p.add_argument("--data", default="shapes-sparse")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--project", default="/tmp/y7/runs")
    p.add_argument("--name", default=None)
    p.add_argument("--out", required=True)
    p.add_argument("--save-ema", action="store_true")
    p.add_argument("overrides", nargs="*", help="key=value train keys (as the CLI types them)")
    args = p.parse_args()

    import torch

    from libreyolo import LibreYOLO
    from libreyolo.cli.grammar import parse_overrides
    from libreyolo.engine.hooks import Hook

    steps, updates, head, epochs = [], [], {}, []
    _patch(steps, updates, head)
    keys = parse_overrides(args.overrides)  # typed and checked as the CLI does
    name = args.name or f"s{args.seed}" + "".join(f"_{k}{v}" for k, v in keys.items())
    out = Path(args.out)
    ema_dir = out.with_suffix("") if args.save_ema else None
    if ema_dir:
        ema_dir.mkdir(parents=True, exist_ok=True)
    lrs: list = []

    class Trace(Hook):
        def before_train(self, trainer):
            net = trainer.model.net if hasattr(trainer.model, "net") else trainer.model
            for i, level in enumerate(net.head.levels if hasattr(net.head, "levels") else []):
                conv = level.conv
                head[f"l{i}"] = (conv.weight, conv.weight.shape[0] // 3)
            if not head:  # fall back: every 1x1 conv whose out channels are 3 x (5 + nc)
                nc = trainer.model.num_classes
                for n_, m in net.head.named_modules():
                    if isinstance(m, torch.nn.Conv2d) and m.out_channels == 3 * (5 + nc):
                        head[n_] = (m.weight, 5 + nc)
            self.t0 = time.time()

        def after_step(self, trainer):
            ema = trainer.ema
            lrs.append({"epoch": trainer.epoch + 1, "batch": trainer.batch_index, "updates": trainer.updates,
                        "lr": [round(g["lr"], 8) for g in trainer.optimizer.param_groups],
                        "ema_decay": round(ema.current_decay(), 5) if ema is not None else None})

        def after_epoch(self, trainer):
            row = {"epoch": trainer.epoch + 1, "wall_s": round(time.time() - self.t0, 1)}
            if trainer.validated_epoch == trainer.epoch:
                row["metrics"] = {k: (round(v, 5) if isinstance(v, float) else v) for k, v in trainer.metrics.items()}
                pc = (trainer.val_details or {}).get("per_class")
                if pc:
                    row["per_class"] = pc
                model = trainer.ema.ema if trainer.ema is not None else trainer.model
                row["probe"] = _probe(model, trainer.val_loader, trainer.device)
                if ema_dir:
                    torch.save(model.state_dict(), ema_dir / f"ema_e{trainer.epoch + 1}.pt")
            epochs.append(row)
            m = row.get("metrics", {})
            pr = row.get("probe", {})
            print(f"[trace] epoch {row['epoch']}: map50_95 {m.get('map50_95')} map50 {m.get('map50')} "
                  f"right {pr.get('right_mean')} wrong>right {pr.get('wrong_beats_right')} "
                  f"empty_max {pr.get('empty_max_score_mean')}", flush=True)

    train = {"data": args.data, "epochs": 30, "imgsz": 320, "batch": 8, "seed": args.seed, "workers": 1,
             "device": "cpu", "project": args.project, "name": name, "exist_ok": True, "tensorboard": False,
             **keys}
    t0 = time.time()
    result = LibreYOLO(args.model).train(hooks=[Trace()], **train)
    wall = time.time() - t0
    run_dir = Path(args.project) / name
    with (run_dir / "results.csv").open(newline="") as f:
        table = list(csv.DictReader(f))
    curve = [float(r["map50_95"]) for r in table if r.get("map50_95", "").strip()]
    n = len(steps) // max(len(epochs), 1)
    per_step = []
    for i, s in enumerate(steps):
        u = updates[i] if i < len(updates) else {}
        lr = lrs[i] if i < len(lrs) else {}
        per_step.append({"epoch": i // n + 1 if n else None, **s, **u, **{k: lr.get(k) for k in ("lr", "ema_decay")}})
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({
        "model": args.model, "data": args.data, "seed": args.seed, "train": train, "wall_s": round(wall, 1),
        "torch": torch.__version__, "threads": torch.get_num_threads(), "map50_95": curve,
        "results_csv": table, "epochs": epochs, "steps": per_step,
        "result": str(result)[:2000]}, indent=None) + "\n")
    best = max(curve) if curve else 0.0
    print(f"best {best:.3f} (epoch {curve.index(best) + 1}), last {curve[-1]:.3f}; wall {wall:.0f} s; {args.out}")


if __name__ == "__main__":
    main()
