"""SimOTA label assignment (YOLOX report, section 2.2), dense over padded targets.

Every step works on [B, M, A] tensors (M padded gts, A anchors) with topk, gather and masks: no
Python loop over images or boxes, no boolean-mask indexing, no host sync. The original SimOTA
gathers the candidate anchors of each image into a ragged tensor (a dynamic shape); here the
non-candidates stay in place with an infinite cost instead, which selects exactly the same anchors.

For one image:
1. Centre prior. An anchor (grid-cell centre) is in the gt's box when it lies strictly inside it,
   in the gt's centre region when it lies within 2.5 strides of the gt centre on both axes.
   Candidates: anchors in the box OR the centre region of at least one gt.
2. Cost of pairing gt g with candidate a:
     cls BCE(sqrt(sigmoid(cls) * sigmoid(obj)), one-hot(g's class)) summed over classes
     + 3 * -log(IoU(pred a, g) + 1e-8)
     + 1e5 if a is not both in g's box and g's centre region.
3. Dynamic k per gt: the sum of its 10 largest IoUs over candidates, truncated, at least 1.
4. Each gt takes its k lowest-cost candidates. An anchor taken by several gts goes to the gt with
   the lowest cost for it (the argmin over all gts, as YOLOX resolves it).
The IoU-aware class target of a positive is its predicted box's IoU with its gt.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..common import bbox_iou

CENTRE_RADIUS = 2.5  # strides
IOU_WEIGHT = 3.0
OUTSIDE_COST = 1e5   # pairs outside box-and-centre stay possible, but only as a last resort
TOPK_IOU = 10        # IoUs summed for dynamic k; also the largest k can be (IoU <= 1)
LOG_FLOOR = -100.0   # F.binary_cross_entropy's clamp of log(p): keeps the cost finite at p = 0, 1


class Assignment(NamedTuple):
    boxes: torch.Tensor   # [B, A, 4] xyxy pixels of each anchor's gt (junk where not fg)
    labels: torch.Tensor  # [B, A] int64 class of each anchor's gt (0 where not fg)
    iou: torch.Tensor     # [B, A] IoU of the anchor's predicted box with its gt (0 where not fg)
    fg: torch.Tensor      # [B, A] bool, anchor is a positive


def centre_prior(centres: torch.Tensor, strides: torch.Tensor,
                 boxes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """centres [A, 2] px, strides [A, 1], boxes [B, M, 4] -> (in box, in centre region) [B, M, A]."""
    x, y = centres[:, 0], centres[:, 1]
    x1, y1, x2, y2 = (c.unsqueeze(-1) for c in boxes.unbind(-1))
    in_box = (x > x1) & (y > y1) & (x < x2) & (y < y2)
    r = strides[:, 0] * CENTRE_RADIUS  # [A]
    cx, cy = (x1 + x2) * 0.5, (y1 + y2) * 0.5
    in_centre = ((x - cx).abs() < r) & ((y - cy).abs() < r)
    return in_box, in_centre


def class_cost(probs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """sum_c BCE(p_c, one-hot(label)_c) for every (gt, anchor): probs [B, A, C], labels [B, M]
    -> [B, M, A], without a [B, M, A, C] tensor: the sum is the all-negative sum per anchor, with
    the gt class's term switched from -log(1 - p) to -log(p)."""
    b, a, _ = probs.shape
    log_p = probs.log().clamp(min=LOG_FLOOR)
    log_q = torch.log1p(-probs).clamp(min=LOG_FLOOR)
    negatives = -log_q.sum(-1).unsqueeze(1)  # [B, 1, A]
    idx = labels.unsqueeze(-1).expand(b, labels.shape[1], a)
    lp = log_p.transpose(1, 2).gather(1, idx)  # [B, M, A]
    lq = log_q.transpose(1, 2).gather(1, idx)
    return negatives - lp + lq


class SimOTAAssigner:
    def __init__(self, num_classes: int):
        self.num_classes = num_classes

    @torch.no_grad()
    def __call__(self, probs: torch.Tensor, pd_boxes: torch.Tensor, centres: torch.Tensor,
                 strides: torch.Tensor, gt_labels: torch.Tensor, gt_boxes: torch.Tensor,
                 valid: torch.Tensor) -> Assignment:
        """probs [B, A, C] = sigmoid(cls) * sigmoid(obj); pd_boxes [B, A, 4] xyxy px; centres
        [A, 2] anchor centres px; strides [A, 1]; gt_labels [B, M]; gt_boxes [B, M, 4] xyxy px;
        valid [B, M]."""
        b, a, c = probs.shape
        m = gt_boxes.shape[1]
        if m == 0:  # static shape check, not a sync: nothing to assign
            return Assignment(pd_boxes.new_zeros(b, a, 4), gt_labels.new_zeros(b, a),
                              pd_boxes.new_zeros(b, a),
                              torch.zeros(b, a, dtype=torch.bool, device=probs.device))
        labels = gt_labels.clamp(0, c - 1)  # padded rows may hold anything; masked below
        in_box, in_centre = centre_prior(centres, strides, gt_boxes)
        pair_ok = (in_box | in_centre) & valid.unsqueeze(-1)
        candidate = pair_ok.any(1, keepdim=True) & valid.unsqueeze(-1)  # [B, M, A]

        ious = bbox_iou(gt_boxes.unsqueeze(2), pd_boxes.unsqueeze(1)).clamp_(min=0)  # [B, M, A]
        ious = ious.mul_(candidate)
        cost = class_cost(probs.sqrt(), labels)
        cost.add_(torch.log(ious + 1e-8), alpha=-IOU_WEIGHT)
        cost.add_((~(in_box & in_centre)).to(cost.dtype), alpha=OUTSIDE_COST)
        cost = cost.masked_fill_(~candidate, float("inf"))

        k = min(TOPK_IOU, a)
        dynamic_k = ious.topk(k, dim=-1).values.sum(-1).int().clamp_(min=1)  # [B, M]
        order = cost.topk(k, dim=-1, largest=False).indices  # [B, M, k], cheapest first
        rank = torch.arange(k, device=cost.device)
        chosen = rank < dynamic_k.unsqueeze(-1)  # [B, M, k]
        matching = torch.zeros_like(candidate).scatter_(-1, order, chosen) & candidate

        # An anchor taken by several gts goes to its cheapest gt (over all valid gts).
        multi = matching.sum(1, keepdim=True) > 1  # [B, 1, A]
        cheapest = cost.argmin(1, keepdim=True)  # [B, 1, A]
        cheapest_onehot = torch.arange(m, device=cost.device).view(1, m, 1) == cheapest
        matching = torch.where(multi, cheapest_onehot, matching)

        fg = matching.any(1)  # [B, A]
        gt_idx = matching.to(torch.uint8).argmax(1)  # [B, A]; 0 for background, masked by fg
        boxes = gt_boxes.gather(1, gt_idx.unsqueeze(-1).expand(b, a, 4))
        matched_iou = (ious * matching).sum(1)
        return Assignment(boxes, labels.gather(1, gt_idx) * fg, matched_iou, fg)
