"""YOLOv9 detection loss: task-aligned assignment, BCE classification, CIoU + DFL box terms.

loss = B * (box_gain * L_box + cls_gain * L_cls + dfl_gain * L_dfl), each term summed over the
whole batch and divided by one normaliser, the sum of all soft class targets (clamped at 1):
  L_cls = sum BCE-with-logits(cls logits, IoU-aligned soft targets)
  L_box = sum over positives of (1 - CIoU(pred, gt)) * w,   w = the positive's soft-target sum
  L_dfl = sum over positives of DFL(bin logits, gt distances) * w
Per-image sums and normalisers come from `per_image`, so the batch loss is exactly
sum_i raw_i / max(sum_i norm_i, 1): the vectorised path is testable one image at a time.

Everything is float32 (autocast outputs are cast up first), shape-static and free of host syncs.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..common import (
    AnchorCache,
    PerImageLoss,
    bbox2dist,
    bbox_iou,
    dfl_decode,
    dfl_loss,
    dist2bbox,
    flatten_levels,
)
from .assign import TaskAlignedAssigner

DEFAULT_GAINS = {"box": 7.5, "cls": 0.5, "dfl": 1.5}  # YOLOv9 hyp.scratch-high


class YOLO9Loss(PerImageLoss):
    """Gain-weighted sums per image [B, 3] (box, cls, dfl); normaliser: the sum of soft class targets."""

    item_names = ("box", "cls", "dfl")

    def __init__(self, model: Any, cfg: Any = None):
        model = getattr(model, "module", model)  # DDP wrapper -> the model
        self.num_classes = model.num_classes
        self.reg_max = model.reg_max
        self.anchors = AnchorCache(tuple(model.strides))
        self.assigner = TaskAlignedAssigner(self.num_classes, topk=10, alpha=0.5, beta=6.0,
                                            min_side=float(model.strides[1]))
        self.gains = tuple(float(getattr(cfg, k, v)) for k, v in DEFAULT_GAINS.items())

    def _per_image(self, preds: tuple[torch.Tensor, ...], targets: Any) -> tuple[torch.Tensor, torch.Tensor]:
        r = self.reg_max
        x = flatten_levels(preds, torch.float32)  # [B, A, 4R + C], autocast outputs cast up
        # split, not slicing: its backward is one concat, where each slice's backward would
        # zero-fill and copy a full [B, A, 4R + C] gradient.
        box_logits, cls_logits = x.split((4 * r, self.num_classes), -1)
        points, strides = self.anchors(preds, torch.float32)  # grid units, [A, 1] strides
        pred_boxes = dist2bbox(dfl_decode(box_logits, r), points)  # grid units

        gt_boxes = targets.boxes.float()
        assigned = self.assigner(cls_logits.detach().sigmoid(), pred_boxes.detach() * strides,
                                 points * strides, targets.labels, gt_boxes, targets.valid)
        target_boxes = assigned.boxes / strides  # pixels -> grid units of each anchor's level
        weight = assigned.scores.sum(-1)  # [B, A]; exactly zero off the positives

        ciou = bbox_iou(pred_boxes, target_boxes, ciou=True)
        box = ((1.0 - ciou) * weight).sum(1)
        target_dist = bbox2dist(points, target_boxes, self.reg_max - 1)
        dfl = (dfl_loss(box_logits.unflatten(-1, (4, r)), target_dist) * weight).sum(1)
        cls = F.binary_cross_entropy_with_logits(cls_logits, assigned.scores,
                                                 reduction="none").sum((1, 2))
        g_box, g_cls, g_dfl = self.gains  # python floats: no tensor to copy to the device
        return (torch.stack((box * g_box, cls * g_cls, dfl * g_dfl), 1),
                assigned.scores.sum((1, 2)))


def criterion(model: Any, cfg: Any = None) -> YOLO9Loss:
    return YOLO9Loss(model, cfg)
