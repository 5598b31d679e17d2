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

How it is computed. The loss runs eagerly after the graphed network, and on CUDA each operator is
one kernel launch on small maps, so it is written for few operators. With logit x, target t and
positive weight p, a term is p t softplus(-x) + (1 - t) softplus(x); softplus(-x) = softplus(x) - x,
so it is softplus(x) b + x a with b = 1 + (p - 1) t and a = -p t, and its derivative is
sigmoid(x) b + a. The one-hot map has one positive channel per cell (its owner), so (b, a) over the
channels is a row of a [K, 2K] table indexed by the owner: one lookup stands in for the one-hot map
and the weights. The cross-entropy is one autograd function whose backward is that closed-form
derivative (one node instead of one per operator), and the loss's normaliser is a host constant.
For a large positive logit in its owner channel, softplus(x) - x (which tends to 0) is exact to
about one ulp of x, absolutely; the loss and its gradient match
`binary_cross_entropy_with_logits` with a pos_weight tensor to 1e-6 relative (tests/unit/test_fomo.py).
CPU aten operators per call, that formulation -> this one (benchmarks/loss_ops.py, fomo-035,
batch 8, 96 px; kernels: the operators that would each launch one on CUDA, views and allocations
left out): forward 39 -> 18 kernels, backward 15 -> 6 kernels and 10 -> 4 autograd nodes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from ..base import Targets
from ..common import PerImageLoss


def cell_owners(targets: Targets, h: int, w: int, stride: int, bounds: torch.Tensor) -> torch.Tensor:
    """[B, h, w] int64: the class (+1) of the box centred in each cell, 0 (background) elsewhere.
    `bounds` is [[0, 0], [w - 1, h - 1]] (float32, on the targets' device). On the device, batched,
    no host sync."""
    # floor(centre / stride) with the centre (x1 + x2) / 2 (families.points.box_centroids) folded into
    # the divisor: halving is exact in floating point, so the cells are the same.
    boxes = targets.boxes.float()
    cell = torch.div(boxes[..., :2] + boxes[..., 2:], 2 * stride, rounding_mode="floor")
    cell = torch.clamp(cell, bounds[0], bounds[1])
    index = torch.add(cell[..., 0], cell[..., 1], alpha=w).long()  # y * w + x, exact below 2^24 cells
    value = torch.addcmul(targets.valid, targets.labels, targets.valid)  # valid (labels + 1): padding scatters 0
    return value.new_zeros(value.shape[0], h * w).scatter_reduce_(1, index, value, "amax").view(-1, h, w)


class _CellXent(torch.autograd.Function):
    """Per image, the weighted sigmoid cross-entropy summed over the cells: [B, 2] (background
    channel, class channels) from logits [B, K, h, w] (any memory format) and each cell's (b, a)
    row [B, h, w, 2K] (module docstring). Backward: the closed-form derivative sigmoid(x) b + a."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        b, a = rows.permute(0, 3, 1, 2).split(x.shape[1], 1)  # [B, K, h, w] views
        term = torch.addcmul(F.softplus(x) * b, x, a)
        ctx.save_for_backward(x, b, a)
        raw = x.new_empty(x.shape[0], 2)
        torch.sum(term[:, 0], (1, 2), out=raw[:, 0])
        torch.sum(term[:, 1:], (1, 2, 3), out=raw[:, 1])
        return raw

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        x, b, a = ctx.saved_tensors
        per_channel = torch.cat((grad[:, :1], grad[:, 1:].expand(-1, x.shape[1] - 1)), 1)
        grad_x = torch.addcmul(a, torch.sigmoid(x), b, out=torch.empty_like(x))  # x's memory format
        return grad_x.mul_(per_channel[..., None, None]), None


def weight_rows(channels: int, object_weight: float, device, dtype) -> torch.Tensor:
    """[K, 2K]: row o is (b, a) over the channels for a cell owned by o (0 background, else class
    + 1): b = 1 + (p - 1) t, a = -p t, with t the one-hot of o and p = 1 on background, else
    `object_weight`."""
    onehot = torch.eye(channels, device=device, dtype=dtype)
    p = torch.full((channels,), object_weight, device=device, dtype=dtype)
    p[0] = 1.0
    return torch.cat((1 + onehot * (p - 1), -onehot * p), 1)


class FOMOLoss(PerImageLoss):
    """Per-channel sigmoid cross-entropy over the cells, object positives weighted (module docstring)."""

    item_names = ("bg", "obj")

    def __init__(self, object_weight: float = 100.0, stride: int = 8):
        self.object_weight, self.stride = float(object_weight), int(stride)
        self._rows: dict = {}    # (device, dtype, K) -> weight_rows
        self._bounds: dict = {}  # (device, h, w) -> cell_owners' bounds

    def __call__(self, preds: tuple[torch.Tensor, ...], targets: Targets) -> tuple[torch.Tensor, torch.Tensor]:
        """PerImageLoss's loss and items; the normaliser, every cell and channel of the batch, is
        known on the host, so it costs no operators."""
        b, k, h, w = preds[0].shape
        n = float(max(b * k * h * w, 1))
        with torch.autocast(preds[0].device.type, enabled=False):
            sums = self._raw(preds, targets).sum(0)
        return sums.sum() * (b / n), sums.detach() / n

    def _per_image(self, preds: tuple[torch.Tensor, ...], targets: Targets) -> tuple[torch.Tensor, torch.Tensor]:
        b, k, h, w = preds[0].shape
        raw = self._raw(preds, targets)
        return raw, raw.new_full((b,), float(k * h * w))

    def _raw(self, preds: tuple[torch.Tensor, ...], targets: Targets) -> torch.Tensor:
        logits = preds[0].float()
        b, k, h, w = logits.shape
        dev = logits.device
        if (dev, h, w) not in self._bounds:  # filled on the device: no copy from the host, no sync
            bounds = torch.zeros(2, 2, device=dev)
            bounds[1, 0], bounds[1, 1] = w - 1, h - 1
            self._bounds[dev, h, w] = bounds
        if (dev, logits.dtype, k) not in self._rows:
            self._rows[dev, logits.dtype, k] = weight_rows(k, self.object_weight, dev, logits.dtype)
        owners = cell_owners(targets, h, w, self.stride, self._bounds[dev, h, w])
        return _CellXent.apply(logits, F.embedding(owners, self._rows[dev, logits.dtype, k]))


def criterion(model: nn.Module, cfg) -> FOMOLoss:
    return FOMOLoss(getattr(cfg, "object_weight", 100.0), model.strides[0])
