"""RTMDet detection loss: dynamic soft-label assignment, quality focal loss, GIoU.

loss = B * (box_gain * L_box + cls_gain * L_cls), both summed over the batch and divided by one
normaliser, the sum over positives of IoU(pred, gt) (clamped at 1), as mmdet's RTMDetHead does:
  L_cls = sum QFL(logits, y),  y = onehot(gt class) * IoU on positives, 0 elsewhere;
          QFL = BCE-with-logits(x, y) * |y - sigmoid(x)|^2 (Li et al., GFL, 2020; beta = 2)
  L_box = sum over positives of (1 - GIoU(pred, gt)) * IoU
Published gains: cls 1.0, box 2.0 (the family spec sets them as config defaults).
Dense form: the QFL written over the whole [B, A, C] target equals mmdet's split into negatives
and the positives' gt class, so no positive indices are needed.

Per-image sums and normalisers come from `per_image`, so the batch loss is exactly
sum_i raw_i / max(sum_i norm_i, 1): the vectorised path is testable one image at a time.
Float32 throughout, shape-static, no host sync.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..common import AnchorCache, PerImageLoss, flatten_levels
from .assign import assign
from .boxes import box_giou
from .net import decode_boxes

DEFAULT_GAINS = {"box": 2.0, "cls": 1.0}  # mmdet rtmdet_l config: GIoULoss 2.0, QFL 1.0


class RTMDetLoss(PerImageLoss):
    """Gain-weighted sums per image [B, 2] (box, cls); normaliser: the positives' IoU sum."""

    item_names = ("box", "cls")

    def __init__(self, model: Any, cfg: Any = None):
        model = getattr(model, "module", model)  # DDP wrapper -> the model
        self.num_classes = model.num_classes
        self.priors = AnchorCache(tuple(model.strides), offset=0.0, pixels=True)
        self.gains = tuple(float(getattr(cfg, k, v)) for k, v in DEFAULT_GAINS.items())

    def _per_image(self, preds: tuple[torch.Tensor, ...], targets: Any) -> tuple[torch.Tensor, torch.Tensor]:
        x = flatten_levels(preds, torch.float32)  # [B, A, C + 4], autocast outputs cast up
        logits, dist = x.split((self.num_classes, 4), -1)
        points, strides = self.priors(preds)
        pred_boxes = decode_boxes(dist, points)  # pixels

        gt = assign(logits.detach(), pred_boxes.detach(), points, strides, targets.labels,
                    targets.boxes.float(), targets.valid)
        soft = torch.zeros_like(logits).scatter_(-1, gt.labels.unsqueeze(-1), gt.ious.unsqueeze(-1))
        qfl = (F.binary_cross_entropy_with_logits(logits, soft, reduction="none")
               * (soft - logits.sigmoid()).square())
        # Background rows hold junk boxes but weight exactly 0; box_giou is finite for any input.
        box = ((1.0 - box_giou(pred_boxes, gt.boxes)) * gt.ious).sum(1)
        g_box, g_cls = self.gains
        return torch.stack((box * g_box, qfl.sum((1, 2)) * g_cls), 1), gt.ious.sum(1)


def criterion(model: Any, cfg: Any = None) -> RTMDetLoss:
    return RTMDetLoss(model, cfg)
