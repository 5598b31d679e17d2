"""YOLOv7's label assignment (the authors' utils/loss.py `ComputeLossOTA`), dense and sync-free.

Two stages, as upstream:
1. Candidates (`find_3_positive`). At every level, a gt is tried against each of the 3 anchors:
   the pair passes when neither side ratio gt/anchor nor anchor/gt reaches `anchor_t` (4.0).
   A passing pair nominates the row of that anchor at the gt centre's cell and at the two
   neighbouring cells nearest the centre: the left cell when the centre lies in the left half of
   its cell and more than one cell from the image's left edge, the right cell when it lies in the
   right half and more than one cell from the right edge; the same above and below (upstream's
   tests exactly, so a centre on a cell's middle line takes neither neighbour on that axis). Each
   (gt, level, anchor) owns 5 slots (centre, left, up, right, down), so the candidates of a batch
   are a fixed [B, M x 3 x 3 x 5] tensor of row indices with a validity mask.
2. OTA matching (SimOTA, YOLOX section 2.2), over the image's candidate rows, every gt against
   every candidate (as upstream: a gt may take a row another gt nominated):
     cost = sum_c BCE(sqrt(sigmoid(cls) * sigmoid(obj)), one-hot(class)) + 3 * -log(IoU + 1e-8)
   dynamic k per gt = the sum of its 10 largest IoUs, truncated, at least 1; each gt takes its k
   cheapest rows; a row taken by several gts goes to the gt that costs least there.

Dense over padded targets: no Python loop over images or boxes, no boolean-mask indexing, no host
sync. Upstream keeps one column per nomination, so a row nominated by two gts is two columns
(its IoU may count twice in a gt's top-10 sum, and it may be matched twice); here a row is one
candidate however many gts nominate it (`first_nominations`), which also makes the loss's
objectness targets well defined (one value per row).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..common import bbox_iou
from .net import NUM_ANCHORS, AnchorLayout

ANCHOR_T = 4.0       # hyp.scratch.{p5,tiny}.yaml anchor_t: the largest gt/anchor side ratio
TOPK_IOU = 10        # IoUs summed for a gt's dynamic k (and so the largest k)
IOU_WEIGHT = 3.0
LOG_FLOOR = -100.0   # log(p) clamp of BCE on probabilities: the cost stays finite at p = 0 or 1


class Candidates(NamedTuple):
    rows: torch.Tensor  # [B, N] row index (layout order) of each slot; junk where not ok
    ok: torch.Tensor    # [B, N] bool, the slot is a candidate row, the first nomination of it


class Assignment(NamedTuple):
    fg: torch.Tensor      # [B, N] bool, the slot's row is a positive
    boxes: torch.Tensor   # [B, N, 4] xyxy pixels of its gt (junk where not fg)
    labels: torch.Tensor  # [B, N] int64 class of its gt (junk where not fg)


def nominate(layout: AnchorLayout, gt_boxes: torch.Tensor, valid: torch.Tensor,
             anchor_t: float = ANCHOR_T) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage 1: (rows, ok) [B, M, 45] of every gt's slots, ordered (level, anchor, cell); all
    levels at once ([B, M, levels, ...] tensors), so the kernel count does not grow with them."""
    centre = (gt_boxes[..., :2] + gt_boxes[..., 2:]).unsqueeze(2) * 0.5  # [B, M, 1, 2] pixels
    wh = (gt_boxes[..., 2:] - gt_boxes[..., :2])[:, :, None, None]  # [B, M, 1, 1, 2]
    ratio = wh / layout.sizes  # [B, M, levels, anchors, 2]
    fits = torch.maximum(ratio, 1.0 / ratio).amax(-1) < anchor_t  # a 0-size gt: inf ratio, no fit
    g = centre / layout.level_strides  # [B, M, levels, 2] grid units
    far = layout.grids - g  # from the right / lower edge
    # Left / upper half of its cell and not in the first cell; the same from the far edge.
    low, high = (g % 1.0 < 0.5) & (g > 1.0), (far % 1.0 < 0.5) & (far > 1.0)
    gx, gy = g.unbind(-1)
    # The slots' cells (centre, left, up, right, down), as upstream: truncate the centre minus
    # half a cell towards the neighbour, then clamp into the grid.
    w, h = layout.grids.long().split(1, -1)  # [levels, 1] each
    cx = torch.minimum(torch.stack((gx, gx - 0.5, gx, gx + 0.5, gx), -1).long().clamp_(min=0), w - 1)
    cy = torch.minimum(torch.stack((gy, gy, gy - 0.5, gy, gy + 0.5), -1).long().clamp_(min=0), h - 1)
    on = torch.stack((torch.ones_like(low[..., 0]), low[..., 0], low[..., 1], high[..., 0], high[..., 1]), -1)
    on &= valid[:, :, None, None]  # [B, M, levels, 5]
    # Row = the level's first row + anchor x the level's cells + y x w + x.
    anchor_start = layout.starts.view(-1, 1) + torch.arange(NUM_ANCHORS, device=g.device) * (w * h)  # [levels, anchors]
    rows = anchor_start.unsqueeze(-1) + (cy * w + cx).unsqueeze(3)  # [B, M, levels, anchors, 5]
    ok = fits.unsqueeze(-1) & on.unsqueeze(3)
    return rows.flatten(2), ok.flatten(2)


def first_nominations(rows: torch.Tensor, ok: torch.Tensor, num_rows: int) -> torch.Tensor:
    """[B, N] bool: the slot is ok and no earlier ok slot of its image holds the same row."""
    b, n = rows.shape
    slot = torch.arange(n, device=rows.device).expand(b, n)
    key = torch.where(ok, rows, num_rows)  # slots that are not candidates all meet at a spare row
    first = torch.full((b, num_rows + 1), n, device=rows.device).scatter_reduce_(1, key, slot, "amin")
    return ok & (first.gather(1, key) == slot)


def class_cost(probs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """sum_c BCE(p_c, one-hot(label)_c) for every (gt, slot): probs [B, N, C], labels [B, M]
    -> [B, M, N], without a [B, M, N, C] tensor: the all-negative sum per slot, with the gt
    class's term switched from -log(1 - p) to -log(p)."""
    b, n, _ = probs.shape
    log_p = probs.log().clamp(min=LOG_FLOOR)
    log_q = torch.log1p(-probs).clamp(min=LOG_FLOOR)
    idx = labels.unsqueeze(-1).expand(b, labels.shape[1], n)
    return (-log_q.sum(-1).unsqueeze(1) - log_p.transpose(1, 2).gather(1, idx)
            + log_q.transpose(1, 2).gather(1, idx))


class OTAAssigner:
    def __init__(self, num_classes: int, anchor_t: float = ANCHOR_T):
        self.num_classes = num_classes
        self.anchor_t = anchor_t

    @torch.no_grad()
    def candidates(self, layout: AnchorLayout, gt_boxes: torch.Tensor, valid: torch.Tensor) -> Candidates:
        rows, ok = nominate(layout, gt_boxes, valid, self.anchor_t)
        rows, ok = rows.flatten(1), ok.flatten(1)
        return Candidates(rows, first_nominations(rows, ok, layout.cells.shape[0]))

    @torch.no_grad()
    def __call__(self, cand: Candidates, pd_boxes: torch.Tensor, probs: torch.Tensor,
                 gt_labels: torch.Tensor, gt_boxes: torch.Tensor, valid: torch.Tensor) -> Assignment:
        """Stage 2. pd_boxes [B, N, 4] xyxy pixels and probs [B, N, C] = sigmoid(cls) * sigmoid(obj)
        of the slots' rows; gt_labels [B, M], gt_boxes [B, M, 4] xyxy pixels, valid [B, M]."""
        b, n, c = probs.shape
        m = gt_boxes.shape[1]
        labels = gt_labels.clamp(0, c - 1)  # padded rows may hold anything; masked below
        pair = cand.ok.unsqueeze(1) & valid.unsqueeze(-1)  # [B, M, N]
        # where, not a product: a padded gt row may hold a degenerate box and a NaN IoU.
        ious = torch.where(pair, bbox_iou(gt_boxes.unsqueeze(2), pd_boxes.unsqueeze(1)).clamp_(min=0), 0.0)
        cost = class_cost(probs.sqrt(), labels)
        cost.add_(torch.log(ious + 1e-8), alpha=-IOU_WEIGHT).masked_fill_(~pair, float("inf"))

        k = min(TOPK_IOU, n)
        dynamic_k = ious.topk(k, dim=-1).values.sum(-1).int().clamp_(min=1)  # [B, M]
        cheapest = cost.topk(k, dim=-1, largest=False).indices  # [B, M, k]
        chosen = torch.arange(k, device=cost.device) < dynamic_k.unsqueeze(-1)
        matching = torch.zeros_like(pair).scatter_(-1, cheapest, chosen) & pair

        # A row taken by several gts goes to the gt that costs least there (over every gt).
        multi = matching.sum(1, keepdim=True) > 1  # [B, 1, N]
        best = torch.arange(m, device=cost.device).view(1, m, 1) == cost.argmin(1, keepdim=True)
        matching = torch.where(multi, best, matching)

        gt_idx = matching.to(torch.uint8).argmax(1)  # [B, N]; 0 where not fg, masked by fg
        return Assignment(matching.any(1), gt_boxes.gather(1, gt_idx.unsqueeze(-1).expand(b, n, 4)),
                          labels.gather(1, gt_idx))
