"""Query selection of the RT-DETR-style decoders (RT-DETR v1/v2, D-FINE, DEIM): anchor boxes per
encoder cell and the top-k proposals by their best class logit.

Facts (rtdetrv2_pytorch/src/zoo/rtdetr/rtdetrv2_decoder.py and github:Peterande/D-FINE
src/zoo/dfine/dfine_decoder.py, `_generate_anchors` / `_select_topk`, default method):
- anchor of cell (x, y) on level l (h x w): centre ((x + 0.5) / w, (y + 0.5) / h), size
  0.05 * 2^l, in logit space; anchors with any coordinate outside (eps, 1 - eps), eps 0.01, are
  +inf and their memory is zeroed (`valid`);
- the proposals are the k cells with the highest max-over-classes encoder logit.
Built on the device with arange (no host sync), once per set of level shapes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

ANCHOR_SIZE = 0.05  # grid_size
ANCHOR_EPS = 0.01   # eps


class QueryAnchors:
    """(anchor logits [1, S, 4] with +inf where invalid, valid [1, S, 1]) per (shapes, device)."""

    def __init__(self, eps: float = ANCHOR_EPS, size: float = ANCHOR_SIZE):
        self.eps, self.size = eps, size
        self._cache: dict[tuple, tuple[Tensor, Tensor]] = {}

    def __call__(self, shapes: Sequence[tuple[int, int]], memory: Tensor) -> tuple[Tensor, Tensor]:
        """For `memory`'s device. The anchors are float32, as upstream builds them (autocast
        keeps the reference boxes in float32 too), except for a network run in half weights
        without autocast (predict's deploy model): then in memory's dtype, the weights'."""
        device = memory.device
        autocast = torch.amp.is_autocast_available(device.type) and torch.is_autocast_enabled(device.type)
        dtype = torch.float32 if autocast else memory.dtype
        key = (tuple(shapes), device, dtype)
        if key not in self._cache:
            out = []
            for lvl, (h, w) in enumerate(shapes):
                ys, xs = torch.meshgrid(torch.arange(h, device=device, dtype=torch.float32),
                                        torch.arange(w, device=device, dtype=torch.float32), indexing="ij")
                xy = torch.stack(((xs + 0.5) / w, (ys + 0.5) / h), -1).reshape(-1, 2)
                out.append(torch.cat((xy, torch.full_like(xy, self.size * 2.0 ** lvl)), -1))
            a = torch.cat(out).unsqueeze(0)
            valid = ((a > self.eps) & (a < 1 - self.eps)).all(-1, keepdim=True)
            self._cache[key] = (torch.where(valid, torch.log(a / (1 - a)), torch.inf).to(dtype), valid)
        return self._cache[key]


def topk_cells(logits: Tensor, k: int) -> Tensor:
    """Encoder logits [B, S, C] -> indices [B, min(k, S)] of the best cells (max over classes),
    in cell order; a small input has fewer cells than queries.

    Cell order rather than score order: the decoder treats its queries as a set (self-attention
    without positions, per-query heads, matching), so the order changes no result, and a fixed
    order makes two runs comparable query by query whenever they select the same cells (an
    untrained model's near-equal scores put the same cells in another order on another device)."""
    return logits.max(-1).values.topk(min(k, logits.shape[1]), dim=1, sorted=False).indices.sort(dim=1).values


def take(t: Tensor, index: Tensor) -> Tensor:
    """Rows `index [B, K]` of t [B, S, C] -> [B, K, C]."""
    return t.gather(1, index.unsqueeze(-1).expand(-1, -1, t.shape[-1]))
