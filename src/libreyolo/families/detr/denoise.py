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

One host sync per call: the max box count K (`valid.sum(1).max()`) fixes D, a shape.
A batch without boxes gets no dn queries (D = 0; the caller skips the dn terms).
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

    @property
    def num_queries(self) -> int:
        return self.labels.shape[1]


def max_boxes(valid: Tensor) -> int:
    """The batch's largest box count: the one host read of the step's denoising."""
    return int(valid.sum(1).max()) if valid.numel() else 0


def denoising_group(labels: Tensor, boxes: Tensor, valid: Tensor, num_classes: int, num_queries: int,
                    class_embed: nn.Embedding, num_denoising: int = NUM_DENOISING,
                    label_noise_ratio: float = LABEL_NOISE_RATIO, box_noise_scale: float = BOX_NOISE_SCALE,
                    generator: torch.Generator | None = None, k: int | None = None) -> DenoiseGroup | None:
    """labels [B, M], boxes [B, M, 4] cxcywh normalised, valid [B, M] -> the dn group, or None when
    the batch has no boxes or num_denoising <= 0. `k` (the max box count) skips the host read when
    the caller already knows it."""
    if num_denoising <= 0:
        return None
    k = max_boxes(valid) if k is None else k  # host sync (documented above)
    if k == 0:
        return None
    b, device = labels.shape[0], labels.device
    groups = max(num_denoising // k, 1)
    d = 2 * k * groups

    # The valid rows first (stable, so in their order), then the first K columns.
    order = torch.sort((~valid).to(torch.uint8), dim=1, stable=True).indices[:, :k]  # [B, K]
    slot_valid = valid.gather(1, order)
    slot_labels = torch.where(slot_valid, labels.gather(1, order), num_classes)
    slot_boxes = torch.where(slot_valid.unsqueeze(-1), boxes.gather(1, order.unsqueeze(-1).expand(-1, -1, 4)), 0.0)

    idx = torch.arange(d, device=device)
    r = idx % (2 * k)  # position inside the group
    negative, j = r >= k, r % k                                      # [D]
    q_valid = slot_valid[:, j]                                       # [B, D]
    q_labels = slot_labels[:, j]
    q_boxes = slot_boxes[:, j].float()                               # [B, D, 4]

    def rand(*shape):
        return torch.rand(*shape, generator=generator, device=device)

    if label_noise_ratio > 0:
        flip = (rand(b, d) < label_noise_ratio * 0.5) & q_valid
        new = torch.randint(0, num_classes, (b, d), generator=generator, device=device)
        q_labels = torch.where(flip, new, q_labels)
    if box_noise_scale > 0:
        xyxy = cxcywh_to_xyxy(q_boxes)
        diff = (q_boxes[..., 2:] * 0.5).repeat(1, 1, 2) * box_noise_scale
        sign = torch.randint(0, 2, (b, d, 4), generator=generator, device=device).float() * 2 - 1
        part = rand(b, d, 4) + negative.view(1, d, 1).float()       # U[0,1) pos, U[1,2) neg
        q_boxes = xyxy_to_cxcywh((xyxy + sign * part * diff).clamp(0.0, 1.0))
    boxes_unact = inverse_sigmoid(q_boxes)

    target = torch.where(q_valid & ~negative, order[:, j], -1)
    # Blocked: a dn key for every matching query, and for a dn query every other group's keys.
    qi = torch.arange(d + num_queries, device=device)
    g = torch.where(qi < d, qi // (2 * k), -1)
    attn_mask = (qi.unsqueeze(0) < d) & ((qi.unsqueeze(1) >= d) | (g.unsqueeze(1) != g.unsqueeze(0)))
    return DenoiseGroup(q_labels, class_embed(q_labels), boxes_unact, attn_mask, target,
                        torch.full((b,), float(groups), device=device), negative)


def keep_in_graph(x: Tensor, class_embed: nn.Embedding) -> Tensor:
    """`x` plus an exact 0 taken from the denoising embedding, for a training step without
    denoising (a batch without boxes): the embedding still receives a (zero) gradient. DDP
    (engine/distributed.py, no find_unused_parameters) needs every parameter in every step's
    backward, and a rank whose share of the batch has no boxes would otherwise leave it out."""
    return x + class_embed.weight[:0].sum().to(x.dtype)
