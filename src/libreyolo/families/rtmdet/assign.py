"""Dynamic soft-label assignment (RTMDet, Lyu et al., arXiv 2212.07784, section 3.2).

Dense over padded targets: every step works on [B, M, A] tensors (M padded gts, A priors) with no
Python loop over images or boxes, no boolean-mask indexing and no host sync.

As RTMDet trains with it (mmdet's DynamicSoftLabelAssigner):
- candidates: priors whose point lies strictly inside at least one gt of the image (any gt, not
  necessarily the one being matched: the cost decides);
- cost(gt, prior) = soft class cost + 3 * -log(IoU) + 10^(d - 3), d = distance from the prior to
  the gt centre in strides (the soft centre prior). The soft class cost is the BCE of the
  predicted logits against the IoU-scaled one-hot label, weighted by (soft label - p)^2 and
  summed over classes;
- each gt takes its k lowest-cost candidates, k = max(floor(sum of its top-13 IoUs), 1);
- a prior taken by several gts goes to the gt with the lowest cost for it.
The IoU of each positive with its gt is the soft classification target (QFL) and box weight.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from .boxes import box_iou

INF = 1e8
TOPK = 13
IOU_WEIGHT = 3.0
CENTRE_RADIUS = 3.0


class Assignment(NamedTuple):
    boxes: torch.Tensor   # [B, A, 4] xyxy pixels of each prior's gt (junk where not fg)
    labels: torch.Tensor  # [B, A] int64 class of each prior's gt (junk where not fg)
    ious: torch.Tensor    # [B, A] IoU of the prediction with its gt; exactly 0 where not fg
    fg: torch.Tensor      # [B, A] bool


def soft_class_cost(logits: torch.Tensor, labels: torch.Tensor, ious: torch.Tensor) -> torch.Tensor:
    """sum_c BCE(x_c, y_c) * (y_c - sigmoid(x_c))^2 with y = onehot(label) * IoU -> [B, M, A].

    Exact reformulation without a [B, M, A, C] tensor: every class but the gt's has y = 0 and
    contributes softplus(x) * p^2, which is the same for all gts; so take that sum over all
    classes once per prior ([B, A]) and swap in the gt-class term per pair.
    """
    b, m, a = ious.shape
    p = logits.sigmoid()
    neg = F.softplus(logits) * p.square()  # BCE(x, 0) * p^2, [B, A, C]
    x = logits.transpose(1, 2).gather(1, labels.unsqueeze(-1).expand(b, m, a))  # [B, M, A]
    px = x.sigmoid()
    neg_at = F.softplus(x) * px.square()
    pos = F.binary_cross_entropy_with_logits(x, ious, reduction="none") * (ious - px).square()
    return neg.sum(-1).unsqueeze(1) - neg_at + pos


@torch.no_grad()
def assign(logits: torch.Tensor, pd_boxes: torch.Tensor, points: torch.Tensor, strides: torch.Tensor,
           gt_labels: torch.Tensor, gt_boxes: torch.Tensor, valid: torch.Tensor,
           topk: int = TOPK, min_k: int = 1) -> Assignment:
    """logits [B, A, C]; pd_boxes [B, A, 4] xyxy pixels; points [A, 2] pixels; strides [A, 1];
    gt_labels [B, M] int64; gt_boxes [B, M, 4] xyxy pixels; valid [B, M] bool; min_k: the
    floor of dynamic k (mmdet's 1)."""
    b, a, c = logits.shape
    m = gt_boxes.shape[1]
    if m == 0:  # static shape check, not a sync
        return Assignment(pd_boxes.new_zeros(b, a, 4), gt_labels.new_zeros(b, a),
                          pd_boxes.new_zeros(b, a), valid.new_zeros(b, a))
    labels = gt_labels.clamp(0, c - 1)  # padded rows may hold anything; masked below
    x1, y1, x2, y2 = (t.unsqueeze(-1) for t in gt_boxes.unbind(-1))  # [B, M, 1] each
    px, py = points[:, 0], points[:, 1]
    inside = (px > x1) & (py > y1) & (px < x2) & (py < y2) & valid.unsqueeze(-1)
    pair = inside.any(1, keepdim=True) & valid.unsqueeze(-1)  # [B, M, A] candidate x real gt

    ious = box_iou(gt_boxes.unsqueeze(2), pd_boxes.unsqueeze(1)) * pair  # [B, M, A]
    dist = torch.hypot(px - (x1 + x2) * 0.5, py - (y1 + y2) * 0.5) / strides.view(1, 1, a)
    cost = (soft_class_cost(logits, labels, ious) - torch.log(ious + 1e-7) * IOU_WEIGHT
            + torch.pow(10.0, dist - CENTRE_RADIUS))
    # Far priors overflow 10^(d - 3) to inf; clamp so every candidate still beats a non-candidate.
    cost = torch.where(pair, cost.clamp(max=INF / 2), INF)

    k = min(topk, a)
    dynamic_k = ious.topk(k, -1).values.sum(-1).long().clamp(min=min_k)  # floor, as int() does
    chosen = cost.topk(k, -1, largest=False).indices  # [B, M, k]
    keep = torch.arange(k, device=cost.device) < dynamic_k.unsqueeze(-1)
    match = torch.zeros_like(pair).scatter_(-1, chosen, keep) & pair

    # Conflicts: the prior goes to its lowest-cost gt (over all real gts, as the reference does).
    multi = match.sum(1, keepdim=True) > 1  # [B, 1, A]
    best = torch.arange(m, device=cost.device).view(1, m, 1) == cost.argmin(1, keepdim=True)
    match = torch.where(multi, best & pair, match)

    fg = match.any(1)
    gt_idx = match.to(torch.uint8).argmax(1)  # [B, A]; 0 where not fg (masked by `ious`)
    boxes = gt_boxes.gather(1, gt_idx.unsqueeze(-1).expand(b, a, 4))
    return Assignment(boxes, labels.gather(1, gt_idx), (ious * match).sum(1), fg)
