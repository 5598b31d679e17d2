"""D-FINE's hybrid encoder: RT-DETR's (AIFI on the coarsest level, then a CCFF top-down FPN and
bottom-up PAN) with GELAN blocks and SCDown, as github:Peterande/D-FINE
src/zoo/dfine/hybrid_encoder.py builds it.

- input projection per level: 1x1 conv (no bias) + BN to `hidden`;
- AIFI (one post-norm transformer encoder layer, 8 heads, GELU, dropout 0, 2-D sin-cos position
  embedding on q/k) on level `use_encoder_idx` = the last one;
- top-down: 1x1 lateral conv (no act) on the coarser map, nearest x2 upsample, concat with the
  finer map, RepNCSPELAN4; bottom-up: SCDown (1x1 conv-BN, then depthwise 3x3 s2 conv-BN, no
  acts) on the finer output, concat with the top-down map, RepNCSPELAN4;
- RepNCSPELAN4(c_in, c_out, c3=2*hidden, c4=round(expansion*hidden//2), n=round(3*depth_mult)):
  1x1 to c3, split in halves, two chained branches (CSP of n RepVGG blocks + 3x3 conv), concat
  of both halves and both branch outputs, 1x1 to c_out; SiLU everywhere.
Sizes (configs/dfine/dfine_hgnetv2_{n,s}_coco.yml over include/dfine_hgnetv2.yml):
  n: hidden 128, ffn 512, expansion 0.34, depth_mult 0.5 (two levels, strides 16/32);
  s: hidden 256, ffn 1024, expansion 0.5, depth_mult 0.34 (three levels, strides 8/16/32).
DEIMv2-n builds the same encoder with `fuse_op: sum` (github:Intellindust-AI-Lab/DEIMv2
configs/base/deimv2.yml, kept by deimv2_hgnetv2_n_coco.yml's `version: dfine`): the maps are
added instead of concatenated before each fusion block (`fuse_sum`). Its `csp_type: csp2` CSP
(one 1x1 conv to twice the width, split in two) is this CSPRep's two 1x1 convs in one, the same
parameters and the same function.
EdgeCrafter's ECDet (github:Intellindust-AI-Lab/EdgeCrafter ecdetseg/engine/edgecrafter/
hybrid_encoder.py, configs/ecdet/ecdet.yml) sums too, has no input projections (its ViT adapter
hands over `hidden`-channel maps: `input_proj=False`), runs AIFI's FFN with SiLU (`aifi_act`) and
fuses with DEIM's RepNCSPELAN5 (no 3x3 conv after each CSP branch: `branch_conv=False`).
"""

from __future__ import annotations

import torch
from torch import nn

from ..detr import layers
from ..detr.layers import EncoderLayer
from .blocks import ConvNorm, RepConv


def silu_conv(c_in: int, c_out: int, k: int = 1) -> ConvNorm:
    return ConvNorm(c_in, c_out, k, act=nn.SiLU())


class CSPRep(nn.Module):
    """CSP with n RepVGG blocks on one branch: blocks(1x1(x)) + 1x1(x) (expansion 1, no conv3)."""

    def __init__(self, c_in: int, c_out: int, n: int):
        super().__init__()
        self.conv1 = silu_conv(c_in, c_out)
        self.conv2 = silu_conv(c_in, c_out)
        self.blocks = nn.Sequential(*(RepConv(c_out, c_out) for _ in range(n)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.conv1(x)) + self.conv2(x)


class RepNCSPELAN4(nn.Module):
    """`branch_conv=False`: DEIM's RepNCSPELAN5, each branch the CSP alone (no 3x3 conv after it)."""

    def __init__(self, c_in: int, c_out: int, c3: int, c4: int, n: int, branch_conv: bool = True):
        super().__init__()
        self.half = c3 // 2
        self.cv1 = silu_conv(c_in, c3)
        self.cv2 = nn.Sequential(CSPRep(c3 // 2, c4, n), *([silu_conv(c4, c4, 3)] if branch_conv else []))
        self.cv3 = nn.Sequential(CSPRep(c4, c4, n), *([silu_conv(c4, c4, 3)] if branch_conv else []))
        self.cv4 = silu_conv(c3 + 2 * c4, c_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ys = list(self.cv1(x).split((self.half, self.half), 1))
        ys.append(self.cv2(ys[-1]))
        ys.append(self.cv3(ys[-1]))
        return self.cv4(torch.cat(ys, 1))


class HybridEncoder(layers.HybridEncoder):
    """Backbone maps (coarsest last) -> `len(channels)` maps of `hidden` channels, same strides."""

    def __init__(self, channels: tuple[int, ...], hidden: int, ffn: int, expansion: float,
                 depth_mult: float, heads: int = 8, fuse_sum: bool = False, input_proj: bool = True,
                 aifi_act: type[nn.Module] = nn.GELU, branch_conv: bool = True):
        super().__init__()
        levels = len(channels)
        c4, n = round(expansion * hidden // 2), round(3 * depth_mult)
        self.fuse_sum = fuse_sum
        c_in = hidden if fuse_sum else 2 * hidden
        if not input_proj and any(c != hidden for c in channels):
            raise ValueError("without input projections every level must have `hidden` channels")
        self.input_proj = nn.ModuleList(ConvNorm(c, hidden) if input_proj else nn.Identity() for c in channels)
        self.aifi = EncoderLayer(hidden, heads, ffn, act=aifi_act)  # AIFI: one layer (num_encoder_layers 1)
        self.lateral = nn.ModuleList(ConvNorm(hidden, hidden) for _ in range(levels - 1))
        self.fpn = nn.ModuleList(RepNCSPELAN4(c_in, hidden, 2 * hidden, c4, n, branch_conv) for _ in range(levels - 1))
        self.down = nn.ModuleList(nn.Sequential(ConvNorm(hidden, hidden), ConvNorm(hidden, hidden, 3, 2, g=hidden))
                                  for _ in range(levels - 1))
        self.pan = nn.ModuleList(RepNCSPELAN4(c_in, hidden, 2 * hidden, c4, n, branch_conv) for _ in range(levels - 1))
