"""Box helpers for the DETR families: conversions, IoU/GIoU (pairwise and elementwise) and the
inverse sigmoid the decoders refine boxes in.

DETR boxes are cxcywh normalised by the input (w, h). GIoU (Rezatofighi et al., 2019) =
IoU - (enclosing - union) / enclosing. Unlike upstream's `generalized_box_iou` (which asserts
well-formed boxes and divides unguarded), the denominators carry an eps so junk rows (padded
targets, a degenerate noised dn box) stay finite; the value on real boxes is unchanged to ~1e-7.
"""

from __future__ import annotations

import torch
from torch import Tensor

# rtdetrv2_pytorch/src/zoo/rtdetr/utils.py inverse_sigmoid: clip to [0, 1] then eps 1e-5.
INVERSE_SIGMOID_EPS = 1e-5


def cxcywh_to_xyxy(b: Tensor) -> Tensor:
    cx, cy, w, h = b.unbind(-1)
    return torch.stack((cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h), -1)


def xyxy_to_cxcywh(b: Tensor) -> Tensor:
    x1, y1, x2, y2 = b.unbind(-1)
    return torch.stack(((x1 + x2) * 0.5, (y1 + y2) * 0.5, x2 - x1, y2 - y1), -1)


def inverse_sigmoid(x: Tensor, eps: float = INVERSE_SIGMOID_EPS) -> Tensor:
    """logit(x) with x clipped to [0, 1] and both sides to >= eps, as upstream."""
    x = x.clamp(0.0, 1.0)
    return torch.log(x.clamp(min=eps) / (1.0 - x).clamp(min=eps))


def iou_giou(a: Tensor, b: Tensor, eps: float = 1e-7) -> tuple[Tensor, Tensor]:
    """(IoU, GIoU) of xyxy boxes broadcasting over the leading dims: [..., 4] x [..., 4] -> [...].

    Per coordinate (no [..., 4] intermediate of the broadcast size), so a pairwise call
    ([N, M, 1, 4] with [N, 1, Q, 4]) allocates only [N, M, Q] tensors."""
    ax1, ay1, ax2, ay2 = a.unbind(-1)
    bx1, by1, bx2, by2 = b.unbind(-1)
    area_a = (ax2 - ax1).clamp(min=0) * (ay2 - ay1).clamp(min=0)
    area_b = (bx2 - bx1).clamp(min=0) * (by2 - by1).clamp(min=0)
    inter = ((torch.minimum(ax2, bx2) - torch.maximum(ax1, bx1)).clamp(min=0)
             * (torch.minimum(ay2, by2) - torch.maximum(ay1, by1)).clamp(min=0))
    union = area_a + area_b - inter
    iou = inter / (union + eps)
    enclose = ((torch.maximum(ax2, bx2) - torch.minimum(ax1, bx1)).clamp(min=0)
               * (torch.maximum(ay2, by2) - torch.minimum(ay1, by1)).clamp(min=0))
    return iou, iou - (enclose - union) / (enclose + eps)


def giou(a: Tensor, b: Tensor) -> Tensor:
    """Elementwise GIoU of xyxy boxes (broadcasting): [..., 4] x [..., 4] -> [...]."""
    return iou_giou(a, b)[1]


def pairwise_giou(a: Tensor, b: Tensor) -> Tensor:
    """GIoU of every pair: a [N, Q, 4], b [N, M, 4] (xyxy) -> [N, Q, M]."""
    return giou(a.unsqueeze(-2), b.unsqueeze(-3))
