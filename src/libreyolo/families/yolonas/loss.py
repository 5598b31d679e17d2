"""YOLO-NAS detection loss: PP-YOLOE's task-aligned assignment, varifocal classification, GIoU + DFL.

From super-gradients' `PPYoloELoss` as the YOLO-NAS recipe configures it
(training_hyperparams/coco2017_yolo_nas_train_params.yaml: `use_static_assigner: False`, so the
task-aligned assigner from the first step; PP-YOLOE, Xu et al., arXiv 2203.16250):
  assignment: TOOD's task-aligned assigner (yolo9/assign.py) with top-k 13, alpha 1, beta 6 and
              the plain IoU of the predicted box with the gt; candidates are the anchors whose
              centre lies inside the gt;
  L_cls = sum VFL(logits, t): BCE-with-logits against the soft target t (the normalised
          alignment on the positive's gt class, 0 elsewhere), weighted t on that entry and
          0.75 * p^2 everywhere else (VarifocalNet, Zhang et al., 2021);
  L_box = sum over positives of (1 - GIoU(pred, gt)) * w,  w = the positive's soft-target sum;
  L_dfl = sum over positives of DFL(17 bin logits, gt distances clamped to [0, 15.99]) * w;
  loss = B * (2.5 L_box + 1.0 L_cls + 0.5 L_dfl) / max(sum t, 1)  (the gains are cfg box/cls/dfl).
Per-image sums and normalisers come from `per_image`, so the batch loss is exactly
sum_i raw_i / max(sum_i norm_i, 1) (the family contract's factor B included: upstream returns the
unscaled mean, which AdamW, the recipe's optimizer, does not see).

Where ours differs from upstream: an anchor claimed by several gts goes to the claimant it
overlaps most; upstream's argmax runs over every gt of the image (padded rows included), so it can
hand the anchor to a gt that never chose it. The shared assigner keeps the claimants' rule.
Float32 throughout, shape-static, no host sync: upstream pads the targets per image with a
`.item()`, tests `if num_pos > 0` and gathers the positives with boolean `masked_select`, a sync
each; here every anchor is computed and a background anchor carries weight exactly 0.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..common import (
    AnchorCache,
    PerImageLoss,
    bbox2dist,
    dfl_decode,
    dfl_loss,
    dist2bbox,
    flatten_levels,
)
from ..rtmdet.boxes import box_giou
from ..yolo9.assign import TaskAlignedAssigner

# PPYoloELoss defaults: iou_loss_weight 2.5, classification_loss_weight 1.0, dfl_loss_weight 0.5.
DEFAULT_GAINS = {"box": 2.5, "cls": 1.0, "dfl": 0.5}
VFL_ALPHA, VFL_GAMMA = 0.75, 2.0  # PPYoloELoss._varifocal_loss
TOPK, ALPHA, BETA = 13, 1.0, 6.0  # ppyolo_loss.py TaskAlignedAssigner as PPYoloELoss builds it


def varifocal(logits: torch.Tensor, target: torch.Tensor, onehot: torch.Tensor) -> torch.Tensor:
    """Elementwise VFL: logits, soft target [..., C] and the positives' one-hot (bool) -> [..., C].

    The negatives' weight alpha p^gamma is not detached, as upstream's (and VarifocalNet's)."""
    weight = torch.where(onehot, target, VFL_ALPHA * logits.sigmoid().pow(VFL_GAMMA))
    return weight * F.binary_cross_entropy_with_logits(logits, target, reduction="none")


class YOLONASLoss(PerImageLoss):
    """Gain-weighted sums per image [B, 3] (box, cls, dfl); normaliser: the sum of soft class targets."""

    item_names = ("box", "cls", "dfl")

    def __init__(self, model: Any, cfg: Any = None):
        model = getattr(model, "module", model)  # DDP wrapper -> the model
        self.num_classes = model.num_classes
        self.reg_max = model.reg_max  # the largest distance: reg_max + 1 bins
        self.anchors = AnchorCache(tuple(model.strides))
        self.assigner = TaskAlignedAssigner(self.num_classes, topk=TOPK, alpha=ALPHA, beta=BETA, ciou=False)
        self.gains = tuple(float(getattr(cfg, k, v)) for k, v in DEFAULT_GAINS.items())

    def _per_image(self, preds: tuple[torch.Tensor, ...], targets: Any) -> tuple[torch.Tensor, torch.Tensor]:
        bins = self.reg_max + 1
        x = flatten_levels(preds, torch.float32)  # [B, A, 4 * bins + C], autocast outputs cast up
        box_logits, cls_logits = x.split((4 * bins, self.num_classes), -1)
        points, strides = self.anchors(preds, torch.float32)  # grid units, [A, 1] strides
        pred_boxes = dist2bbox(dfl_decode(box_logits, bins), points)  # grid units

        assigned = self.assigner(cls_logits.detach().sigmoid(), pred_boxes.detach() * strides,
                                 points * strides, targets.labels, targets.boxes.float(), targets.valid)
        target_boxes = assigned.boxes / strides  # pixels -> grid units of each anchor's level
        weight = assigned.scores.sum(-1)  # [B, A]; exactly zero off the positives

        # Background rows hold whatever gt 0 is (junk for a padded row) at weight 0; box_giou
        # stays finite for any boxes, so 0 * loss is 0 and no NaN reaches the gradient.
        box = ((1.0 - box_giou(pred_boxes, target_boxes)) * weight).sum(1)
        target_dist = bbox2dist(points, target_boxes, self.reg_max)
        dfl = (dfl_loss(box_logits.unflatten(-1, (4, bins)), target_dist) * weight).sum(1)
        onehot = torch.zeros_like(cls_logits, dtype=torch.bool).scatter_(
            -1, assigned.labels.unsqueeze(-1), assigned.fg.unsqueeze(-1))
        cls = varifocal(cls_logits, assigned.scores, onehot).sum((1, 2))
        g_box, g_cls, g_dfl = self.gains  # python floats: no tensor to copy to the device
        return (torch.stack((box * g_box, cls * g_cls, dfl * g_dfl), 1),
                assigned.scores.sum((1, 2)))


def criterion(model: Any, cfg: Any = None) -> YOLONASLoss:
    return YOLONASLoss(model, cfg)
