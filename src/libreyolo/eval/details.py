"""What a validation shows beyond mAP: per-class rows, precision-recall curves, a confusion matrix.

All from the rows `coco._Collector` gathers (original image pixels) and the COCO evaluator's
accumulated arrays, in numpy, after the forward passes:

- PR curves and per-class mAP: faster-coco-eval's interpolated precision at its 101 recall points
  (`eval["precision"]`, [IoU, recall, class, area, maxDets]; all areas, 100 detections per image),
  so mAP50 is the mean area under these curves and the per-class figures add up to the headline.
- P and R: the Ultralytics convention, so the figures compare with what users know. Detections are
  matched to ground truth of their class at IoU >= 0.5 (each box at most once, highest IoU first);
  precision and recall are swept over the confidence and read, for every class, at the one
  confidence that maximises the mean F1 over the classes.
- The confusion matrix: detections with confidence >= 0.25 matched to ground truth of any class at
  IoU >= 0.5 (each box at most once, highest IoU first). Rows are the predicted class, columns the
  true class; the last row is `background` (a box nobody found), the last column too (a detection
  of nothing).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

MATCH_IOU = 0.5
CONFUSION_CONF = 0.25
F1_POINTS = 1001  # confidence grid of the P/R sweep; the page gets every 10th point


def per_image(image_ids: np.ndarray, n_images: int) -> list[np.ndarray]:
    """Row indices of each image 1..n_images (index 0 of the result is image 1)."""
    ids = image_ids.astype(np.int64)
    order = np.argsort(ids, kind="stable")
    counts = np.bincount(ids, minlength=n_images + 1)[1:n_images + 1]
    return np.split(order, np.cumsum(counts)[:-1])


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of xyxy boxes, [N, 4] x [M, 4] -> [N, M].

    The overlap's width and height as two [N, M] arrays, not one [N, M, 2] reduced over its last
    axis: numpy's reduction over a length-2 axis made this 5x slower (300 detections against 100
    boxes, a dense image: 1.1 ms against 0.2) for the same products, bit for bit."""
    w = np.minimum(a[:, None, 2], b[None, :, 2]) - np.maximum(a[:, None, 0], b[None, :, 0])
    h = np.minimum(a[:, None, 3], b[None, :, 3]) - np.maximum(a[:, None, 1], b[None, :, 1])
    inter = np.clip(w, 0, None) * np.clip(h, 0, None)
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    return inter / np.maximum(area_a[:, None] + area_b[None] - inter, 1e-12)


def greedy_pairs(iou: np.ndarray, allowed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(detection, ground truth) index pairs among the `allowed` ones, highest IoU first, each
    box in at most one pair."""
    d, g = np.nonzero(allowed)
    order = np.argsort(-iou[d, g], kind="stable")
    used_d, used_g = set(), set()
    pairs = []
    for i, j in zip(d[order].tolist(), g[order].tolist()):
        if i not in used_d and j not in used_g:
            used_d.add(i)
            used_g.add(j)
            pairs.append((i, j))
    pairs_arr = np.array(pairs, dtype=np.int64).reshape(-1, 2)
    return pairs_arr[:, 0], pairs_arr[:, 1]


def match(gt: np.ndarray, dets: np.ndarray, n_images: int, nc: int) -> tuple[np.ndarray, np.ndarray]:
    """(true-positive flag of every detection at IoU 0.5 with its own class, the confusion matrix)."""
    tp = np.zeros(len(dets), dtype=bool)
    matrix = np.zeros((nc + 1, nc + 1), dtype=np.int64)
    gt_of, det_of = per_image(gt[:, 0], n_images), per_image(dets[:, 0], n_images)
    for gi, di in zip(gt_of, det_of):
        g, d = gt[gi], dets[di]
        g_cls, d_cls = g[:, 5].astype(np.int64), d[:, 6].astype(np.int64)
        iou = box_iou(d[:, 1:5], g[:, 1:5])
        hit = iou >= MATCH_IOU
        rows, _ = greedy_pairs(iou, hit & (d_cls[:, None] == g_cls[None]))
        tp[di[rows]] = True
        sure = d[:, 5] >= CONFUSION_CONF
        rows, cols = greedy_pairs(iou, hit & sure[:, None])
        np.add.at(matrix, (d_cls[rows], g_cls[cols]), 1)
        missed = np.ones(len(g), dtype=bool)
        missed[cols] = False
        np.add.at(matrix, (nc, g_cls[missed]), 1)
        spurious = sure.copy()
        spurious[rows] = False
        np.add.at(matrix, (d_cls[spurious], nc), 1)
    return tp, matrix


def precision_recall(tp: np.ndarray, conf: np.ndarray, pred_cls: np.ndarray, instances: np.ndarray) -> dict:
    """P and R per class at the confidence that maximises the mean F1 over classes with ground
    truth, and the mean F1 against confidence."""
    grid = np.linspace(0.0, 1.0, F1_POINTS)
    nc = len(instances)
    p, r = np.zeros((nc, F1_POINTS)), np.zeros((nc, F1_POINTS))
    present = np.flatnonzero(instances > 0)
    for c in present:
        mine = pred_cls == c
        if not mine.any():
            continue  # nothing detected: P = R = 0 at every confidence
        order = np.argsort(-conf[mine], kind="stable")
        hits, scores = tp[mine][order], conf[mine][order]
        true_pos = np.cumsum(hits)
        recall = true_pos / instances[c]
        precision = true_pos / np.arange(1, len(hits) + 1)
        # np.interp wants increasing x: -score is. Above the highest score nothing is kept: recall
        # 0 and precision, undefined, 0 too (1 would report a class nothing found as precise);
        # below the lowest score, everything is kept.
        r[c] = np.interp(-grid, -scores, recall, left=0.0)
        p[c] = np.interp(-grid, -scores, precision, left=0.0)
    f1 = 2 * p * r / np.maximum(p + r, 1e-12)
    mean_f1 = f1[present].mean(0) if len(present) else np.zeros(F1_POINTS)
    # Of equal F1s, the highest confidence: the same balance with the fewest detections kept.
    best = F1_POINTS - 1 - int(mean_f1[::-1].argmax())
    return {"p": p[:, best], "r": r[:, best], "best_conf": float(grid[best]),
            "conf_grid": grid[::10], "mean_f1": mean_f1[::10]}


def class_ap(precision: np.ndarray | None, nc: int) -> tuple[list, list, np.ndarray | None]:
    """Per class (AP50, AP50-95) from COCO's accumulated precision (None where a class has no
    ground truth), and the [101, nc] precision at IoU 0.5."""
    if precision is None:
        return [None] * nc, [None] * nc, None
    p = precision[:, :, :nc, 0, -1]  # all areas, 100 detections per image
    ap50, ap = [], []
    for k in range(p.shape[2]):
        valid = p[0, :, k] > -1
        ap50.append(float(p[0, valid, k].mean()) if valid.any() else None)
        ok = p[:, :, k] > -1
        ap.append(float(p[:, :, k][ok].mean()) if ok.any() else None)
    pad = [None] * (nc - len(ap50))
    return ap50 + pad, ap + pad, p[0]


def details(gt: list[np.ndarray], dets: list[np.ndarray], n_images: int, names: Sequence[str],
            coco_precision: np.ndarray | None, recall_points: np.ndarray | None) -> dict[str, Any]:
    """{'precision', 'recall', 'per_class', 'curves'} for `evaluate`'s result (plain Python
    values: they go to JSON and results.html)."""
    nc = len(names)
    g = np.concatenate(gt) if gt else np.zeros((0, 6))
    d = np.concatenate(dets) if dets else np.zeros((0, 7))
    g_cls, d_cls = g[:, 5].astype(np.int64), d[:, 6].astype(np.int64)
    instances = np.bincount(g_cls, minlength=nc)[:nc]
    images = np.array([len(np.unique(g[g_cls == k, 0])) for k in range(nc)])
    tp, matrix = match(g, d, n_images, nc)
    pr = precision_recall(tp, d[:, 5], d_cls, instances)
    ap50, ap, curve = class_ap(coco_precision, nc)
    present = instances > 0
    rows = [{"class": str(names[k]), "id": k, "images": int(images[k]), "instances": int(instances[k]),
             "precision": _num(pr["p"][k]) if present[k] else None,
             "recall": _num(pr["r"][k]) if present[k] else None,
             "map50": _num(ap50[k]) if present[k] else None, "map50_95": _num(ap[k]) if present[k] else None}
            for k in range(nc)]
    pr_curves = []
    if curve is not None and recall_points is not None:
        pr_curves = [{"class": str(names[k]), "id": k, "ap50": _num(ap50[k]), "precision": _nums(curve[:, k])}
                     for k in range(min(nc, curve.shape[1])) if present[k] and ap50[k] is not None]
    return {
        "precision": _num(pr["p"][present].mean()) if present.any() else 0.0,
        "recall": _num(pr["r"][present].mean()) if present.any() else 0.0,
        "per_class": rows,
        "curves": {
            "pr": {"iou": MATCH_IOU, "recall": _nums(recall_points) if recall_points is not None else [],
                   "classes": pr_curves},
            "f1": {"iou": MATCH_IOU, "conf": _nums(pr["conf_grid"]), "mean_f1": _nums(pr["mean_f1"]),
                   "best_conf": pr["best_conf"]},
            "confusion": {"iou": MATCH_IOU, "conf": CONFUSION_CONF, "names": [str(n) for n in names] + ["background"],
                          "matrix": matrix.tolist(), "rows": "predicted", "columns": "true"},
        },
    }


def _num(x: Any) -> float | None:
    return None if x is None else round(float(x), 6)


def _nums(xs: np.ndarray) -> list[float]:
    return [round(float(x), 5) for x in xs]
