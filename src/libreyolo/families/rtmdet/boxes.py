"""IoU and GIoU that stay finite for any boxes, inverted ones included.

RTMDet-tiny/s predict plain (not exponentiated) distances, so early predicted boxes can have
negative width; the union and the enclosing area are clamped at `eps` (as mmdet's bbox_overlaps
does) so neither the IoU nor the GIoU gradient can become inf/NaN. Both broadcast over leading
dims ([B, M, 1, 4] with [B, 1, A, 4] -> [B, M, A]) without a [..., 4] pairwise intermediate.
(Candidates for common.py: bbox_iou there adds eps to heights instead and has no GIoU.)
"""

from __future__ import annotations

import torch

EPS = 1e-6


def _iou_union(a: torch.Tensor, b: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    ax1, ay1, ax2, ay2 = a.unbind(-1)
    bx1, by1, bx2, by2 = b.unbind(-1)
    inter = ((torch.minimum(ax2, bx2) - torch.maximum(ax1, bx1)).clamp(min=0)
             * (torch.minimum(ay2, by2) - torch.maximum(ay1, by1)).clamp(min=0))
    union = ((ax2 - ax1) * (ay2 - ay1) + (bx2 - bx1) * (by2 - by1) - inter).clamp(min=eps)
    return inter / union, union


def box_iou(a: torch.Tensor, b: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """IoU of xyxy boxes, broadcasting: [..., 4] x [..., 4] -> [...]."""
    return _iou_union(a, b, eps)[0]


def box_giou(a: torch.Tensor, b: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """Generalised IoU (Rezatofighi et al., 2019): IoU - (enclosing - union) / enclosing."""
    iou, union = _iou_union(a, b, eps)
    ax1, ay1, ax2, ay2 = a.unbind(-1)
    bx1, by1, bx2, by2 = b.unbind(-1)
    enclose = ((torch.maximum(ax2, bx2) - torch.minimum(ax1, bx1)).clamp(min=0)
               * (torch.maximum(ay2, by2) - torch.minimum(ay1, by1)).clamp(min=0)).clamp(min=eps)
    return iou - (enclose - union) / enclose
