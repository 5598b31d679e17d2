"""Contrastive denoising groups (RT-DETR, Lv et al., 2023; after DINO's CDN), vectorised.

Facts from rtdetrv2_pytorch/src/zoo/rtdetr/denoising.py get_contrastive_denoising_training_group
(num_denoising 100, label_noise_ratio 0.5, box_noise_scale 1.0 in the r18 configs):
- K = the most boxes any image of the batch has; G = max(num_denoising // K, 1) groups;
  D = 2 K G dn queries laid out group after group, each group K positives then K negatives,
  slot j of either half copying the image's j-th box (slots past the image's count: padding,
  class id `num_classes` (the embedding's padding_idx) and a zero box).
- Label noise: with probability label_noise_ratio / 2 a real slot (positive or negative) takes a
  uniformly random class (which may be its own).
- Box noise on the xyxy corners: + sign * u * (w/2, h/2, w/2, h/2) * box_noise_scale, sign = +-1,
  u ~ U[0, 1) for positives and U[1, 2) for negatives (negatives always further off), clipped to
  [0, 1], back to cxcywh, then inverse_sigmoid (the decoder refines in logit space).
- Attention mask [D + Q, D + Q], True = blocked: the matching queries see no dn query, a dn
  query sees its own group and every matching query.
- The dn loss pairs positive slot j of every group with target j, divided by the group count.

Here no Python loop over images or groups: slot -> (group, half, j) is index arithmetic on one
arange(D) and the mask is one broadcast comparison. Valid rows need not be packed at the front
of the padded targets: they are stably sorted there first, and `target` indexes the original M.

Two ways to size D:
- by default, upstream's: the max box count K, read on the host (`valid.sum(1).max()`, the
  call's one sync), fixes D = 2 K G. A batch without boxes gets no dn queries (None; the caller
  skips the dn terms).
- `static=True` (a model's `static_shapes`, which cuda_graph=full sets): D follows the targets'
  padded width M alone, D = 2 max(N, M) with N = num_denoising, the most any K <= M lays out
  (K max(N // K, 1) <= max(N, K)). K and G stay on the device, the layout is the same
  arithmetic on tensors, and the slots past 2 K G are *dead*: `live` is False there, every query
  is blocked from them as keys in the attention mask, and the loss leaves them out (the
  criterion's `keep`). So the live queries see and compute exactly what the default's D queries
  do, and no shape depends on the data: a CUDA graph can replay it. A batch without boxes gets
  D dead slots instead of None.
The noise is drawn for 2 max(N, K) slots by default (so padding the targets changes nothing) and
2 max(N, M) under `static`, each keeping its first D: both give the same numbers from the same
generator state where max(N, K) = max(N, M), as when K and M are both <= N.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from .boxes import cxcywh_to_xyxy, inverse_sigmoid, xyxy_to_cxcywh

NUM_DENOISING = 100      # configs/rtdetrv2/include/rtdetrv2_r50vd.yml RTDETRTransformerv2
LABEL_NOISE_RATIO = 0.5  # idem
BOX_NOISE_SCALE = 1.0    # idem


class DenoiseGroup(NamedTuple):
    labels: Tensor      # [B, D] long, noised class ids (num_classes = padding)
    queries: Tensor     # [B, D, hidden] class_embed(labels), the dn content queries
    boxes_unact: Tensor  # [B, D, 4] inverse_sigmoid of the noised cxcywh boxes
    attn_mask: Tensor   # [D + Q, D + Q] bool, True = blocked
    target: Tensor      # [B, D] long, target index a positive reconstructs; -1 elsewhere
    groups: Tensor      # [B] float, the group count G
    negative: Tensor    # [D] bool, the negative half of every group
    live: Tensor        # [D] bool, False on the dead slots past 2 K G (static=True only)

    @property
    def num_queries(self) -> int:
        return self.labels.shape[1]


def max_boxes(valid: Tensor) -> int:
    """The batch's largest box count: the one host read of the default's denoising."""
    return int(valid.sum(1).max()) if valid.numel() else 0


def denoising_group(labels: Tensor, boxes: Tensor, valid: Tensor, num_classes: int, num_queries: int,
                    class_embed: nn.Embedding, num_denoising: int = NUM_DENOISING,
                    label_noise_ratio: float = LABEL_NOISE_RATIO, box_noise_scale: float = BOX_NOISE_SCALE,
                    generator: torch.Generator | None = None, k: int | None = None,
                    static: bool = False) -> DenoiseGroup | None:
    """labels [B, M], boxes [B, M, 4] cxcywh normalised, valid [B, M] -> the dn group, or None when
    num_denoising <= 0 or (without `static`) the batch has no boxes. `k` (the max box count) skips
    the host read when the caller already knows it; `static` sizes D by M (module docstring)."""
    if num_denoising <= 0:
        return None
    b, m = valid.shape
    device = labels.device
    if static:
        counts = valid.sum(1)
        k_live = counts.amax() if b else counts.new_zeros(())  # K on the device; 0: every slot dead
        k_t = k_live.clamp(min=1)
        groups = (num_denoising // k_t).clamp(min=1)
        d = drawn = 2 * max(num_denoising, m)  # the noise's slots, and D
    else:
        k = max_boxes(valid) if k is None else k  # host sync (module docstring)
        if k == 0:
            return None
        groups = max(num_denoising // k, 1)
        d = 2 * k * groups
        drawn = 2 * max(num_denoising, k)  # the noise's slots: the most D any K' <= max(N, K) lays out
        k_t = k_live = k

    # The valid rows first (stable, so in their order); slot j of a group copies column j < K.
    order = torch.sort((~valid).to(torch.uint8), dim=1, stable=True).indices  # [B, M]
    slot_valid = valid.gather(1, order)
    slot_labels = torch.where(slot_valid, labels.gather(1, order), num_classes)
    slot_boxes = torch.where(slot_valid.unsqueeze(-1), boxes.gather(1, order.unsqueeze(-1).expand(-1, -1, 4)), 0.0)

    idx = torch.arange(d, device=device)
    r = idx % (2 * k_t)  # position inside the group
    negative, j = r >= k_t, r % k_t                                  # [D]
    live = idx < 2 * k_live * groups                                 # [D]; all True by default
    q_valid = slot_valid[:, j] & live                                # [B, D]
    q_labels = slot_labels[:, j]
    q_boxes = slot_boxes[:, j].float()                               # [B, D, 4]

    def rand(*shape):
        return torch.rand(b, drawn, *shape, generator=generator, device=device)[:, :d]

    if label_noise_ratio > 0:
        flip = (rand() < label_noise_ratio * 0.5) & q_valid
        new = torch.randint(0, num_classes, (b, drawn), generator=generator, device=device)[:, :d]
        q_labels = torch.where(flip, new, q_labels)
    if box_noise_scale > 0:
        xyxy = cxcywh_to_xyxy(q_boxes)
        diff = (q_boxes[..., 2:] * 0.5).repeat(1, 1, 2) * box_noise_scale
        sign = torch.randint(0, 2, (b, drawn, 4), generator=generator, device=device)[:, :d].float() * 2 - 1
        part = rand(4) + negative.view(1, d, 1).float()              # U[0,1) pos, U[1,2) neg
        q_boxes = xyxy_to_cxcywh((xyxy + sign * part * diff).clamp(0.0, 1.0))
    boxes_unact = inverse_sigmoid(q_boxes)

    target = torch.where(q_valid & ~negative, order.gather(1, j.expand(b, -1)), -1)
    # Blocked: a dn key for every matching query, for a dn query every other group's keys, and a
    # dead slot's key for everyone (a dead query still sees the matching queries: no empty row).
    qi = torch.arange(d + num_queries, device=device)
    dn_key = qi < d
    g = torch.where(dn_key, qi // (2 * k_t), -1)
    dead_key = dn_key & ~torch.cat((live, live.new_ones(num_queries)))
    attn_mask = (dn_key.unsqueeze(0) & ((qi.unsqueeze(1) >= d) | (g.unsqueeze(1) != g.unsqueeze(0)))) \
        | dead_key.unsqueeze(0)
    groups_b = (groups.float() if static else torch.full((), float(groups), device=device)).expand(b).clone()
    return DenoiseGroup(q_labels, class_embed(q_labels), boxes_unact, attn_mask, target, groups_b, negative, live)


def keep_in_graph(x: Tensor, class_embed: nn.Embedding) -> Tensor:
    """`x` plus an exact 0 taken from the denoising embedding, for a training step without
    denoising (a batch without boxes): the embedding still receives a (zero) gradient. DDP
    (engine/distributed.py, no find_unused_parameters) needs every parameter in every step's
    backward, and a rank whose share of the batch has no boxes would otherwise leave it out."""
    return x + class_embed.weight[:0].sum().to(x.dtype)
