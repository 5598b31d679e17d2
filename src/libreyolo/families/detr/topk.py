"""The `model.predict` form of a DETR output: every query's box in input pixels + class scores.

Upstream's RTDETRPostProcessor (focal mode) takes the top-300 (query, class) pairs of the
sigmoid scores; here predict returns all queries with all class scores ([B, Q, 4 + C]) and the
shared end-to-end path (model.end_to_end) does the top-k over (query, class) pairs."""

from __future__ import annotations

import torch
from torch import Tensor

from .boxes import cxcywh_to_xyxy


def decode(logits: Tensor, boxes: Tensor, size: tuple[int, int]) -> Tensor:
    """logits [B, Q, C], boxes [B, Q, 4] cxcywh normalised, size (h, w) of the input ->
    [B, Q, 4 + C] float32: xyxy in pixels, then sigmoid scores."""
    h, w = size
    x1, y1, x2, y2 = cxcywh_to_xyxy(boxes.float()).unbind(-1)  # scalars, no host->device copy
    return torch.cat((torch.stack((x1 * w, y1 * h, x2 * w, y2 * h), -1), logits.float().sigmoid()), -1)
