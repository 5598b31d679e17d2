"""RTMDet network: CSPNeXt backbone + CSPNeXt-PAFPN + shared-conv, separate-BN head.

Written from the RTMDet paper (Lyu et al., arXiv 2212.07784, section 3.1 and figure 2) with the
widths and depths of the public mmdetection configs `rtmdet_{tiny,s,m,l,x}_8xb32-300e_coco`
(CSPNeXt "P5" arch scaled by deepen/widen factors).

Blocks:
- CSPNeXtBlock: 3x3 conv, then a 5x5 depthwise-separable conv (the paper's large-kernel
  depthwise conv: 5x5 depthwise + 1x1 pointwise), with a residual in the backbone.
- CSPLayer: CSP split into a 1x1 main branch through the blocks and a 1x1 short branch, concat,
  (backbone only) channel attention = global average pool -> 1x1 conv -> hard sigmoid, then 1x1.
- SPP bottleneck on the last backbone stage: 1x1, parallel 5/9/13 max-pools, concat, 1x1.
- Head: per level, two stacked 3x3 ConvBNAct for classification and two for regression. The conv
  weights are SHARED across levels while each level keeps its own BatchNorm (features of
  different strides have different statistics, paper section 3.1); the 1x1 predictors are per
  level. Box output: 4 distances (l, t, r, b) from the prior point, no DFL; m/l/x exponentiate
  them (`exp_on_reg`), tiny/s use them linearly, both multiplied by the stride.
Priors are the cell corners (mmdet's MlvlPointGenerator with offset 0), in input pixels.

Size figures (README of mmdetection configs/rtmdet, 640 px, 80 classes): tiny 4.8M / 8.1G,
s 8.89M / 14.8G, m 24.71M / 39.27G, l 52.3M / 80.23G, x 94.86M / 141.67G. Those "FLOPs" come
from mmengine's get_model_complexity_info, which counts one multiply-add as one FLOP (plus a
few BatchNorm ops), i.e. they are MACs. Measured here (MACs = FlopCounterMode / 2, convs only;
the shared head convs count once as parameters and once per level as compute): tiny 4.896M
8.04G, s 8.887M 14.76G, m 24.709M 39.07G, l 52.316M 79.90G, x 94.856M 141.19G.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..common import (
    BN_EPS,
    BN_MOMENTUM,
    AnchorCache,
    ConvBNAct,
    YOLOStyleModel,
    build_model,
    flatten_levels,
)

STRIDES = (8, 16, 32)
# CSPNeXt "P5": (in, out, blocks, residual, spp) per stage before scaling (mmdet cspnext.py).
P5 = ((64, 128, 3, True, False), (128, 256, 6, True, False), (256, 512, 6, True, False),
      (512, 1024, 3, False, True))


@dataclass(frozen=True)
class Arch:
    deepen: float
    widen: float
    exp_on_reg: bool  # m, l, x predict log-distances; tiny and s plain distances (their configs)


ARCHS: dict[str, Arch] = {
    "t": Arch(0.167, 0.375, False),
    "s": Arch(0.33, 0.5, False),
    "m": Arch(0.67, 0.75, True),
    "l": Arch(1.0, 1.0, True),
    "x": Arch(1.33, 1.25, True),
}


class ChannelAttention(nn.Module):
    """x * hardsigmoid(conv1x1(mean over H, W)): reweights channels after the CSP concat."""

    def __init__(self, c: int):
        super().__init__()
        self.fc = nn.Conv2d(c, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * F.hardsigmoid(self.fc(x.mean((2, 3), keepdim=True)))


class CSPNeXtBlock(nn.Module):
    def __init__(self, c: int, residual: bool):
        super().__init__()
        self.conv1 = ConvBNAct(c, c, 3)
        self.dw = ConvBNAct(c, c, 5, g=c)  # the large-kernel depthwise conv
        self.pw = ConvBNAct(c, c, 1)
        self.residual = residual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.pw(self.dw(self.conv1(x)))
        return x + y if self.residual else y


class CSPLayer(nn.Module):
    def __init__(self, c_in: int, c_out: int, n: int, residual: bool, attention: bool):
        super().__init__()
        mid = int(c_out * 0.5)
        self.main = ConvBNAct(c_in, mid)
        self.short = ConvBNAct(c_in, mid)
        self.blocks = nn.Sequential(*(CSPNeXtBlock(mid, residual) for _ in range(n)))
        self.attention = ChannelAttention(2 * mid) if attention else nn.Identity()
        self.final = ConvBNAct(2 * mid, c_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.cat((self.blocks(self.main(x)), self.short(x)), 1)
        return self.final(self.attention(y))


class SPPBottleneck(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.cv1 = ConvBNAct(c, c // 2)
        self.cv2 = ConvBNAct(c // 2 * 4, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.cv1(x)
        return self.cv2(torch.cat([x] + [F.max_pool2d(x, k, 1, k // 2) for k in (5, 9, 13)], 1))


class CSPNeXt(nn.Module):
    """images -> (C3, C4, C5) at strides 8, 16, 32."""

    def __init__(self, arch: Arch):
        super().__init__()
        c0 = int(P5[0][0] * arch.widen)
        self.stem = nn.Sequential(ConvBNAct(3, c0 // 2, 3, 2), ConvBNAct(c0 // 2, c0 // 2, 3),
                                  ConvBNAct(c0 // 2, c0, 3))
        self.stages = nn.ModuleList()
        self.channels: list[int] = []
        for c_in, c_out, n, residual, spp in P5:
            c_in, c_out = int(c_in * arch.widen), int(c_out * arch.widen)
            layers = [ConvBNAct(c_in, c_out, 3, 2)] + ([SPPBottleneck(c_out)] if spp else [])
            layers.append(CSPLayer(c_out, c_out, max(round(n * arch.deepen), 1), residual, True))
            self.stages.append(nn.Sequential(*layers))
            self.channels.append(c_out)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = self.stem(x)
        outs = []
        for stage in self.stages:
            x = stage(x)
            outs.append(x)
        return outs[1:]


class CSPNeXtPAFPN(nn.Module):
    """(C3, C4, C5) -> three maps of `c_out` channels: top-down then bottom-up CSP fusion."""

    def __init__(self, ch: list[int], c_out: int, n: int):
        super().__init__()
        c3, c4, c5 = ch
        self.reduce5 = ConvBNAct(c5, c4)
        self.td4 = CSPLayer(2 * c4, c4, n, False, False)
        self.reduce4 = ConvBNAct(c4, c3)
        self.td3 = CSPLayer(2 * c3, c3, n, False, False)
        self.down3 = ConvBNAct(c3, c3, 3, 2)
        self.bu4 = CSPLayer(2 * c3, c4, n, False, False)
        self.down4 = ConvBNAct(c4, c4, 3, 2)
        self.bu5 = CSPLayer(2 * c4, c5, n, False, False)
        self.outs = nn.ModuleList(ConvBNAct(c, c_out, 3) for c in ch)

    def forward(self, feats: list[torch.Tensor]) -> list[torch.Tensor]:
        x3, x4, x5 = feats
        r5 = self.reduce5(x5)
        t4 = self.td4(torch.cat((F.interpolate(r5, scale_factor=2.0, mode="nearest"), x4), 1))
        r4 = self.reduce4(t4)
        n3 = self.td3(torch.cat((F.interpolate(r4, scale_factor=2.0, mode="nearest"), x3), 1))
        n4 = self.bu4(torch.cat((self.down3(n3), r4), 1))
        n5 = self.bu5(torch.cat((self.down4(n4), r5), 1))
        return [conv(f) for conv, f in zip(self.outs, (n3, n4, n5))]


class SharedConvBN(nn.Module):
    """One 3x3 conv applied at every level, each level with its own BatchNorm, then SiLU.

    The weight is one Parameter used three times, so its gradient is the sum of three per-level
    contributions (the summation order may differ between eager and graphed backward).
    """

    def __init__(self, c_in: int, c_out: int, levels: int):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, 3, 1, 1, bias=False)
        self.bns = nn.ModuleList(nn.BatchNorm2d(c_out, eps=BN_EPS, momentum=BN_MOMENTUM)
                                 for _ in range(levels))

    def forward(self, x: torch.Tensor, level: int) -> torch.Tensor:
        return F.silu(self.bns[level](self.conv(x)))


class SepBNHead(nn.Module):
    """Per level: [B, nc + 4, H, W] = class logits then 4 distances in pixels (already scaled)."""

    def __init__(self, c: int, num_classes: int, exp_on_reg: bool, strides=STRIDES, stacked: int = 2):
        super().__init__()
        n = len(strides)
        self.strides = tuple(strides)
        self.exp_on_reg = exp_on_reg
        self.cls_convs = nn.ModuleList(SharedConvBN(c, c, n) for _ in range(stacked))
        self.reg_convs = nn.ModuleList(SharedConvBN(c, c, n) for _ in range(stacked))
        self.cls_pred = nn.ModuleList(nn.Conv2d(c, num_classes, 1) for _ in range(n))
        self.reg_pred = nn.ModuleList(nn.Conv2d(c, 4, 1) for _ in range(n))
        # mmdet RTMDetSepBNHead init: every head conv N(0, 0.01); class bias = prior 0.01.
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.normal_(m.weight, 0.0, 0.01)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        for p in self.cls_pred:
            nn.init.constant_(p.bias, -math.log((1 - 0.01) / 0.01))

    def forward(self, feats: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        outs = []
        for i, (x, s) in enumerate(zip(feats, self.strides)):
            c, r = x, x
            for conv in self.cls_convs:
                c = conv(c, i)
            for conv in self.reg_convs:
                r = conv(r, i)
            dist = self.reg_pred[i](r)
            dist = (dist.exp() if self.exp_on_reg else dist) * s
            outs.append(torch.cat((self.cls_pred[i](c), dist), 1))
        return tuple(outs)


class RTMDetNet(nn.Module):
    """images [B, 3, H, W] -> per-level raw maps [B, nc + 4, H/s, W/s], s = 8, 16, 32."""

    def __init__(self, arch: Arch, num_classes: int):
        super().__init__()
        self.backbone = CSPNeXt(arch)
        c_out = self.backbone.channels[1]  # neck width = the P3 stage width (96 for tiny ...)
        self.neck = CSPNeXtPAFPN(self.backbone.channels[1:], c_out, max(round(3 * arch.deepen), 1))
        self.head = SepBNHead(c_out, num_classes, arch.exp_on_reg)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.head(self.neck(self.backbone(x)))


def decode_boxes(dist: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
    """ltrb pixel distances [..., 4] around prior points [A, 2] -> xyxy pixels."""
    lt, rb = dist.chunk(2, -1)
    return torch.cat((points - lt, points + rb), -1)


class RTMDetModel(YOLOStyleModel):
    """Training model (families/base.py contract): `capturable` is the whole network."""

    def __init__(self, size: str, num_classes: int):
        super().__init__()
        self.size = size
        self.num_classes = num_classes
        self.strides = STRIDES
        self.net = RTMDetNet(ARCHS[size], num_classes)
        self.priors = AnchorCache(STRIDES, offset=0.0, pixels=True)  # cell corners, pixels

    def decode(self, preds: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """Raw maps -> [B, A, 4 + nc]: xyxy input pixels, then sigmoid scores (float32)."""
        points, _ = self.priors(preds)
        with torch.autocast(preds[0].device.type, enabled=False):
            x = flatten_levels(preds, torch.float32)
            logits, dist = x.split((self.num_classes, 4), -1)
            return torch.cat((decode_boxes(dist, points), logits.sigmoid()), -1)


def build(size: str, num_classes: int) -> RTMDetModel:
    return build_model(RTMDetModel, "RTMDet", ARCHS, size, num_classes)
