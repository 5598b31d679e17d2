"""The LingBot-Vision ViT-S/16 backbone: a plain ViT with axial 2D RoPE, 4 register tokens and
LayerScale, pre-norm blocks, attention through torch's `scaled_dot_product_attention`.

Source of every constant: Robbyant/lingbot-vision (Fu et al., arXiv 2607.05247),
`lingbot_vision/vit.py` (`vit_small`: embed 384, depth 12, 6 heads, FFN ratio 4; `init_weights`)
and `lingbot_vision/configs/lbot_vision_vits.yaml`, which the released ViT-S checkpoint is built
from:
- patch 16 (`patch_size: 16`); a 16 x 16 stride-16 convolution with bias embeds the patches;
- 1 CLS token, then 4 register ("storage") tokens, then the patches row-major
  (`num_register_tokens: 4`; the order of `prepare_tokens_with_masks`);
- LayerNorm eps 1e-5 everywhere (`norm_layer: layernormbf16` = `nn.LayerNorm(eps=1e-5)`), one final
  norm over every token (`untie_cls_and_patch_norms: false`);
- attention: fused qkv with query and value biases and no key bias (`qkv_bias: true`,
  `mask_k_bias: true`: the key third of the bias is masked to zero; a key bias only adds a per-query
  constant to the logits, which softmax removes), output projection with bias (`proj_bias: true`);
- MLP: Linear 384 -> 1536, exact GELU, Linear 1536 -> 384, with biases (`ffn_layer: mlp`, `ffn_bias: true`);
- LayerScale on both residual branches, initialised to 1e-5 (`layerscale: 1.0e-05`);
- no drop-path: `build_backbone_from_cfg` builds every released model with `drop_path_rate=0.0`;
- RoPE: rope.py.
Initialisation (`init_weights_vit`): linear weights truncated normal std 0.02, biases 0; CLS and
register tokens normal std 0.02; the patch convolution uniform +-1/sqrt(3 * 16 * 16) (weight and bias).
The pretraining's mask token (`mask_token`) is not part of this network: nothing here masks patches.

The whole forward has static shapes for a static input and no host sync (CUDA-graph capturable).
These are DINOv3's ViT-S/16 settings too (arXiv 2508.10104; facebookresearch/dinov3
`hub/backbones.py` `dinov3_vits16`). timm's DINOv3 port is not used: its RoPE builds the
coordinate grid on the CPU in every forward and copies it to the device, which a CUDA graph
cannot capture.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .rope import rope_tables, rotate

PATCH = 16
EMBED_DIM, DEPTH, HEADS, MLP_RATIO = 384, 12, 6, 4
REGISTERS = 4
LAYERSCALE_INIT = 1e-5
NORM_EPS = 1e-5
INIT_STD = 0.02


class Attention(nn.Module):
    """Multi-head self-attention, queries and keys rotated by the RoPE tables (rope.py; identity
    rows for the CLS and register tokens)."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.q_bias = nn.Parameter(torch.zeros(dim))
        self.v_bias = nn.Parameter(torch.zeros(dim))
        self.register_buffer("k_bias", torch.zeros(dim), persistent=False)  # keys have none (mask_k_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        bias = torch.cat((self.q_bias, self.k_bias, self.v_bias))
        qkv = F.linear(x, self.qkv.weight, bias).view(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k = rotate(qkv[:2], sin, cos).unbind(0)
        out = F.scaled_dot_product_attention(q, k, qkv[2])
        return self.proj(out.transpose(1, 2).reshape(b, n, c))


class LayerScale(nn.Module):
    """x * gamma, gamma per channel (Touvron et al., 2021, CaiT), starting at `init`."""

    def __init__(self, dim: int, init: float):
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class Block(nn.Module):
    """Pre-norm transformer block: x + ls1(attn(norm1(x))), then + ls2(mlp(norm2(x)))."""

    def __init__(self, dim: int, heads: int, mlp_ratio: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=NORM_EPS)
        self.attn = Attention(dim, heads)
        self.ls1 = LayerScale(dim, LAYERSCALE_INIT)
        self.norm2 = nn.LayerNorm(dim, eps=NORM_EPS)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(), nn.Linear(mlp_ratio * dim, dim))
        self.ls2 = LayerScale(dim, LAYERSCALE_INIT)

    def forward(self, x: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
        x = x + self.ls1(self.attn(self.norm1(x), sin, cos))
        return x + self.ls2(self.mlp(self.norm2(x)))


class ViT(nn.Module):
    """Normalised images [B, 3, H, W] (H, W multiples of 16) -> normalised tokens [B, 1 + 4 + h*w, 384]
    (CLS, the registers, then the h x w patches row-major; h = H / 16)."""

    def __init__(self, dim: int = EMBED_DIM, depth: int = DEPTH, heads: int = HEADS,
                 mlp_ratio: int = MLP_RATIO, registers: int = REGISTERS):
        super().__init__()
        self.dim, self.head_dim = dim, dim // heads
        self.prefix = 1 + registers
        self.patch_embed = nn.Conv2d(3, dim, PATCH, stride=PATCH)
        self.cls_token = nn.Parameter(torch.empty(1, 1, dim))
        self.registers = nn.Parameter(torch.empty(1, registers, dim))
        self.blocks = nn.ModuleList(Block(dim, heads, mlp_ratio) for _ in range(depth))
        self.norm = nn.LayerNorm(dim, eps=NORM_EPS)
        self._init_weights()

    def _init_weights(self) -> None:
        nn.init.normal_(self.cls_token, std=INIT_STD)
        nn.init.normal_(self.registers, std=INIT_STD)
        bound = 1 / math.sqrt(self.patch_embed.weight[0].numel())
        nn.init.uniform_(self.patch_embed.weight, -bound, bound)
        nn.init.uniform_(self.patch_embed.bias, -bound, bound)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=INIT_STD)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def prepare_tokens(self, images: torch.Tensor) -> tuple[torch.Tensor, int, int]:
        """(tokens [B, 1 + registers + h*w, dim] before the blocks, h, w)."""
        x = self.patch_embed(images)
        b, _, h, w = x.shape
        x = x.flatten(2).transpose(1, 2)
        return torch.cat((self.cls_token.expand(b, -1, -1), self.registers.expand(b, -1, -1), x), dim=1), h, w

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x, h, w = self.prepare_tokens(images)
        sin, cos = rope_tables(h, w, self.head_dim, self.prefix, x.device)
        for block in self.blocks:
            x = block(x, sin, cos)
        return self.norm(x)
