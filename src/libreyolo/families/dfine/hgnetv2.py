"""HGNetv2 backbone (PP-HGNetV2, PaddleDetection; as D-FINE uses it), trained from scratch.

Facts from github:Peterande/D-FINE src/nn/backbone/hgnetv2.py and configs/dfine/*.yml:
- D-FINE n and s both use arch "B0" (dfine_hgnetv2_n_coco.yml / _s_coco.yml `name: 'B0'`;
  B2 is the m size), `use_lab: True`, `freeze_at: -1`, `freeze_norm: False` (nothing frozen).
  Upstream loads ImageNet "stage1" weights (`pretrained: True`); LibreYOLO has none and trains
  the backbone from scratch.
- Stem: 3x3 s2 -> {2x2 -> 2x2 (each after a right/bottom pad of 1), 2x2 s1 max-pool} concat
  -> 3x3 s2 -> 1x1: stride 4.
- Four stages (strides 4, 8, 16, 32). Each: optional depthwise 3x3 s2 downsample (no act), then
  HG blocks: `layers` convs in a chain (plain 3x3, or "light" = 1x1 without act + depthwise kxk),
  the input and every conv output concatenated, then aggregated by two 1x1 convs (squeeze to
  out/2, excite to out: upstream's HG_Stage passes its default `agg="se"`, so the ESE
  attention branch of HG_Block is not used), with a residual on every block but the first.
- Returned stages: n [2, 3] (strides 16, 32: 512, 1024 channels), s [1, 2, 3] (256, 512, 1024).
- DEIMv2's ultra-light sizes (github:Intellindust-AI-Lab/DEIMv2 engine/backbone/hgnetv2.py,
  configs/deimv2/deimv2_hgnetv2_{atto,femto,pico}_coco.yml) cut B0 to its first three stages and
  return the third (stride 16): Atto with a 3x3 light stage of 256 channels, Femto with B0's 5x5
  stage of 512 channels and one block, Pico with B0's third stage unchanged (two blocks).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .blocks import hg_conv

# arch -> (stem (mid, out), stages (in, mid, out, blocks, downsample, light, kernel, layers)).
ARCHS = {
    "B0": ((16, 16), ((16, 16, 64, 1, False, False, 3, 3),
                      (64, 32, 256, 1, True, False, 3, 3),
                      (256, 64, 512, 2, True, True, 5, 3),
                      (512, 128, 1024, 1, True, True, 5, 3))),
    "Atto": ((16, 16), ((16, 16, 64, 1, False, False, 3, 3),
                        (64, 32, 256, 1, True, False, 3, 3),
                        (256, 64, 256, 1, True, True, 3, 3))),
    "Femto": ((16, 16), ((16, 16, 64, 1, False, False, 3, 3),
                         (64, 32, 256, 1, True, False, 3, 3),
                         (256, 64, 512, 1, True, True, 5, 3))),
    "Pico": ((16, 16), ((16, 16, 64, 1, False, False, 3, 3),
                        (64, 32, 256, 1, True, False, 3, 3),
                        (256, 64, 512, 2, True, True, 5, 3))),
}


class Stem(nn.Module):
    def __init__(self, mid: int, out: int):
        super().__init__()
        self.stem1 = hg_conv(3, mid, 3, 2)
        self.stem2a = hg_conv(mid, mid // 2, 2, pad=0)
        self.stem2b = hg_conv(mid // 2, mid, 2, pad=0)
        self.stem3 = hg_conv(mid * 2, mid, 3, 2)
        self.stem4 = hg_conv(mid, out, 1)
        self.pool = nn.MaxPool2d(2, 1, ceil_mode=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.pad(self.stem1(x), (0, 1, 0, 1))
        branch = self.stem2b(F.pad(self.stem2a(x), (0, 1, 0, 1)))
        return self.stem4(self.stem3(torch.cat((self.pool(x), branch), 1)))


class HGBlock(nn.Module):
    def __init__(self, c_in: int, mid: int, out: int, layers: int, k: int, light: bool, residual: bool):
        super().__init__()
        self.residual = residual
        self.layers = nn.ModuleList()
        for i in range(layers):
            c = c_in if i == 0 else mid
            self.layers.append(nn.Sequential(hg_conv(c, mid, 1, act=False), hg_conv(mid, mid, k, g=mid))
                               if light else hg_conv(c, mid, k))
        self.squeeze = hg_conv(c_in + layers * mid, out // 2, 1)
        self.excite = hg_conv(out // 2, out, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = [x]
        for layer in self.layers:
            outs.append(layer(outs[-1]))
        y = self.excite(self.squeeze(torch.cat(outs, 1)))
        return y + x if self.residual else y


class HGStage(nn.Sequential):
    def __init__(self, c_in: int, mid: int, out: int, blocks: int, downsample: bool, light: bool,
                 k: int, layers: int):
        mods: list[nn.Module] = [hg_conv(c_in, c_in, 3, 2, g=c_in, act=False)] if downsample else []
        mods += [HGBlock(c_in if i == 0 else out, mid, out, layers, k, light, i > 0) for i in range(blocks)]
        super().__init__(*mods)


class HGNetv2(nn.Module):
    """images [B, 3, H, W] -> the feature maps of the stages in `return_idx`."""

    def __init__(self, arch: str, return_idx: tuple[int, ...]):
        super().__init__()
        (mid, out), stages = ARCHS[arch]
        self.stem = Stem(mid, out)
        self.stages = nn.ModuleList(HGStage(*cfg) for cfg in stages)
        self.return_idx = tuple(return_idx)
        self.channels = tuple(stages[i][2] for i in self.return_idx)
        self.strides = tuple(4 * 2 ** i for i in self.return_idx)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = self.stem(x)
        outs = []
        for i, stage in enumerate(self.stages):
            x = stage(x)
            if i in self.return_idx:
                outs.append(x)
        return outs
