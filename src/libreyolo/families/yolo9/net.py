"""YOLOv9 (GELAN) network, inference form: backbone + PAN neck + decoupled DFL head.

Written from the YOLOv9 paper (Wang & Liao, arXiv 2402.13616). Only the main branch is built:
the PGI auxiliary branch exists only during the authors' training and is deleted before the
published models are measured ("converted" weights), so the published parameter and FLOP figures
describe exactly this network. Channel widths and depths per size are the numbers in the public
gelan-{t,s,m,c} configs (the main branch of yolov9-{t,s,m,c}).

Blocks (paper section 4 and figure 4):
- RepNCSPELAN4: GELAN block. A 1x1 conv splits into two halves; the second half goes through two
  (CSP-of-RepN-bottlenecks + 3x3 conv) stages; all four pieces are concatenated and mixed by 1x1.
- ELAN1: the same aggregation with plain 3x3 convs (the first block of t and s).
- RepConvN: 3x3 conv-BN + 1x1 conv-BN summed, then SiLU (RepVGG without the identity branch);
  it folds into one 3x3 conv for inference (`fuse_`).
- AConv / ADown: stride-2 downsampling after a 2x2 stride-1 average pool; ADown splits channels
  between a 3x3 stride-2 conv and a max-pool + 1x1 conv.
- SPPELAN: SPP as three chained 5x5 max-pools, aggregated ELAN-style.

Size figures. The published params/GFLOPs (t 2.0M 7.7G, s 7.1M 26.4G, m 20.0M 76.3G,
c 25.3M 102.1G at 640, 80 classes) count the deploy form: BN folded, each RepConvN merged into one
3x3 conv (`YOLO9Model.fuse()`), and GFLOPs = 2 x conv MACs (thop MACs x 2). Fused, this network
measures t 2.00M 7.71G, s 7.11M 26.38G, m 19.97M 76.28G, c 25.29M 102.14G with
torch.utils.flop_counter (which also counts 2 x MACs); the trained (unfused) form is 1-2% larger.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..common import (
    ConvBNAct,
    DFLDetector,
    build_model,
    fold_bn,
    prior_prob_bias,
)

STRIDES = (8, 16, 32)
REG_MAX = 16

Elan = tuple[int, int, int]  # (out channels, hidden channels c3, branch channels c4)


@dataclass(frozen=True)
class Arch:
    """One size: widths from the public gelan-<size> configs."""

    stem: tuple[int, int]              # two stride-2 3x3 convs (P1, P2)
    first: Elan                        # block at P2
    first_is_elan1: bool               # t, s use ELAN1 there; m, c a RepNCSPELAN4
    stages: tuple[tuple[int, Elan], ...]  # P3, P4, P5: (downsample out, block)
    spp: tuple[int, int]               # SPPELAN (out, hidden)
    up: tuple[Elan, Elan]              # top-down blocks at P4 then P3
    down: tuple[tuple[int, Elan], ...]  # bottom-up at P4 then P5: (downsample out, block)
    depth: int                         # RepN bottlenecks per RepNCSP
    adown: bool                        # c uses ADown, the smaller sizes AConv


ARCHS: dict[str, Arch] = {
    "t": Arch((16, 32), (32, 32, 16), True,
              ((64, (64, 64, 32)), (96, (96, 96, 48)), (128, (128, 128, 64))), (128, 64),
              ((96, 96, 48), (64, 64, 32)), ((48, (96, 96, 48)), (64, (128, 128, 64))), 3, False),
    "s": Arch((32, 64), (64, 64, 32), True,
              ((128, (128, 128, 64)), (192, (192, 192, 96)), (256, (256, 256, 128))), (256, 128),
              ((192, 192, 96), (128, 128, 64)), ((96, (192, 192, 96)), (128, (256, 256, 128))),
              3, False),
    "m": Arch((32, 64), (128, 128, 64), False,
              ((240, (240, 240, 120)), (360, (360, 360, 180)), (480, (480, 480, 240))), (480, 240),
              ((360, 360, 180), (240, 240, 120)), ((180, (360, 360, 180)), (240, (480, 480, 240))),
              1, False),
    "c": Arch((64, 128), (256, 128, 64), False,
              ((256, (512, 256, 128)), (512, (512, 512, 256)), (512, (512, 512, 256))), (512, 256),
              ((512, 512, 256), (256, 256, 128)), ((256, (512, 512, 256)), (512, (512, 512, 256))),
              1, True),
}


class RepConvN(nn.Module):
    """3x3 conv-BN + 1x1 conv-BN, summed, then SiLU; `fuse_` merges them into one 3x3 conv."""

    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.k3 = ConvBNAct(c_in, c_out, 3, act=False)
        self.k1 = ConvBNAct(c_in, c_out, 1, act=False)
        self.fused: nn.Conv2d | None = None
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused is not None:
            return self.act(self.fused(x))
        return self.act(self.k3(x) + self.k1(x))

    @torch.no_grad()
    def fuse_(self) -> None:
        if self.fused is not None:
            return
        w3, b3 = fold_bn(self.k3.conv.weight, self.k3.bn)
        w1, b1 = fold_bn(self.k1.conv.weight, self.k1.bn)
        fused = nn.Conv2d(w3.shape[1], w3.shape[0], 3, 1, 1, bias=True).to(w3.device)
        fused.weight.copy_(w3 + F.pad(w1, (1, 1, 1, 1)))  # a 1x1 kernel is a centred 3x3 one
        fused.bias.copy_(b3 + b1)
        self.fused = fused
        del self.k3, self.k1


class RepNBottleneck(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.cv1 = RepConvN(c, c)
        self.cv2 = ConvBNAct(c, c, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.cv2(self.cv1(x))


class RepNCSP(nn.Module):
    """CSP: half the channels through `n` RepN bottlenecks, half straight; concat; 1x1."""

    def __init__(self, c_in: int, c_out: int, n: int):
        super().__init__()
        hidden = c_out // 2
        self.cv1 = ConvBNAct(c_in, hidden)
        self.cv2 = ConvBNAct(c_in, hidden)
        self.m = nn.Sequential(*(RepNBottleneck(hidden) for _ in range(n)))
        self.cv3 = ConvBNAct(2 * hidden, c_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), 1))


class GELANBlock(nn.Module):
    """RepNCSPELAN4 (`n` > 0) or ELAN1 (`n` == 0: the branches are single 3x3 convs)."""

    def __init__(self, c_in: int, spec: Elan, n: int):
        super().__init__()
        c_out, c3, c4 = spec
        self.cv1 = ConvBNAct(c_in, c3)
        if n > 0:
            self.cv2 = nn.Sequential(RepNCSP(c3 // 2, c4, n), ConvBNAct(c4, c4, 3))
            self.cv3 = nn.Sequential(RepNCSP(c4, c4, n), ConvBNAct(c4, c4, 3))
        else:
            self.cv2 = ConvBNAct(c3 // 2, c4, 3)
            self.cv3 = ConvBNAct(c4, c4, 3)
        self.cv4 = ConvBNAct(c3 + 2 * c4, c_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.cv1(x).chunk(2, 1)
        c = self.cv2(b)
        d = self.cv3(c)
        return self.cv4(torch.cat((a, b, c, d), 1))


class AConv(nn.Module):
    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.cv = ConvBNAct(c_in, c_out, 3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv(F.avg_pool2d(x, 2, 1, 0, False, True))


class ADown(nn.Module):
    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.cv1 = ConvBNAct(c_in // 2, c_out // 2, 3, 2)
        self.cv2 = ConvBNAct(c_in // 2, c_out // 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = F.avg_pool2d(x, 2, 1, 0, False, True).chunk(2, 1)
        return torch.cat((self.cv1(a), self.cv2(F.max_pool2d(b, 3, 2, 1))), 1)


class SPPELAN(nn.Module):
    def __init__(self, c_in: int, c_out: int, hidden: int):
        super().__init__()
        self.cv1 = ConvBNAct(c_in, hidden)
        self.cv5 = ConvBNAct(4 * hidden, c_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ys = [self.cv1(x)]
        for _ in range(3):  # chained 5x5 pools = receptive fields 5, 9, 13
            ys.append(F.max_pool2d(ys[-1], 5, 1, 2))
        return self.cv5(torch.cat(ys, 1))


class DetectHead(nn.Module):
    """Decoupled head per level: box branch -> 4 * reg_max DFL logits, cls branch -> nc logits.

    Box branch: width max(c_P3 / 4, 4 * reg_max, 16) rounded up to a multiple of 4, as YOLOv9's
    DDetect, but ungrouped: DDetect's middle 3x3 and final 1x1 have 4 groups (one per box side),
    the peer trainer's YOLOv9 has none, and trained that way YOLOv9-t learned more per epoch
    (mAP50-95 0.764 against 0.724 after 5 epochs on the H200, median of 3 seeds) at a faster step
    (2.99 against 3.13 s per 100-step epoch): docs/training-performance.md. It costs 92,160
    parameters at t (2.09 M instead of the published 2.0 M).
    Cls branch width max(c_P3, min(nc, 100)). The public DDetect config uses min(2 nc, 128)
    instead; both give the same widths for s, m and c at any nc <= 128, but for t that rule
    yields 2.41M params / 9.8 GFLOPs, not the published 2.0M / 7.7G (a known mismatch, yolov9
    issue #505). Width min(nc, 100) = 80 reproduces the published T figures exactly
    (2.00M / 7.71G), so the published T head is taken to be this one.
    """

    def __init__(self, channels: tuple[int, ...], num_classes: int, reg_max: int = REG_MAX,
                 strides: tuple[int, ...] = STRIDES):
        super().__init__()
        cb = -(-max(channels[0] // 4, 4 * reg_max, 16) // 4) * 4
        cc = max(channels[0], min(num_classes, 100))
        self.box = nn.ModuleList(
            nn.Sequential(ConvBNAct(c, cb, 3), ConvBNAct(cb, cb, 3), nn.Conv2d(cb, 4 * reg_max, 1))
            for c in channels)
        self.cls = nn.ModuleList(
            nn.Sequential(ConvBNAct(c, cc, 3), ConvBNAct(cc, cc, 3), nn.Conv2d(cc, num_classes, 1))
            for c in channels)
        with torch.no_grad():
            for box, cls, s in zip(self.box, self.cls, strides):
                box[-1].bias.fill_(1.0)
                cls[-1].bias.fill_(prior_prob_bias(num_classes, s))

    def forward(self, feats: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        return tuple(torch.cat((b(f), c(f)), 1) for f, b, c in zip(feats, self.box, self.cls))


class GELAN(nn.Module):
    """images [B, 3, H, W] -> per-level raw head maps [B, 4 * reg_max + nc, H/s, W/s], s = 8, 16, 32."""

    def __init__(self, arch: Arch, num_classes: int):
        super().__init__()
        down = ADown if arch.adown else AConv
        n = arch.depth
        self.stem = nn.Sequential(ConvBNAct(3, arch.stem[0], 3, 2),
                                  ConvBNAct(arch.stem[0], arch.stem[1], 3, 2),
                                  GELANBlock(arch.stem[1], arch.first, 0 if arch.first_is_elan1 else n))
        c = arch.first[0]
        self.stages = nn.ModuleList()
        skips = []
        for c_down, block in arch.stages:
            self.stages.append(nn.Sequential(down(c, c_down), GELANBlock(c_down, block, n)))
            c = block[0]
            skips.append(c)
        self.spp = SPPELAN(c, *arch.spp)
        c_p5 = arch.spp[0]
        self.up4 = GELANBlock(c_p5 + skips[1], arch.up[0], n)
        self.up3 = GELANBlock(arch.up[0][0] + skips[0], arch.up[1], n)
        (d4, b4), (d5, b5) = arch.down
        self.down4 = down(arch.up[1][0], d4)
        self.out4 = GELANBlock(d4 + arch.up[0][0], b4, n)
        self.down5 = down(b4[0], d5)
        self.out5 = GELANBlock(d5 + c_p5, b5, n)
        self.head = DetectHead((arch.up[1][0], b4[0], b5[0]), num_classes)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        x = self.stem(x)
        p3 = self.stages[0](x)
        p4 = self.stages[1](p3)
        p5 = self.spp(self.stages[2](p4))
        t4 = self.up4(torch.cat((F.interpolate(p5, scale_factor=2.0, mode="nearest"), p4), 1))
        n3 = self.up3(torch.cat((F.interpolate(t4, scale_factor=2.0, mode="nearest"), p3), 1))
        n4 = self.out4(torch.cat((self.down4(n3), t4), 1))
        n5 = self.out5(torch.cat((self.down5(n4), p5), 1))
        return self.head([n3, n4, n5])


class YOLO9Model(DFLDetector):
    """Training model (families/base.py contract): GELAN with a DFL head of REG_MAX bins a side;
    `fuse()` also merges the RepConvN branches."""

    def __init__(self, size: str, num_classes: int):
        super().__init__(size, num_classes, GELAN(ARCHS[size], num_classes), STRIDES, REG_MAX, REG_MAX)


def build(size: str, num_classes: int) -> YOLO9Model:
    return build_model(YOLO9Model, "YOLOv9", ARCHS, size, num_classes)
