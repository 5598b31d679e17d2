"""YOLOX network: CSPDarknet backbone + PAFPN neck + decoupled anchor-free head.

Written from the YOLOX report (Ge et al., arXiv 2107.08430) and the published size multipliers
(depth, width): nano 0.33/0.25 (depthwise 3x3 convs), tiny 0.33/0.375, s 0.33/0.50, m 0.67/0.75,
l 1.0/1.0, x 1.33/1.25. Channels are int(width * base) with base widths 64..1024 through the
backbone and 256/512/1024 at the three outputs; CSP depths are round(depth * 3) (and 3x that in the
middle stages of the backbone).

Blocks:
- Focus stem: space-to-depth (every 2x2 pixel block becomes 12 channels), then a 3x3 conv.
- CSPLayer: half the channels through `n` bottlenecks (1x1 then 3x3), half straight; concat; 1x1.
- SPP bottleneck: 1x1 halving, max-pools 5/9/13 in parallel, concat, 1x1.
- Head, per level: 1x1 stem to int(256 * width), then two 3x3-conv branches; the regression
  branch ends in 4 box + 1 objectness outputs, the classification branch in nc outputs.
  Output channels per location: (dx, dy, log w, log h, objectness, classes...), one prediction per
  grid cell (anchor-free), strides 8/16/32.

Box decoding (grid cell (i, j) at stride s, no 0.5 offset, as YOLOX decodes):
  cx = (dx + j) * s, cy = (dy + i) * s, w = exp(log w) * s, h = exp(log h) * s.
Scores at inference: sigmoid(objectness) * sigmoid(class logit).

Size figures: see tests/unit/test_yolox_net.py (measured vs the published README table).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..common import (
    AnchorCache,
    ConvBNAct,
    YOLOStyleModel,
    build_model,
    flatten_levels,
    fuse_model_,
)

STRIDES = (8, 16, 32)
# YOLOX initialises the objectness and class biases to a 1 % prior probability (focal-loss style),
# so the first BCE steps are not dominated by thousands of confident negatives.
PRIOR_BIAS = math.log(0.01 / 0.99)
# exp() of the raw log-size is clamped in decoding: an untrained or diverging head can emit large
# logits, and exp(89) already overflows float32. 20 is a box e^20 strides wide: never a real box.
MAX_LOG_WH = 20.0


@dataclass(frozen=True)
class Arch:
    depth: float
    width: float
    depthwise: bool = False


ARCHS: dict[str, Arch] = {
    "n": Arch(0.33, 0.25, depthwise=True),
    "t": Arch(0.33, 0.375),
    "s": Arch(0.33, 0.50),
    "m": Arch(0.67, 0.75),
    "l": Arch(1.0, 1.0),
    "x": Arch(1.33, 1.25),
}


class DWConv(nn.Module):
    """Depthwise k x k conv-BN-SiLU then pointwise 1x1 conv-BN-SiLU (YOLOX-Nano's 3x3 convs)."""

    def __init__(self, c_in: int, c_out: int, k: int = 3, s: int = 1):
        super().__init__()
        self.dconv = ConvBNAct(c_in, c_in, k, s, g=c_in)
        self.pconv = ConvBNAct(c_in, c_out, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pconv(self.dconv(x))


def conv3(depthwise: bool):
    """The 3x3 conv type of a size: depthwise-separable for nano, plain otherwise."""
    return DWConv if depthwise else ConvBNAct


class Bottleneck(nn.Module):
    def __init__(self, c: int, shortcut: bool, depthwise: bool):
        super().__init__()
        self.cv1 = ConvBNAct(c, c, 1)
        self.cv2 = conv3(depthwise)(c, c, 3)
        self.shortcut = shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv2(self.cv1(x))
        return x + y if self.shortcut else y


class CSPLayer(nn.Module):
    def __init__(self, c_in: int, c_out: int, n: int, shortcut: bool = True, depthwise: bool = False):
        super().__init__()
        hidden = c_out // 2
        self.cv1 = ConvBNAct(c_in, hidden)
        self.cv2 = ConvBNAct(c_in, hidden)
        self.m = nn.Sequential(*(Bottleneck(hidden, shortcut, depthwise) for _ in range(n)))
        self.cv3 = ConvBNAct(2 * hidden, c_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), 1))


class SPPBottleneck(nn.Module):
    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        hidden = c_in // 2
        self.cv1 = ConvBNAct(c_in, hidden)
        self.cv2 = ConvBNAct(4 * hidden, c_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.cv1(x)
        pools = [F.max_pool2d(x, k, 1, k // 2) for k in (5, 9, 13)]
        return self.cv2(torch.cat([x, *pools], 1))


class Focus(nn.Module):
    """Space-to-depth: [B, 3, H, W] -> [B, 12, H/2, W/2], then a 3x3 conv (stride 1)."""

    def __init__(self, c_out: int):
        super().__init__()
        self.conv = ConvBNAct(12, c_out, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.cat((x[..., ::2, ::2], x[..., 1::2, ::2],
                                    x[..., ::2, 1::2], x[..., 1::2, 1::2]), 1))


class CSPDarknet(nn.Module):
    """images -> (P3, P4, P5) with int(256/512/1024 * width) channels."""

    def __init__(self, arch: Arch):
        super().__init__()
        c = int(arch.width * 64)
        n = max(round(arch.depth * 3), 1)
        down = conv3(arch.depthwise)
        dw = arch.depthwise
        self.stem = Focus(c)
        self.dark2 = nn.Sequential(down(c, 2 * c, 3, 2), CSPLayer(2 * c, 2 * c, n, depthwise=dw))
        self.dark3 = nn.Sequential(down(2 * c, 4 * c, 3, 2), CSPLayer(4 * c, 4 * c, 3 * n, depthwise=dw))
        self.dark4 = nn.Sequential(down(4 * c, 8 * c, 3, 2), CSPLayer(8 * c, 8 * c, 3 * n, depthwise=dw))
        self.dark5 = nn.Sequential(down(8 * c, 16 * c, 3, 2), SPPBottleneck(16 * c, 16 * c),
                                   CSPLayer(16 * c, 16 * c, n, shortcut=False, depthwise=dw))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        p3 = self.dark3(self.dark2(self.stem(x)))
        p4 = self.dark4(p3)
        return p3, p4, self.dark5(p4)


class PAFPN(nn.Module):
    """(P3, P4, P5) -> top-down then bottom-up fused (N3, N4, N5), same channel counts."""

    def __init__(self, arch: Arch):
        super().__init__()
        c3, c4, c5 = (int(arch.width * c) for c in (256, 512, 1024))
        n = round(3 * arch.depth)
        dw = arch.depthwise
        down = conv3(dw)
        self.lateral5 = ConvBNAct(c5, c4)
        self.td4 = CSPLayer(2 * c4, c4, n, shortcut=False, depthwise=dw)
        self.lateral4 = ConvBNAct(c4, c3)
        self.td3 = CSPLayer(2 * c3, c3, n, shortcut=False, depthwise=dw)
        self.down3 = down(c3, c3, 3, 2)
        self.bu4 = CSPLayer(2 * c3, c4, n, shortcut=False, depthwise=dw)
        self.down4 = down(c4, c4, 3, 2)
        self.bu5 = CSPLayer(2 * c4, c5, n, shortcut=False, depthwise=dw)

    def forward(self, feats: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
        p3, p4, p5 = feats
        l5 = self.lateral5(p5)
        t4 = self.td4(torch.cat((F.interpolate(l5, scale_factor=2.0, mode="nearest"), p4), 1))
        l4 = self.lateral4(t4)
        n3 = self.td3(torch.cat((F.interpolate(l4, scale_factor=2.0, mode="nearest"), p3), 1))
        n4 = self.bu4(torch.cat((self.down3(n3), l4), 1))
        n5 = self.bu5(torch.cat((self.down4(n4), l5), 1))
        return [n3, n4, n5]


class DecoupledHead(nn.Module):
    """Per level: 1x1 stem, then a classification and a regression branch (two 3x3 convs each)."""

    def __init__(self, arch: Arch, num_classes: int):
        super().__init__()
        hidden = int(256 * arch.width)
        conv = conv3(arch.depthwise)
        self.stems, self.cls, self.reg = nn.ModuleList(), nn.ModuleList(), nn.ModuleList()
        self.cls_out, self.reg_out = nn.ModuleList(), nn.ModuleList()
        for c in (int(arch.width * c) for c in (256, 512, 1024)):
            self.stems.append(ConvBNAct(c, hidden))
            self.cls.append(nn.Sequential(conv(hidden, hidden, 3), conv(hidden, hidden, 3)))
            self.reg.append(nn.Sequential(conv(hidden, hidden, 3), conv(hidden, hidden, 3)))
            self.cls_out.append(nn.Conv2d(hidden, num_classes, 1))
            self.reg_out.append(nn.Conv2d(hidden, 5, 1))  # 4 box + 1 objectness
        with torch.no_grad():
            for cls_out, reg_out in zip(self.cls_out, self.reg_out):
                cls_out.bias.fill_(PRIOR_BIAS)
                reg_out.bias[4] = PRIOR_BIAS

    def forward(self, feats: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        outs = []
        for i, f in enumerate(feats):
            f = self.stems[i](f)
            outs.append(torch.cat((self.reg_out[i](self.reg[i](f)), self.cls_out[i](self.cls[i](f))), 1))
        return tuple(outs)


class YOLOXNet(nn.Module):
    """images [B, 3, H, W] -> per-level raw head maps [B, 5 + nc, H/s, W/s], s = 8, 16, 32."""

    def __init__(self, arch: Arch, num_classes: int):
        super().__init__()
        self.backbone = CSPDarknet(arch)
        self.neck = PAFPN(arch)
        self.head = DecoupledHead(arch, num_classes)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.head(self.neck(self.backbone(x)))


def decode_boxes(raw: torch.Tensor, grid: torch.Tensor, strides: torch.Tensor) -> torch.Tensor:
    """Raw [..., A, 4] (dx, dy, log w, log h) -> xyxy pixels [..., A, 4]."""
    xy = (raw[..., :2] + grid) * strides
    half = raw[..., 2:4].clamp(max=MAX_LOG_WH).exp() * strides * 0.5
    return torch.cat((xy - half, xy + half), -1)


class YOLOXModel(YOLOStyleModel):
    """Training model (families/base.py contract): `capturable` is the whole network.

    `use_l1` switches on the L1 term of the loss when mosaic closes (`set_epoch`). The network
    itself is the same in both phases (the L1 term reads the raw outputs the head emits anyway),
    so only the eager loss changes; the trainer is still told, so it can re-arm the graphs.
    """

    def __init__(self, size: str, num_classes: int):
        super().__init__()
        self.size = size
        self.num_classes = num_classes
        self.strides = STRIDES
        self.net = YOLOXNet(ARCHS[size], num_classes)
        self.grids = AnchorCache(STRIDES, offset=0.0)  # cell corners, grid units
        self.use_l1 = False

    def set_epoch(self, epoch: int, cfg) -> str | None:
        """L1 on from the epoch mosaic closes (`epochs - no_aug_epochs`), as YOLOX trains; returns
        a reason only at the epoch the loss changes (resuming past the switch: the first epoch)."""
        start = cfg.epochs - cfg.no_aug_epochs
        on = cfg.no_aug_epochs > 0 and epoch >= start
        if on == self.use_l1:
            return None
        self.use_l1 = on
        return "yolox l1 branch on" if on else "yolox l1 branch off"

    def decode(self, preds: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """Raw head maps -> [B, A, 4 + nc]: xyxy boxes in input pixels, then obj * cls scores.
        Decoded in float32 even under autocast (exp and pixel offsets need the range)."""
        grid, strides = self.grids(preds)
        with torch.autocast(preds[0].device.type, enabled=False):
            x = flatten_levels(preds, torch.float32)
            boxes = decode_boxes(x[..., :4], grid, strides)
            scores = x[..., 4:5].sigmoid() * x[..., 5:].sigmoid()
            return torch.cat((boxes, scores), -1)

    def fuse(self) -> YOLOXModel:
        """Deploy form, in place: BN folded into the convs; inference only (eval mode)."""
        fuse_model_(self.eval().net)
        return self


def build(size: str, num_classes: int) -> YOLOXModel:
    return build_model(YOLOXModel, "YOLOX", ARCHS, size, num_classes)
