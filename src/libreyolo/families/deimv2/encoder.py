"""DEIMv2's LiteEncoder: the two-level encoder of its ultra-light sizes (Atto, Femto, Pico).

Facts from github:Intellindust-AI-Lab/DEIMv2 engine/deim/lite_encoder.py and
configs/deimv2/deimv2_hgnetv2_{atto,femto,pico}_coco.yml (hidden 64 / 96 / 112, expansion 0.34,
depth_mult 0.5, SiLU):
- one backbone map (stride 16) projected to `hidden` (1x1 conv, no bias, + BN, no activation);
- the stride-32 level is made from it: 3x3 average pool (stride 2, padding 1) -> 1x1 conv -> BN
  -> SiLU; then "GAP fusion": its global average added to it, through a 1x1 conv-BN-SiLU;
- one top-down step (the stride-16 map plus the nearest-upsampled stride-32 one, a GELAN block)
  and one bottom-up step (the stride-32 map plus a second avg-pool downsample of that output,
  a GELAN block), both sums: no transformer layer (no AIFI) and no lateral conv.
- GELAN block: D-FINE's RepNCSPELAN4 (hidden -> hidden, c3 = 2 hidden,
  c4 = round(expansion * hidden // 2), round(3 * depth_mult) RepVGG blocks per CSP).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..dfine.blocks import ConvNorm
from ..dfine.encoder import RepNCSPELAN4, silu_conv


def downsample(hidden: int) -> nn.Sequential:
    return nn.Sequential(nn.AvgPool2d(3, 2, 1), silu_conv(hidden, hidden))


class LiteEncoder(nn.Module):
    """One backbone map [B, c, H/16, W/16] -> two maps of `hidden` channels (strides 16, 32)."""

    def __init__(self, channels: int, hidden: int, expansion: float, depth_mult: float):
        super().__init__()
        c4, n = round(expansion * hidden // 2), round(3 * depth_mult)
        self.input_proj = ConvNorm(channels, hidden)
        self.down1 = downsample(hidden)
        self.down2 = downsample(hidden)
        self.gap_fusion = silu_conv(hidden, hidden)
        self.fpn = RepNCSPELAN4(hidden, hidden, 2 * hidden, c4, n)
        self.pan = RepNCSPELAN4(hidden, hidden, 2 * hidden, c4, n)

    def forward(self, feats: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        fine = self.input_proj(feats[0])
        coarse = self.down1(fine)
        coarse = self.gap_fusion(coarse + coarse.mean((2, 3), keepdim=True))
        fine = self.fpn(fine + F.interpolate(coarse, scale_factor=2.0, mode="nearest"))
        return fine, self.pan(coarse + self.down2(fine))
