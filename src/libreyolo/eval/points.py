"""Point detection: from a probability map to points, and precision, recall and F1 against centroids.

The task's prediction (tasks/points.py) is a per-cell probability map [B, 1 + C, S/8, S/8]
(background first). `decode_points` turns it into points, validation and predict alike:

- a cell is an object of class c when its probability of c is above `conf`, and the 8-connected
  cells of one class form one point: the centre of their cell box, scored by their best cell.
  Edge Impulse's FOMO does the same (ei_tensorflow constrained_object_detection
  `convert_segmentation_map_to_object_detection_prediction` with `fuse=True`: cells above 0.5 whose
  boxes touch, corners included, fuse into one box, after its C++ SDK's `ei_cube_check_overlap`);
  its fusing is greedy into a growing box, the components here are exact and order-free.
  Components come from label propagation on the device (a 3 x 3 max-pool per round, as many rounds
  as the longest blob is long), batched over images and classes.

`match_points` scores them: per class, one prediction per ground-truth point, greedily by score.
Each prediction, best first, takes the nearest ground-truth centroid of its class that no better
prediction took, if it lies within `dist` pixels of the network input (inclusive); otherwise it is
a false positive, and every centroid left over is a false negative. The loop runs over the
prediction rank, vectorised over the images of a batch. Edge Impulse's FOMO validates with
`match_by_near_centroids` (ei_tensorflow constrained_object_detection/metrics.py): within 0.2 of
the image side and any number of predictions per centroid; we count a duplicate as a false
positive, and measure the distance in pixels (the `point_dist` key, docs/points.md).

Ground truth is the batch's boxes (letterboxed network pixels, families.base.Targets) turned into
centroids on the device (families/points.py `box_centroids`): detection datasets validate point
detectors unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..families.points import GRID_STRIDE, box_centroids
from .loop import predict, to_input, validating


class Points(NamedTuple):
    """Points of a batch, each image's points together and best first."""

    image: Tensor  # int64 [N], the image's index in the batch
    cls: Tensor    # int64 [N]
    xy: Tensor     # float32 [N, 2], network-input pixels
    score: Tensor  # float32 [N]


def components(mask: Tensor) -> Tensor:
    """[N, H, W] bool -> int64 labels: 0 off the mask, one id per 8-connected component of it.

    Each on-cell starts with its own id (1..H*W) and takes the largest id among its on-neighbours
    until nothing changes; float32 holds the ids exactly (H*W < 2^24)."""
    n, h, w = mask.shape
    on = mask.to(torch.float32)
    ids = torch.arange(1, h * w + 1, device=mask.device, dtype=torch.float32).view(1, h, w)
    labels = ids * on
    while True:
        grown = F.max_pool2d(labels[:, None], 3, stride=1, padding=1)[:, 0] * on
        if torch.equal(grown, labels):
            return labels.long()
        labels = grown


def decode_points(probs: Tensor, conf: float, stride: int = GRID_STRIDE) -> Points:
    """Probability map [B, 1 + C, H, W] (background first) -> the batch's points above `conf`
    (module docstring). Synchronises with the host (validation and predict only)."""
    probs = probs.float()
    b, k, h, w = probs.shape
    scores = probs[:, 1:].flatten(0, 1)                      # [B * C, H, W], one map per (image, class)
    mask = scores > conf
    live = mask.flatten(1).any(1).nonzero().squeeze(1)       # the maps with any cell above conf
    device = probs.device
    if live.numel() == 0:
        empty = torch.zeros(0, dtype=torch.int64, device=device)
        return Points(empty, empty, torch.zeros(0, 2, device=device), torch.zeros(0, device=device))
    labels = components(mask[live])
    m, y, x = labels.nonzero(as_tuple=True)                  # every on-cell
    key = live[m] * (h * w + 1) + labels[m, y, x]            # one key per (image, class, component)
    uniq, inv = torch.unique(key, return_inverse=True)
    n = len(uniq)

    def reduce(values: Tensor, how: str) -> Tensor:
        return values.new_zeros(n).scatter_reduce(0, inv, values, how, include_self=False)

    score = reduce(scores[live[m], y, x], "amax")
    cx = (reduce(x, "amin") + reduce(x, "amax") + 1).float() * (stride / 2)
    cy = (reduce(y, "amin") + reduce(y, "amax") + 1).float() * (stride / 2)
    owner = uniq // (h * w + 1)
    image, cls = owner // (k - 1), owner % (k - 1)
    order = torch.argsort(score, descending=True, stable=True)
    order = order[torch.argsort(image[order], stable=True)]  # by image, best first within each
    return Points(image[order], cls[order], torch.stack((cx, cy), 1)[order], score[order])


def padded(points: Points, batch: int) -> tuple[Tensor, Tensor, Tensor]:
    """The points as per-image rows, best first: (xy [B, P, 2], cls [B, P], valid [B, P])."""
    device = points.xy.device
    counts = torch.bincount(points.image, minlength=batch)
    p = int(counts.max()) if len(points.image) else 0
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.arange(len(points.image), device=device) - starts[points.image]
    xy = torch.zeros(batch, p, 2, device=device)
    cls = torch.zeros(batch, p, dtype=torch.int64, device=device)
    valid = torch.zeros(batch, p, dtype=torch.bool, device=device)
    xy[points.image, slot] = points.xy
    cls[points.image, slot] = points.cls
    valid[points.image, slot] = True
    return xy, cls, valid


def match_points(pred_xy: Tensor, pred_cls: Tensor, pred_valid: Tensor, gt_xy: Tensor, gt_cls: Tensor,
                 gt_valid: Tensor, dist: float) -> Tensor:
    """True positives [B, P] of predictions sorted best first per image against ground-truth
    points [B, M]: each prediction in turn takes the nearest unclaimed centroid of its class
    within `dist` (module docstring)."""
    b, p = pred_cls.shape
    tp = torch.zeros_like(pred_valid)
    if gt_xy.shape[1] == 0:  # no ground truth in the batch (argmin below needs a centroid to pick)
        return tp
    d2 = (pred_xy[:, :, None] - gt_xy[:, None]).square().sum(-1)          # [B, P, M]
    allowed = ((pred_cls[:, :, None] == gt_cls[:, None]) & gt_valid[:, None] & pred_valid[:, :, None]
               & (d2 <= dist * dist))
    claimed = torch.zeros_like(gt_valid)
    rows = torch.arange(b, device=pred_cls.device)
    for k in range(p):
        free = allowed[:, k] & ~claimed
        nearest = d2[:, k].masked_fill(~free, float("inf")).argmin(1)
        hit = free.any(1)
        tp[:, k] = hit
        claimed[rows, nearest] |= hit
    return tp


def rates(tp: int, fp: int, fn: int) -> tuple[float | None, float | None, float | None]:
    """(precision, recall, F1) of counts; None where undefined (no predictions: precision; no
    ground truth: recall; neither: all three). F1 = 2 TP / (2 TP + FP + FN)."""
    precision = tp / (tp + fp) if tp + fp else None
    recall = tp / (tp + fn) if tp + fn else None
    f1 = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else None
    return precision, recall, f1


def evaluate_points(model: nn.Module, loader: Iterable, device: torch.device | str, *, conf: float, dist: float,
                    amp_dtype: torch.dtype | None = None, names: Sequence[str] | None = None,
                    progress: bool = False) -> dict[str, Any]:
    """Validate `model` (on `device`) over batches of uint8 `images` and box `targets`.

    `model.predict(images)` returns the probability map [B, 1 + C, S/8, S/8]. Returns {"f1",
    "precision", "recall", "num_images", "num_points" (predicted), "per_class": [{"class",
    "images", "instances", "precision", "recall", "f1"}]}, counted over the whole split (micro).
    With neither ground truth nor predictions anywhere the headline is 1.0 (nothing to find,
    nothing found: Edge Impulse's convention); otherwise an undefined precision or recall is 0.
    The model's train/eval mode is restored."""
    device = torch.device(device)
    nc = model.num_classes
    # Device-side per-class sums, read back once: true positives, false positives, ground-truth
    # points, images holding the class.
    counts = torch.zeros(4, nc, dtype=torch.int64, device=device)
    images_seen = 0
    with validating(model, loader, progress) as batches:
        for batch in batches:
            images = to_input(batch.images, device)
            targets = batch.targets.to(device, non_blocking=True)
            probs = predict(model, images, amp_dtype)
            if probs.shape[-1] * GRID_STRIDE != images.shape[-1]:
                raise ValueError(f"a point map of {probs.shape[-1]} cells for {images.shape[-1]} px images: "
                                 f"the task's maps have one cell per {GRID_STRIDE} px")
            b = images.shape[0]
            xy, cls, valid = padded(decode_points(probs, conf), b)
            tp = match_points(xy, cls, valid, box_centroids(targets.boxes.float()), targets.labels,
                              targets.valid, dist)
            counts[0].index_add_(0, cls[tp], torch.ones_like(cls[tp]))
            fp = valid & ~tp
            counts[1].index_add_(0, cls[fp], torch.ones_like(cls[fp]))
            gt = targets.labels[targets.valid]
            counts[2].index_add_(0, gt, torch.ones_like(gt))
            present = torch.zeros(b, nc, dtype=torch.bool, device=device)
            present[targets.valid.nonzero(as_tuple=True)[0], gt] = True
            counts[3] += present.sum(0)
            images_seen += b
    tp, fp, n_gt, n_img = counts.cpu().tolist()
    names = list(names) if names is not None else [str(i) for i in range(nc)]
    per_class = []
    for c in range(nc):
        p, r, f1 = rates(tp[c], fp[c], n_gt[c] - tp[c])
        per_class.append({"class": names[c] if c < len(names) else str(c), "images": n_img[c],
                          "instances": n_gt[c], "precision": p, "recall": r, "f1": f1})
    p, r, f1 = rates(sum(tp), sum(fp), sum(n_gt) - sum(tp))
    if f1 is None:  # nothing to find and nothing found
        p = r = f1 = 1.0
    return {"f1": f1, "precision": p or 0.0, "recall": r or 0.0, "num_images": images_seen,
            "num_points": sum(tp) + sum(fp), "per_class": per_class}
