"""FOMO's loss: Edge Impulse's weighted cross-entropy over the cells, in the engine's loss form.

Targets are the box centres on the output grid: the cell holding a box's centre is that box's
class, every other cell is background (Edge Impulse's `bbox_to_segmentation`: floor(centre /
cell), one-hot with background first). Two centres in one cell: the higher class id keeps it
(a deterministic scatter-max; Edge Impulse's scatter update keeps one of them unspecified).

The loss is ei_tensorflow constrained_object_detection/models.py `construct_weighted_xent_fn`:
`tf.nn.weighted_cross_entropy_with_logits` on every (cell, channel) of the one-hot map, a
sigmoid cross-entropy per channel, whose positive term is weighted by `object_weight` on the class
channels (100 by default: the docs' "weight object output cells x100 in the loss function") and by 1
on the background channel; Keras averages it over every cell and channel. Here each image's sums
are the raw terms and its cells x channels the normaliser, so the loss is B x that mean, the form
`GlobalLoss` keeps exact under DDP (families/common.PerImageLoss). The two items are the background
channel's share and the class channels' share of the mean.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...tasks.points import box_centroids
from ..base import Targets
from ..common import PerImageLoss


def cell_targets(targets: Targets, channels: int, h: int, w: int, stride: int) -> torch.Tensor:
    """One-hot [B, channels, h, w] float32: the class (+1) of the box centred in each cell, 0
    (background) elsewhere. On the device, batched, no host sync."""
    centre = box_centroids(targets.boxes.float())
    cx = torch.div(centre[..., 0], stride, rounding_mode="floor").long().clamp(0, w - 1)
    cy = torch.div(centre[..., 1], stride, rounding_mode="floor").long().clamp(0, h - 1)
    value = torch.where(targets.valid, targets.labels + 1, 0)  # padding rows scatter 0: no effect
    owner = value.new_zeros(value.shape[0], h * w).scatter_reduce_(1, cy * w + cx, value, "amax")
    ids = torch.arange(channels, device=owner.device).view(1, channels, 1)
    return (owner[:, None] == ids).view(-1, channels, h, w).float()


class FOMOLoss(PerImageLoss):
    """Per-channel sigmoid cross-entropy over the cells, object positives weighted (module docstring)."""

    item_names = ("bg", "obj")

    def __init__(self, object_weight: float = 100.0, stride: int = 8):
        self.object_weight, self.stride = float(object_weight), int(stride)

    def _per_image(self, preds: tuple[torch.Tensor, ...], targets: Targets) -> tuple[torch.Tensor, torch.Tensor]:
        logits = preds[0].float()
        b, k, h, w = logits.shape
        target = cell_targets(targets, k, h, w, self.stride)
        pos_weight = torch.full((k, 1, 1), self.object_weight, device=logits.device)
        pos_weight[0] = 1.0
        bce = F.binary_cross_entropy_with_logits(logits, target, pos_weight=pos_weight, reduction="none")
        raw = torch.stack((bce[:, 0].sum((1, 2)), bce[:, 1:].sum((1, 2, 3))), 1)
        return raw, logits.new_full((b,), float(k * h * w))


def criterion(model: nn.Module, cfg) -> FOMOLoss:
    return FOMOLoss(getattr(cfg, "object_weight", 100.0), model.strides[0])
