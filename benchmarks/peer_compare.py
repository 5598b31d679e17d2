"""Reference numbers from Ultralytics (the peer trainer) for YOLOv9-t, written as small fixtures.

    YOLO_OFFLINE=1 YOLO_CONFIG_DIR=/tmp/ultra-cfg PYTHONPATH=src \
        /path/to/venv-with-ultralytics/bin/python benchmarks/peer_compare.py [--only net,loss,...]
        [--out tests/fixtures/peer] [--aug-samples 200]

Ultralytics (AGPL) is imported at run time only; nothing of it is copied here. What goes into
`tests/fixtures/peer/*.json` are numbers: parameter counts, loss values and gradient summaries on
inputs regenerated from a fixed seed (`peer_inputs`, shared with the tests), the per-iteration
LR/momentum of their trainer, and augmentation statistics of their training dataset on the
generated `shapes` set. `tests/unit/test_peer_reference.py` checks our code against them without
Ultralytics installed; `tests/peer/test_peer_live.py` recomputes a few live.

Sections: net, loss, schedule, aug, nms (see --only). Exits 2 when Ultralytics is not installed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

SECTIONS = ("net", "loss", "schedule", "aug")


def _need_ultralytics() -> None:
    if importlib.util.find_spec("ultralytics") is None:
        print("ultralytics is not installed: this script needs it (pip install ultralytics==8.4.190 "
              "in a separate venv); nothing written", file=sys.stderr)
        sys.exit(2)
    os.environ.setdefault("YOLO_OFFLINE", "1")
    os.environ.setdefault("YOLO_CONFIG_DIR", str(Path(tempfile.gettempdir()) / "ultra-cfg"))


def _write(out: Path, name: str, data: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n")
    print(f"wrote {path} ({path.stat().st_size} bytes)")


def _r(x: float, nd: int = 7) -> float:
    return float(f"{float(x):.{nd}g}")


# ----------------------------------------------------------------------------- their objects
def their_model(nc: int = 10):
    import torch
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import DetectionModel

    torch.manual_seed(0)
    model = DetectionModel("yolov9t.yaml", nc=nc, verbose=False)
    model.args = get_cfg()  # their default hyp: box 7.5, cls 0.5, dfl 1.5
    return model


def their_preds(preds):
    """Our per-level [B, 4R + nc, H, W] maps -> their training-output dict (same order: box bins first)."""
    import torch

    r4 = 64
    return {"boxes": torch.cat([p[:, :r4].flatten(2) for p in preds], 2),
            "scores": torch.cat([p[:, r4:].flatten(2) for p in preds], 2),
            "feats": list(preds)}


def their_batch(targets, imgsz: int):
    """Our padded Targets (xyxy px) -> their batch dict (batch_idx, cls, normalised xywh)."""
    import torch

    idx, cls, boxes = [], [], []
    for b in range(targets.boxes.shape[0]):
        v = targets.valid[b]
        bx = targets.boxes[b][v]
        xywh = torch.stack(((bx[:, 0] + bx[:, 2]) / 2, (bx[:, 1] + bx[:, 3]) / 2,
                            bx[:, 2] - bx[:, 0], bx[:, 3] - bx[:, 1]), 1) / imgsz
        idx.append(torch.full((len(bx),), float(b)))
        cls.append(targets.labels[b][v].float())
        boxes.append(xywh)
    return {"batch_idx": torch.cat(idx), "cls": torch.cat(cls).view(-1, 1), "bboxes": torch.cat(boxes)}


# ----------------------------------------------------------------------------- sections
def section_net(out: Path) -> None:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from libreyolo.families import yolo9

    theirs = their_model()
    head = theirs.model[-1]
    ours = yolo9.build("t", 10)

    def gflops(fn):
        with FlopCounterMode(display=False) as fc, torch.no_grad():
            fn(torch.zeros(1, 3, 640, 640))
        return fc.get_total_flops() / 1e9

    theirs.eval()
    ours.eval()
    bn = [m for m in theirs.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    data = {
        "params_total": sum(p.numel() for p in theirs.parameters()),
        "params_body": sum(p.numel() for p in theirs.model[:-1].parameters()),
        "params_head_box": sum(p.numel() for p in head.cv2.parameters()),
        "params_head_cls": sum(p.numel() for p in head.cv3.parameters()),
        "head_legacy": bool(head.legacy),
        "box_conv_groups": [int(m.groups) for m in head.cv2[0].modules() if isinstance(m, torch.nn.Conv2d)],
        "cls_conv_groups": [int(m.groups) for m in head.cv3[0].modules() if isinstance(m, torch.nn.Conv2d)],
        "box_bias_init": _r(head.cv2[0][-1].bias[0]),
        "cls_bias_init": [_r(h[-1].bias[0]) for h in head.cv3],
        "bn_eps": bn[0].eps, "bn_momentum": bn[0].momentum, "bn_count": len(bn),
        "gflops_640_flop_counter": round(gflops(lambda x: theirs(x)), 4),
        "ours_gflops_640_flop_counter_at_record": round(gflops(lambda x: ours.net(x)), 4),
        "ours_params_total_at_record": sum(p.numel() for p in ours.parameters()),
    }
    _write(out, "net", data)


def _assign_summary(fg, scores, gt_idx):
    return {"fg_count": [int(x) for x in fg.sum(1)],
            "target_score_sum": [_r(x) for x in scores.sum((1, 2))],
            "fg_anchors": [[int(i) for i in fg[b].nonzero().flatten()] for b in range(fg.shape[0])],
            "gt_of_fg": [[int(gt_idx[b, i]) for i in fg[b].nonzero().flatten()] for b in range(fg.shape[0])]}


def section_loss(out: Path) -> None:
    import peer_inputs
    import torch
    from ultralytics.utils.loss import v8DetectionLoss

    from libreyolo.families import yolo9

    theirs_model = their_model(peer_inputs.NC)
    crit = v8DetectionLoss(theirs_model)
    ours_model = yolo9.build("t", peer_inputs.NC)
    ours_crit = yolo9.criterion(ours_model)
    cases = {}
    for case in peer_inputs.CASES:
        preds = peer_inputs.make_preds(case)
        targets = peer_inputs.make_targets(case)
        # theirs
        p_t = [p.clone().requires_grad_(True) for p in preds]
        loss_t, items_t = crit(their_preds(p_t), their_batch(targets, peer_inputs.IMGSZ))
        loss_t.sum().backward()
        g_t = [p.grad for p in p_t]
        # ours (at record time, for the report)
        p_o = [p.clone().requires_grad_(True) for p in preds]
        loss_o, items_o = ours_crit(p_o, targets)
        loss_o.backward()
        g_o = [p.grad for p in p_o]
        num = sum(float((a - b).square().sum()) for a, b in zip(g_o, g_t)) ** 0.5
        den = sum(float(b.square().sum()) for b in g_t) ** 0.5

        # assigner, same inputs as the loss gives it
        with torch.no_grad():
            x = torch.cat([p.flatten(2) for p in preds], 2).transpose(1, 2)
            box_logits, cls_logits = x.split((64, peer_inputs.NC), -1)
            pts, strides = ours_crit.anchors(preds, torch.float32)
            from libreyolo.families.common import dfl_decode, dist2bbox
            pb = dist2bbox(dfl_decode(box_logits, 16), pts) * strides
            tb = their_batch(targets, peer_inputs.IMGSZ)
            gt = crit.preprocess(torch.cat((tb["batch_idx"].view(-1, 1), tb["cls"], tb["bboxes"]), 1),
                                 preds[0].shape[0], torch.tensor([peer_inputs.IMGSZ] * 4, dtype=torch.float32))
            gl, gb = gt.split((1, 4), 2)
            _, _, ts, fg, gti = crit.assigner(cls_logits.sigmoid(), pb, pts * strides, gl, gb,
                                              gb.sum(2, keepdim=True).gt(0.0))
            # the same with their small-box enlargement switched off (stride_val -> 0)
            sv = crit.assigner.stride_val
            crit.assigner.stride_val = 0
            _, _, ts0, fg0, gti0 = crit.assigner(cls_logits.sigmoid(), pb, pts * strides, gl, gb,
                                                 gb.sum(2, keepdim=True).gt(0.0))
            crit.assigner.stride_val = sv
        cases[case] = {
            "loss_total": _r(loss_t.sum()), "items": [_r(v) for v in items_t.values()],
            "grad_l2_per_level": [_r(g.norm()) for g in g_t],
            # per-anchor L2 norm of the gradient, levels flattened in order: 2 x A floats
            "grad_anchor_l2": [[_r(v, 4) for v in row] for row in
                               torch.cat([g.flatten(2) for g in g_t], 2).norm(dim=1).tolist()],
            "assign": _assign_summary(fg, ts, gti),
            "assign_no_small_box_floor": _assign_summary(fg0, ts0, gti0),
            "ours_at_record": {"loss_total": _r(loss_o), "items": [_r(v) for v in items_o],
                               "grad_rel_l2_vs_theirs": _r(num / den)},
            "preds_checksum": _r(sum(float(p.double().sum()) for p in preds)),
        }
        print(case, "theirs", cases[case]["loss_total"], cases[case]["items"],
              "ours", cases[case]["ours_at_record"])
    _write(out, "loss", {"imgsz": peer_inputs.IMGSZ, "nc": peer_inputs.NC, "cases": cases,
                         "stride_val": crit.assigner.stride_val, "topk": crit.assigner.topk,
                         "alpha": crit.assigner.alpha, "beta": crit.assigner.beta})


def shapes_dataset(root: Path | None) -> Path:
    """The issue's 800/100 generated set (generate_shapes, seed 0), written once under `root`."""
    from libreyolo.data.shapes import generate_shapes

    root = root or Path(tempfile.gettempdir()) / "peer-shapes800"
    if not (root / "VERSION").exists():
        generate_shapes(root, 0, {"train": 800, "val": 100})
    data = root / "data.yaml"
    from libreyolo.data.shapes import NAMES

    data.write_text(f"path: {root}\ntrain: images/train\nval: images/val\nnames: {NAMES}\n")
    return data


def _record_their_schedule(data: Path, optimizer: str, project: Path) -> dict:
    """Run THEIR trainer (5 epochs, batch 8, nbs 8) at 32 px (the schedule does not depend on the image
    size; 32 px keeps the 500 CPU steps cheap) and read lr/momentum of every group after each step."""
    from ultralytics import YOLO

    rows: list[list[float]] = []
    info: dict = {}

    def after_step(trainer) -> None:
        row = []
        for g in trainer.optimizer.param_groups:
            mom = g["momentum"] if "momentum" in g else g["betas"][0]
            row += [_r(g["lr"], 8), _r(mom, 8)]
        rows.append(row)
        if not info:
            info.update(optimizer=type(trainer.optimizer).__name__, lr0=trainer.args.lr0,
                        warmup_bias_lr=trainer.args.warmup_bias_lr, momentum=trainer.args.momentum,
                        groups=[g.get("param_group") for g in trainer.optimizer.param_groups],
                        weight_decay=[_r(g["weight_decay"]) for g in trainer.optimizer.param_groups],
                        accumulate=trainer.accumulate, nb=len(trainer.train_loader),
                        warmup_iterations=trainer._get_warmup_iterations(len(trainer.train_loader)),
                        ema_decay_final=None)

    model = YOLO("yolov9t.yaml")
    model.add_callback("on_train_batch_end", after_step)
    model.add_callback("on_train_end", lambda t: info.update(ema_updates=t.ema.updates,
                                                            ema_decay_final=_r(t.ema.decay(t.ema.updates))))
    model.train(data=str(data), epochs=5, batch=8, nbs=8, imgsz=32, workers=0, device="cpu", optimizer=optimizer,
                mosaic=1.0, mixup=0.0, scale=0.5, close_mosaic=0, val=False, plots=False, amp=False,
                project=str(project), name=optimizer, exist_ok=True, verbose=False, seed=0, cache="ram")
    # Weights and norm groups always share lr and momentum (checked): store one column for both.
    assert all(r[0] == r[2] and r[1] == r[3] == r[5] for r in rows), "groups diverged"
    info["lr"] = rle([r[0] for r in rows])
    info["lr_bias"] = rle([r[4] for r in rows])
    info["momentum"] = rle([r[1] for r in rows])
    return info


def rle(values: list[float]) -> list[list[float]]:
    """Run-length encoding [[value, count], ...] (the tests expand it with `peer_inputs.unrle`)."""
    out: list[list[float]] = []
    for v in values:
        if out and out[-1][0] == v:
            out[-1][1] += 1
        else:
            out.append([v, 1])
    return out


def section_schedule(out: Path, data_root: Path | None = None) -> None:
    data = shapes_dataset(data_root)
    with tempfile.TemporaryDirectory() as tmp:
        runs = {opt: _record_their_schedule(data, opt, Path(tmp)) for opt in ("SGD", "auto")}
    _write(out, "schedule", {"epochs": 5, "batch": 8, "nbs": 8, "images": 800, "lr0_sgd": 0.01,
                             "columns": "per param group (their order): lr, momentum (SGD) or beta1 (AdamW)",
                             "runs": runs})


AUG = {"imgsz": 640, "mosaic": 1.0, "mixup": 0.0, "scale": 0.5, "translate": 0.1, "fliplr": 0.5,
       "degrees": 0.0, "shear": 0.0, "hsv_h": 0.015, "hsv_s": 0.7, "hsv_v": 0.4}
QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)


def aug_stats(samples: list[tuple], flips: int, scales: list[float], pad_fracs: list[float]) -> dict:
    """samples: (image uint8 [3, S, S] RGB, boxes xyxy px [n, 4]) -> the numbers both sides are compared on."""
    import numpy as np

    counts = [len(b) for _, b in samples]
    boxes = np.concatenate([b for _, b in samples if len(b)]) if any(len(b) for _, b in samples) else np.zeros((0, 4))
    w, h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    px = np.stack([im.reshape(3, -1).astype(np.float64) for im, _ in samples], 1).reshape(3, -1) / 255.0
    side = np.minimum(w, h)
    return {
        "n": len(samples),
        "boxes_per_sample_mean": _r(np.mean(counts), 5),
        "boxes_per_sample_q": [_r(q, 5) for q in np.quantile(counts, QUANTILES)],
        "box_w_q": [_r(q, 5) for q in np.quantile(w, QUANTILES)],
        "box_h_q": [_r(q, 5) for q in np.quantile(h, QUANTILES)],
        "frac_boxes_min_side_lt_8": _r(np.mean(side < 8), 5),
        "frac_boxes_min_side_lt_16": _r(np.mean(side < 16), 5),
        "pad_frac_mean": _r(np.mean(pad_fracs), 5) if pad_fracs else None,
        "channel_mean": [_r(v, 5) for v in px.mean(1)],
        "channel_std": [_r(v, 5) for v in px.std(1)],
        "flip_rate": _r(flips / len(samples), 5),
        "scale_q": [_r(q, 5) for q in np.quantile(scales, QUANTILES)] if scales else None,
    }


def _pad_frac(img) -> float:
    import numpy as np

    a = np.asarray(img)
    return float(((a[0] == 114) & (a[1] == 114) & (a[2] == 114)).mean())


def their_aug_samples(data: Path, n: int, hsv: bool) -> dict:
    """Their YOLODataset (mode train, their defaults + AUG), sample by sample, instrumented."""
    import random

    import numpy as np
    from ultralytics.cfg import get_cfg
    from ultralytics.data import augment as ua
    from ultralytics.data import build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset
    from ultralytics.utils import instance as ui

    over = {k: v for k, v in AUG.items()}
    if not hsv:
        over.update(hsv_h=0.0, hsv_s=0.0, hsv_v=0.0)
    cfg = get_cfg(overrides=over)
    info = check_det_dataset(str(data))
    ds = build_yolo_dataset(cfg, info["train"], 8, info, mode="train", rect=False, stride=32)
    flips, scales = [0], []
    orig_flip, orig_affine = ui.Instances.fliplr, ua.RandomPerspective._compute_affine_matrix

    def flip(self, w):
        flips[0] += 1
        return orig_flip(self, w)

    def affine(self, img, size):
        m, scale = orig_affine(self, img, size)
        scales.append(float(scale))
        return m, scale

    ui.Instances.fliplr, ua.RandomPerspective._compute_affine_matrix = flip, affine
    random.seed(0)
    np.random.seed(0)
    order = np.random.default_rng(0).permutation(len(ds))[:n]
    samples, pads = [], []
    try:
        for i in order:
            d = ds[int(i)]
            img = d["img"].numpy()
            S = img.shape[-1]
            b = d["bboxes"].numpy() * S  # normalised xywh -> px
            xyxy = np.stack([b[:, 0] - b[:, 2] / 2, b[:, 1] - b[:, 3] / 2, b[:, 0] + b[:, 2] / 2,
                             b[:, 1] + b[:, 3] / 2], 1) if len(b) else np.zeros((0, 4))
            samples.append((img, xyxy))
            pads.append(_pad_frac(img))
    finally:
        ui.Instances.fliplr, ua.RandomPerspective._compute_affine_matrix = orig_flip, orig_affine
    return aug_stats(samples, flips[0], scales, pads if not hsv else [])


def our_aug_samples(root: Path, n: int, hsv: bool) -> dict:
    """Our TrainDataset at AUG (as our train loader builds it), sample by sample, instrumented."""
    import numpy as np

    from libreyolo.config import TrainConfig
    from libreyolo.data import dataset as ld
    from libreyolo.data.dataset import TrainDataset
    from libreyolo.data.labels import scan_split
    from libreyolo.data.loader import EpochBatchSampler
    from libreyolo.data.shapes import NAMES

    over = {k: v for k, v in AUG.items()}
    if not hsv:
        over.update(hsv_h=0.0, hsv_s=0.0, hsv_v=0.0)
    cfg = TrainConfig(batch=8, no_aug_epochs=0, epochs=5, **over)
    files = sorted((root / "images" / "train").glob("*.jpg"))
    ds = TrainDataset(scan_split("train", files, len(NAMES)), 640, cfg, seed=0)
    sampler = EpochBatchSampler(len(ds), 8, 0, 640, False)
    sampler.mosaic, sampler.mixup = cfg.mosaic, cfg.mixup
    flips, scales = [0], []
    orig_flip, orig_affine = ld.fliplr, ld.random_affine

    def flip(img, boxes):
        flips[0] += 1
        return orig_flip(img, boxes)

    def affine(*a, **k):
        m = orig_affine(*a, **k)
        scales.append(float(abs(np.linalg.det(m[:2, :2])) ** 0.5))
        return m

    ld.fliplr, ld.random_affine = flip, affine
    samples, pads = [], []
    try:
        for keys in sampler:
            for key in keys:
                img, boxes, _, _ = ds[key]
                samples.append((img.numpy(), boxes))
                pads.append(_pad_frac(img))
                if len(samples) >= n:
                    break
            if len(samples) >= n:
                break
    finally:
        ld.fliplr, ld.random_affine = orig_flip, orig_affine
    return aug_stats(samples, flips[0], scales, pads if not hsv else [])


def section_aug(out: Path, samples: int = 200, data_root: Path | None = None) -> None:
    data = shapes_dataset(data_root)
    res = {"settings": AUG, "samples": samples}
    for hsv in (False, True):
        key = "hsv" if hsv else "no_hsv"
        res[f"theirs_{key}"] = their_aug_samples(data, samples, hsv)
        res[f"ours_at_record_{key}"] = our_aug_samples(data.parent, samples, hsv)
        print(key, "theirs", res[f"theirs_{key}"])
        print(key, "ours  ", res[f"ours_at_record_{key}"])
    _write(out, "aug", res)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default=",".join(SECTIONS))
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" / "peer")
    ap.add_argument("--aug-samples", type=int, default=200)
    ap.add_argument("--data-root", type=Path, default=None,
                    help="where the generated 800/100 shapes set is (written there if missing)")
    args = ap.parse_args()
    _need_ultralytics()
    import torch

    torch.set_num_threads(1)
    for name in args.only.split(","):
        if name not in SECTIONS:
            sys.exit(f"unknown section {name!r}; choose from {', '.join(SECTIONS)}")
        fn = globals()[f"section_{name}"]
        kw = {"samples": args.aug_samples, "data_root": args.data_root} if name == "aug" else \
            {"data_root": args.data_root} if name == "schedule" else {}
        fn(args.out, **kw)


if __name__ == "__main__":
    main()
