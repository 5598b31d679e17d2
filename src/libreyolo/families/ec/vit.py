"""EdgeCrafter's ECViT backbone and the adapter that makes three DETR levels of it.

Facts from github:Intellindust-AI-Lab/EdgeCrafter ecdetseg/engine/edgecrafter/ecvit.py and
configs/ecdet/ecdet_{s,m}.yml (paper: Liu et al., "EdgeCrafter: Compact ViTs for Edge Dense
Prediction via Task-Specialized Distillation", arXiv 2603.18739):
- ECViT-T (ECDet-S): width 192, 3 heads; ECViT-T+ (ECDet-M): width 256, 4 heads; both 12
  pre-norm blocks (LayerNorm eps 1e-6, fused qkv with bias, exact-GELU MLP of ratio 4, no
  LayerScale, no drop-path, no final norm);
- patch embedding of stride 16 as a conv pyramid: three 3x3 stride-2 conv-BN-ReLU (width / 8,
  / 4, / 2), then a 3x3 stride-2 conv with bias to the width;
- one learned token before the patches (`register_token`, no position), DINOv3's axial 2D RoPE
  on the patch tokens only (base 100, coordinates normalised per axis: lingbot/rope.py, the
  same scheme);
- init: linear weights truncated normal std 0.02 and zero biases, the token std 0.02.
The adapter (ViTAdapter, `interaction_indexes: [10, 11]`): the patch tokens of blocks 10 and 11
averaged, laid out as a stride-16 map and resized bilinearly (align_corners False) to strides
8, 16 and 32; with `proj_dim` unset only the stride-32 map goes through a 1x1 conv-BN.
Released weights (ECViT distilled for detection): `ecvitt.pth`, `ecvittplus.pth` (weights.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..dfine.blocks import ConvNorm
from ..lingbot.rope import rope_tables, rotate

PATCH = 16
DEPTH, MLP_RATIO, NORM_EPS, INIT_STD = 12, 4, 1e-6, 0.02
RETURN_BLOCKS = (10, 11)  # interaction_indexes


class PatchEmbed(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        widths = (dim // 8, dim // 4, dim // 2)
        self.convs = nn.ModuleList(ConvNorm(a, b, 3, 2, act=nn.ReLU()) for a, b in zip((3, *widths[:-1]), widths))
        self.proj = nn.Conv2d(widths[-1], dim, 3, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv in self.convs:
            x = conv(x)
        return self.proj(x)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(x).view(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k = rotate(qkv[:2], sin, cos).unbind(0)
        out = F.scaled_dot_product_attention(q, k, qkv[2])
        return self.proj(out.transpose(1, 2).reshape(b, n, c))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=NORM_EPS)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=NORM_EPS)
        self.mlp = Mlp(dim, MLP_RATIO * dim)

    def forward(self, x: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), sin, cos)
        return x + self.mlp(self.norm2(x))


class ECViT(nn.Module):
    """Images [B, 3, H, W] (ImageNet-normalised; H, W multiples of 16) -> the patch tokens of the
    `RETURN_BLOCKS`, each [B, h * w, dim] (h = H / 16), and (h, w)."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.head_dim = dim // heads
        self.patch_embed = PatchEmbed(dim)
        self.register_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(DEPTH))
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=INIT_STD)
                nn.init.zeros_(m.bias)
        nn.init.trunc_normal_(self.register_token, std=INIT_STD)

    def forward(self, images: torch.Tensor) -> tuple[list[torch.Tensor], int, int]:
        x = self.patch_embed(images)
        b, _, h, w = x.shape
        x = torch.cat((self.register_token.expand(b, -1, -1), x.flatten(2).transpose(1, 2)), 1)
        sin, cos = rope_tables(h, w, self.head_dim, 1, x.device)  # the token's row: the identity
        outs = []
        for i, block in enumerate(self.blocks):
            x = block(x, sin, cos)
            if i in RETURN_BLOCKS:
                outs.append(x[:, 1:])
        return outs, h, w


class ViTAdapter(nn.Module):
    """ImageNet-normalised images -> three maps of `dim` channels at strides 8, 16, 32."""

    strides = (8, 16, 32)

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.vit = ECViT(dim, heads)
        self.projector = ConvNorm(dim, dim)

    def forward(self, images: torch.Tensor) -> list[torch.Tensor]:
        tokens, h, w = self.vit(images)
        fused = torch.stack(tokens).mean(0).transpose(1, 2).reshape(images.shape[0], -1, h, w)
        fine = F.interpolate(fused, size=(2 * h, 2 * w), mode="bilinear", align_corners=False)
        coarse = F.interpolate(fused, size=(h // 2, w // 2), mode="bilinear", align_corners=False)
        return [fine, fused, self.projector(coarse)]  # stride 16: the same size, upstream's resize is exact
