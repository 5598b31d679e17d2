"""DEIMv2's losses: DEIM's (MAL, L1, GIoU, FGL, DDF) with a late change of the matching cost; the
ultra-light sizes without FGL/DDF and without the union set.

Facts from github:Intellindust-AI-Lab/DEIMv2 engine/deim/deim_criterion.py, engine/deim/matcher.py
and configs/base/deimv2.yml (weights mal 1, bbox 5, giou 2, fgl 0.15, ddf 1.5, MAL gamma 1.5;
the matcher's `change_matcher: True`, `iou_order_alpha: 4.0`):
- From `matcher_change_epoch` on, the Hungarian cost of every matched set is
  -(p_class x IoU^4) (p the sigmoid score of the target's class, IoU of the boxes) instead of
  the focal/L1/GIoU cost: a match then asks for a box that overlaps and a class that scores, the
  one-to-one counterpart of the MAL target (IoU^gamma). The model's `set_epoch` says when
  (net.py, `iou_matching_from`).
- n: `losses: ['mal', 'boxes', 'local']` with the union set (DEIM's loss, dfine/loss.py).
- atto, femto, pico: `losses: ['mal', 'boxes']`, `use_uni_set: False`: MAL, L1 and GIoU on every
  set's own matching (decoder layers, the layer-0 pre head, the encoder head; the dn queries and
  the dn pre head on their fixed pairs, divided by the group count), normalised by the number of
  target boxes. Items (mal, l1, giou).
Float32, vectorised over images and sets; no host sync beyond the matcher's solve.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..base import Targets
from ..detr.boxes import cxcywh_to_xyxy, iou_giou
from ..detr.criterion import dn_live, dn_pairs, normalise_targets
from ..detr.output import INPUT_WH, DETROutput
from ..dfine.loss import DEIMLoss

IOU_ORDER_ALPHA = 4.0  # configs/base/deimv2.yml HungarianMatcher iou_order_alpha


def iou_order_cost(logits: Tensor, boxes: Tensor, labels: Tensor, tgt_boxes: Tensor,
                   alpha: float = IOU_ORDER_ALPHA) -> Tensor:
    """-(p x IoU^alpha) for N stacked sets: logits [N, Q, C], boxes [N, Q, 4] cxcywh, labels
    [N, M], tgt_boxes [N, M, 4] cxcywh -> [N, M, Q] float32 (rows: targets), as matcher.match_cost."""
    logits, boxes, tgt_boxes = logits.float(), boxes.float(), tgt_boxes.float()
    p = logits.gather(2, labels.unsqueeze(1).expand(-1, logits.shape[1], -1)).sigmoid()  # [N, Q, M]
    iou = iou_giou(cxcywh_to_xyxy(boxes).unsqueeze(-2), cxcywh_to_xyxy(tgt_boxes).unsqueeze(-3))[0]
    return -(p * iou.pow(alpha)).transpose(1, 2)


class DEIMv2Loss(DEIMLoss):
    """n: DEIM's loss; the matching cost follows the model's `iou_matching` (set per epoch)."""

    def __init__(self, model: Any, cfg: Any = None, backend: str | None = None):
        super().__init__(model, cfg, backend)
        self.model = getattr(model, "module", model)

    def match_cost(self, logits: Tensor, boxes: Tensor, labels: Tensor, tgt_boxes: Tensor) -> Tensor:
        if self.model.iou_matching:
            return iou_order_cost(logits, boxes, labels, tgt_boxes)
        return super().match_cost(logits, boxes, labels, tgt_boxes)


class DEIMv2OwnSetLoss(DEIMv2Loss):
    """atto/femto/pico: MAL, L1 and GIoU, each set on its own matching (items mal, l1, giou)."""

    extra_names = ()

    def _per_image(self, preds: DETROutput, targets: Targets) -> tuple[Tensor, Tensor]:
        out = preds.to(torch.float32)
        tgt = normalise_targets(targets, out.extra[INPUT_WH])
        sets = self.output_sets(out)
        pairs = self.match(sets, tgt)
        cls = l1 = gi = 0.0
        for name, (logits, boxes) in sets.items():
            c, a, g = self.pair_terms(logits, boxes, pairs[name], tgt)
            cls, l1, gi = cls + c, l1 + a, gi + g
        if out.dn_logits.shape[2] > 0:
            groups = out.dn_groups
            dn_sets = ((out.dn_logits, out.dn_boxes),
                       (out.extra["dn_pre_logits"].unsqueeze(1), out.extra["dn_pre_boxes"].unsqueeze(1)))
            for logits, boxes in dn_sets:
                c, a, g = self.pair_terms(logits, boxes, dn_pairs(out.dn_target, logits.shape[1], tgt.valid), tgt,
                                          dn_live(out))
                cls, l1, gi = cls + c / groups, l1 + a / groups, gi + g / groups
        terms = [cls * self.gain_cls, l1 * self.gain_l1, gi * self.gain_giou]
        return torch.stack(terms, 1), tgt.valid.sum(1).float()


def criterion(model: Any, cfg: Any = None) -> DEIMv2Loss:
    arch = getattr(model, "module", model).arch
    return DEIMv2Loss(model, cfg) if arch.local_loss else DEIMv2OwnSetLoss(model, cfg)
