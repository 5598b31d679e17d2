"""Axial 2D rotary position embedding (RoPE) of the LingBot-Vision ViT.

Source of every constant: Robbyant/lingbot-vision (Fu et al., "Vision Pretraining for Dense Spatial
Perception", arXiv 2607.05247), `lingbot_vision/layers.py` `RopePositionEmbedding` and
`configs/lbot_vision_vits.yaml` (`pos_embed_rope_base: 100.0`, `normalize_coords: separate`,
`pos_embed_rope_dtype: fp32`); the same scheme and values as DINOv3's ViT-S/16 (Simeoni et al.,
arXiv 2508.10104; facebookresearch/dinov3 `hub/backbones.py` `dinov3_vits16`).

- A patch at grid cell (i, j) of an h x w grid sits at y = 2 (i + 0.5) / h - 1, x = 2 (j + 0.5) / w - 1
  (centred cells, each axis normalised by its own length: "separate").
- A head of dimension D has D / 4 periods per axis, period_k = BASE ** (k / (D / 4)), k = 0..D/4-1
  (upstream writes BASE ** (2k / (D / 2))), and angle 2 pi * coordinate / period_k.
- The D / 2 angles are laid out [y angles, x angles] and repeated twice; channel c is rotated with
  channel c + D / 2 ("rotate half": x * cos + [-x2, x1] * sin).
- Tables and rotation in float32 whatever the autocast dtype (upstream's fp32 RoPE).

Left out: upstream's training-time coordinate augmentation (`pos_embed_rope_rescale_coords: 2`,
a random rescale of every coordinate per forward). It belongs to the self-supervised pretraining;
the dense-prediction protocol this family follows (DINOv3's linear segmentation probe) trains on a
backbone in eval mode, where it is off. Without it the tables depend on the grid size alone and
the captured CUDA graph draws no random numbers.

The tables are built from the grid's shape with device-side `arange` (no host data, no sync), so a
forward at a fixed input size has fixed shapes and is CUDA-graph capturable; the network builds
them once per forward and shares them across its blocks. Their first `prefix` rows are the
identity (sin 0, cos 1): the CLS and register tokens, which have no position, come out unchanged
(exactly: x * 1 + y * 0 = x), and every token goes through one rotation, no slicing per block.
"""

from __future__ import annotations

import math

import torch

BASE = 100.0  # pos_embed_rope_base


def rope_tables(h: int, w: int, head_dim: int, prefix: int = 0, device: torch.device | None = None,
                base: float = BASE) -> tuple[torch.Tensor, torch.Tensor]:
    """(sin, cos), each float32 [prefix + h * w, head_dim]: `prefix` identity rows, then the
    row-major patches of an h x w grid."""
    if head_dim % 4:
        raise ValueError(f"axial RoPE needs a head dimension divisible by 4, got {head_dim}")
    n = head_dim // 4
    f32 = {"device": device, "dtype": torch.float32}
    periods = base ** (torch.arange(n, **f32) / n)
    ys = (torch.arange(h, **f32) + 0.5) / h * 2.0 - 1.0
    xs = (torch.arange(w, **f32) + 0.5) / w * 2.0 - 1.0
    coords = torch.stack(torch.meshgrid(ys, xs, indexing="ij"), dim=-1).reshape(h * w, 2)
    angles = (2 * math.pi * coords[:, :, None] / periods).reshape(h * w, 2 * n).repeat(1, 2)
    angles = torch.cat((torch.zeros(prefix, head_dim, **f32), angles))
    return angles.sin(), angles.cos()


def rotate(x: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
    """x [..., N, D] rotated token by token by the tables' N rows, in float32, returned in x's dtype."""
    y = x if x.dtype == torch.float32 else x.float()
    half = y.shape[-1] // 2
    y = y * cos + torch.cat((-y[..., half:], y[..., :half]), dim=-1) * sin
    return y if x.dtype == torch.float32 else y.to(x.dtype)
