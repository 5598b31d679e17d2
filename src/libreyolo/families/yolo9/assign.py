"""Task-aligned label assignment (TOOD, Feng et al., 2021), as YOLOv9 trains with it.

Dense over the padded targets: every step works on [B, M, A] tensors (M padded gts, A anchors),
with no Python loop over images or boxes, no boolean-mask indexing and no host sync, so the whole
assignment is a fixed sequence of kernels whatever the number of boxes.

For each gt: candidates are the anchors whose centre lies inside the box, grown about its centre
to at least `min_side` pixels per side for this test only (so a gt smaller than a stride-16 cell
still has anchors; the IoU terms use the real box); each candidate gets
the alignment metric t = s^alpha * u^beta (s = predicted score of the gt's class, u = CIoU of the
predicted box with the gt, clamped at 0, as YOLOv9 uses; plain IoU with `ciou=False`, as
PP-YOLOE and YOLO-NAS use); the top-k candidates become positives.
An anchor claimed by several gts keeps the one it overlaps most. Soft targets: a positive's
class target is t normalised per gt so that the gt's best anchor gets that gt's best IoU.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..common import bbox_iou

EPS = 1e-9


class Assignment(NamedTuple):
    boxes: torch.Tensor   # [B, A, 4] xyxy (same units as the gt boxes) of each anchor's gt
    scores: torch.Tensor  # [B, A, C] float soft class targets (zero rows for background)
    fg: torch.Tensor      # [B, A] bool, anchor is a positive
    labels: torch.Tensor  # [B, A] int64 class of each anchor's gt (0 for background, masked by fg)


def centres_in_boxes(points: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    """[A, 2] anchor centres x [B, M, 4] boxes -> [B, M, A] bool, centre strictly inside."""
    x, y = points[:, 0], points[:, 1]
    x1, y1, x2, y2 = (c.unsqueeze(-1) for c in boxes.unbind(-1))
    # Margins folded into the per-box side ([B, M, 1]) so each side is one [B, M, A] compare.
    return (x > x1 + EPS) & (y > y1 + EPS) & (x < x2 - EPS) & (y < y2 - EPS)


def widen(boxes: torch.Tensor, min_side: float) -> torch.Tensor:
    """xyxy boxes grown about their centres so that no side is shorter than `min_side`."""
    if min_side <= 0:
        return boxes
    centre = (boxes[..., :2] + boxes[..., 2:]) * 0.5
    half = (boxes[..., 2:] - boxes[..., :2]).clamp(min=min_side) * 0.5
    return torch.cat((centre - half, centre + half), -1)


class TaskAlignedAssigner:
    """`min_side` (pixels, 0 = off): the smallest box side the candidate test sees.

    With the real box, a gt under 8 px often contains no anchor centre of any level and is never
    assigned (1.1 % of the gts of a 640 px mosaic of the `shapes` data, and 29 % of them are
    under 16 px with a median of 3 candidates); YOLOv9-t trains with 16 (its middle stride), as
    the peer trainer's assigner does (Ultralytics 8.4: the candidate box is at least
    `stride[1]` wide and high).
    """

    def __init__(self, num_classes: int, topk: int = 10, alpha: float = 0.5, beta: float = 6.0,
                 min_side: float = 0.0, ciou: bool = True):
        self.num_classes = num_classes
        self.topk = topk
        self.alpha = alpha
        self.beta = beta
        self.min_side = float(min_side)
        self.ciou = ciou

    @torch.no_grad()
    def __call__(self, pd_scores: torch.Tensor, pd_boxes: torch.Tensor, points: torch.Tensor,
                 gt_labels: torch.Tensor, gt_boxes: torch.Tensor, valid: torch.Tensor) -> Assignment:
        """pd_scores [B, A, C] probabilities; pd_boxes [B, A, 4] xyxy; points [A, 2] anchor centres
        (same units as the boxes); gt_labels [B, M] int64; gt_boxes [B, M, 4] xyxy; valid [B, M]."""
        b, a, c = pd_scores.shape
        m = gt_boxes.shape[1]
        if m == 0:  # static shape check, not a sync: nothing to assign
            return Assignment(pd_boxes.new_zeros(b, a, 4), pd_scores.new_zeros(b, a, c),
                              torch.zeros(b, a, dtype=torch.bool, device=pd_scores.device),
                              torch.zeros(b, a, dtype=torch.long, device=pd_scores.device))
        labels = gt_labels.clamp(0, c - 1)  # padded rows may hold anything; they are masked below
        candidates = centres_in_boxes(points, widen(gt_boxes, self.min_side)) & valid.unsqueeze(-1)  # [B, M, A]

        # Score of each gt's class at every anchor: gather along C, never a [B, M, A, C] tensor.
        scores = pd_scores.transpose(1, 2).gather(1, labels.unsqueeze(-1).expand(b, m, a))
        overlaps = bbox_iou(gt_boxes.unsqueeze(2), pd_boxes.unsqueeze(1), ciou=self.ciou)
        overlaps = overlaps.clamp_(min=0).mul_(candidates)
        align = scores.pow_(self.alpha).mul_(overlaps.pow(self.beta))  # zero off-candidate

        k = min(self.topk, a)
        top_idx = align.topk(k, dim=-1).indices  # [B, M, k]
        pos = torch.zeros_like(candidates).scatter_(-1, top_idx, True) & candidates

        # An anchor claimed by several gts keeps the gt it overlaps most (`& pos` so that a tie
        # at zero overlap can never hand the anchor to a gt that did not claim it).
        multi = pos.sum(1, keepdim=True) > 1  # [B, 1, A]
        best = overlaps.argmax(1, keepdim=True)  # [B, 1, A]
        best_onehot = torch.arange(m, device=best.device).view(1, m, 1) == best
        pos = torch.where(multi, best_onehot & pos, pos)

        fg = pos.any(1)  # [B, A]
        gt_idx = pos.to(torch.uint8).argmax(1)  # [B, A]; 0 for background, masked by fg
        boxes = gt_boxes.gather(1, gt_idx.unsqueeze(-1).expand(b, a, 4))
        target_labels = labels.gather(1, gt_idx)

        # Normalise t per gt: the gt's best positive anchor gets the gt's best positive IoU.
        align = align.mul_(pos)
        norm = align.amax(-1, keepdim=True) + EPS
        best_iou = overlaps.mul_(pos).amax(-1, keepdim=True)
        weight = align.mul_(best_iou).div_(norm).amax(1)  # [B, A]; zero where not fg
        target = pd_scores.new_zeros(b, a, c).scatter_(-1, target_labels.unsqueeze(-1),
                                                       weight.unsqueeze(-1).to(pd_scores.dtype))
        return Assignment(boxes, target, fg, target_labels)
