"""YOLO-NAS network: QARepVGG backbone + PAN neck with a stride-4 skip + decoupled DFL heads.

Written from the published architecture of Deci's super-gradients (github:Deci-AI/super-gradients,
Apache-2.0 code): the arch recipes `recipes/arch_params/yolo_nas_{s,m,l}_arch_params.yaml` give the
widths, depths and head widths below; the block structure is that of
`training/models/detection_models/yolo_nas/` (yolo_stages.py, panneck.py, dfl_heads.py) and
`modules/qarepvgg_block.py`. The QARepVGG block is from Chu et al., "Make RepVGG Greater Again: A
Quantization-aware Approach" (arXiv 2212.01593), its S4 form. BatchNorm eps 1e-3, momentum 0.03
and ReLU everywhere, as the arch recipes set them.

Blocks:
- QARepVGG: a 3x3 conv-BN, a 1x1 conv with bias and (stride 1, in == out, inside a bottleneck)
  the identity are summed, then one BatchNorm and ReLU. `fuse_` folds the three branches and the
  BatchNorm into one 3x3 conv (+ ReLU): the deploy form predict and export run.
- Stage: a stride-2 QARepVGG, then a CSP layer: two 1x1 convs split the input; one half goes
  through n bottlenecks (two QARepVGG blocks, plus `alpha * x`, alpha learned, init 1); the
  bottleneck outputs (all of them for m/l's `concat_intermediates` stages, else the last) and the
  other half are concatenated and mixed by a 1x1 conv.
- SPP: 1x1 to half the channels, parallel 5/9/13 max-pools, concat, 1x1.
- Neck (PAN): two up stages take the coarser map (1x1 conv, then a 2x2 stride-2 transposed conv),
  the same-level skip (1x1) and the finer skip (1x1, then a stride-2 3x3: the stride-4 backbone
  map reaches the stride-8 output this way), concat, 1x1, CSP of QARepVGG bottlenecks; two down
  stages: a stride-2 3x3 conv to half the output width, concat with the up stage's 1x1 output of
  that level, CSP of plain 3x3 conv bottlenecks.
- Head per level: 1x1 stem, then one 3x3 conv per branch, a 1x1 class predictor (bias at prior
  0.01) and a 1x1 predictor of 4 x 17 DFL bins (upstream's reg_max 16: distances 0..16 cells).

Size figures: github:Deci-AI/super-gradients keeps no parameter or FLOP counts in its tree; the
counts quoted for the released models are S 19.02M, M 51.13M, L 66.91M. They count upstream's
training module, which registers besides the branches a dead 3x3 `rbr_reparam` conv per QARepVGG block (a
placeholder its fusion writes into, no gradient ever reaches it); ours creates the fused conv only
in `fuse_`. Measured here at 80 classes: our training form S 12.88M, M 33.86M, L 44.53M; with
upstream's placeholders added S 19.05M, M 51.18M, L 66.98M, within 0.2% of the quoted figures
(the class predictors' weights are the difference: without them 19.02M, 51.13M, 66.90M); deploy
form (`fuse()`, what predict and export run) S 12.17M, M 31.89M, L 41.98M, at 31.8, 87.8 and
119.8 GFLOPs at 640 (2 x MACs, torch.utils.flop_counter; upstream publishes no FLOP figure).
tests/unit/test_yolonas_net.py holds the network to these numbers.
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
    ConvBNAct,
    DFLDetector,
    build_model,
    fold_bn,
)

STRIDES = (8, 16, 32)
REG_MAX = 16  # upstream's name: the largest distance in cells, so 17 bins per side
BINS = REG_MAX + 1
PRIOR_PROB = 0.01  # dfl_heads.py: the class bias starts every score at 0.01

Stage = tuple[int, int, int, bool]  # (out channels, bottlenecks, hidden channels, concat_intermediates)
Csp = tuple[int, int]  # (bottlenecks, hidden channels)


@dataclass(frozen=True)
class Arch:
    """One size: the numbers of yolo_nas_<size>_arch_params.yaml."""

    stages: tuple[Stage, Stage, Stage, Stage]  # strides 4, 8, 16, 32 (after the 48-channel stem)
    up: tuple[Csp, Csp]                        # neck1 (-> stride 16, 192 ch), neck2 (-> stride 8, 96 ch)
    down: tuple[Csp, Csp]                      # neck3 (-> stride 16, 192 ch), neck4 (-> stride 32, 384 ch)
    head_width: float                          # head inter channels = 128, 256, 512 x this


STEM = 48
SPP_OUT = 768
NECK_OUT = (192, 96, 192, 384)  # neck1..neck4
HEAD_INTER = (128, 256, 512)

ARCHS: dict[str, Arch] = {
    "s": Arch(((96, 2, 32, False), (192, 3, 64, False), (384, 5, 96, False), (768, 2, 192, False)),
              ((2, 64), (2, 48)), ((2, 64), (2, 64)), 0.5),
    "m": Arch(((96, 2, 64, True), (192, 3, 128, True), (384, 5, 256, True), (768, 2, 384, False)),
              ((2, 192), (3, 64)), ((2, 192), (3, 256)), 0.75),
    "l": Arch(((96, 2, 96, True), (192, 3, 128, True), (384, 5, 256, True), (768, 2, 512, True)),
              ((4, 128), (4, 128)), ((4, 128), (4, 256)), 1.0),
}


def _bn(c: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(c, eps=BN_EPS, momentum=BN_MOMENTUM)


class ConvBNReLU(ConvBNAct):
    """ConvBNAct with ReLU, YOLO-NAS's activation (common.ConvBNAct's is SiLU)."""

    def __init__(self, c_in: int, c_out: int, k: int = 1, s: int = 1):
        super().__init__(c_in, c_out, k, s)
        self.act = nn.ReLU(inplace=True)


class QARepVGG(nn.Module):
    """relu(BN(BN3(conv3x3(x)) + conv1x1(x) + [x])); `fuse_` makes it relu(conv3x3'(x)).

    The identity branch exists only where `residual` (stride 1, in == out): the bottlenecks'
    blocks; the stem and the stride-2 downsamples have none, as upstream's
    `use_residual_connection=False` there. The 1x1 branch has a bias and no BatchNorm of its own;
    one BatchNorm after the sum normalises all three (the paper's S4 variant, its design for a
    fused kernel that quantises well)."""

    def __init__(self, c_in: int, c_out: int, stride: int = 1, residual: bool = False):
        super().__init__()
        if residual and (stride != 1 or c_in != c_out):
            raise ValueError("a QARepVGG identity branch needs stride 1 and c_in == c_out")
        self.stride, self.residual = stride, residual
        self.conv3 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn3 = _bn(c_out)
        # The 1x1 branch of a strided block reads every stride-th pixel through a stride-1 conv,
        # the same numbers as a strided 1x1 conv: torch 2.14's CPU (oneDNN) backward of a
        # strided 1x1 conv on a channels_last input of 2-4 channels (the stem's RGB) corrupts
        # the heap ("double free or corruption", measured; 1 or >= 5 channels are fine).
        self.conv1 = nn.Conv2d(c_in, c_out, 1, 1, 0, bias=True)
        self.post_bn = _bn(c_out)
        self.fused: nn.Conv2d | None = None
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused is not None:
            return self.act(self.fused(x))
        y = self.bn3(self.conv3(x)) + self.conv1(x[..., ::self.stride, ::self.stride] if self.stride > 1 else x)
        if self.residual:
            y = y + x
        return self.act(self.post_bn(y))

    @torch.no_grad()
    def fuse_(self) -> None:
        if self.fused is not None:
            return
        weight, bias = fold_bn(self.conv3.weight, self.bn3)
        weight = weight + F.pad(self.conv1.weight, (1, 1, 1, 1))  # a 1x1 kernel is a centred 3x3 one
        bias = bias + self.conv1.bias
        if self.residual:  # the identity is a 3x3 kernel with a 1 at the centre of its own channel
            c = weight.shape[0]
            weight[torch.arange(c), torch.arange(c), 1, 1] += 1.0
        weight, bias = _fold_bn_after(weight, bias, self.post_bn)
        fused = nn.Conv2d(weight.shape[1], weight.shape[0], 3, self.stride, 1, bias=True).to(weight.device)
        fused.weight.copy_(weight)
        fused.bias.copy_(bias)
        self.fused = fused
        del self.conv3, self.bn3, self.conv1, self.post_bn


def _fold_bn_after(weight: torch.Tensor, bias: torch.Tensor, bn: nn.BatchNorm2d) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight, bias) of one conv equal to `bn(conv(x) + bias)` in eval mode."""
    w, b = fold_bn(weight, bn)
    scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    return w, b + bias * scale


class Bottleneck(nn.Module):
    """alpha * x + block(block(x)): QARepVGG blocks in the backbone and up stages, plain 3x3
    ConvBNReLU in the down stages (yolo_stages.py's YoloNASBottleneck, `use_alpha` on)."""

    def __init__(self, c: int, rep: bool):
        super().__init__()
        self.cv1 = QARepVGG(c, c, residual=True) if rep else ConvBNReLU(c, c, 3)
        self.cv2 = QARepVGG(c, c, residual=True) if rep else ConvBNReLU(c, c, 3)
        self.alpha = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.alpha * x + self.cv2(self.cv1(x))


class CSP(nn.Module):
    """1x1 split into two `hidden`-wide halves; one half through `n` bottlenecks; concat (every
    bottleneck's input and output with `concat`, else the last output) with the other; 1x1."""

    def __init__(self, c_in: int, c_out: int, n: int, hidden: int, rep: bool, concat: bool = False):
        super().__init__()
        self.concat = concat
        self.cv1 = ConvBNReLU(c_in, hidden)
        self.cv2 = ConvBNReLU(c_in, hidden)
        self.blocks = nn.ModuleList(Bottleneck(hidden, rep) for _ in range(n))
        self.cv3 = ConvBNReLU(hidden * (2 + n * concat), c_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ys = [self.cv1(x)]
        for block in self.blocks:
            ys.append(block(ys[-1]))
        parts = ys if self.concat else ys[-1:]
        return self.cv3(torch.cat((*parts, self.cv2(x)), 1))


class SPP(nn.Module):
    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        hidden = c_in // 2
        self.cv1 = ConvBNReLU(c_in, hidden)
        self.cv2 = ConvBNReLU(4 * hidden, c_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.cv1(x)
        return self.cv2(torch.cat([x] + [F.max_pool2d(x, k, 1, k // 2) for k in (5, 9, 13)], 1))


class UpStage(nn.Module):
    """(coarse, skip, finer skip) -> (coarse after its 1x1, the new map at the skip's stride)."""

    def __init__(self, c_coarse: int, c_skip: int, c_finer: int, c_out: int, csp: Csp):
        super().__init__()
        self.conv = ConvBNReLU(c_coarse, c_out)
        self.upsample = nn.ConvTranspose2d(c_out, c_out, 2, 2)
        self.reduce_skip = ConvBNReLU(c_skip, c_out)
        self.reduce_finer = ConvBNReLU(c_finer, c_out)
        self.downsample = ConvBNReLU(c_out, c_out, 3, 2)
        self.reduce = ConvBNReLU(3 * c_out, c_out)
        self.csp = CSP(c_out, c_out, *csp, rep=True)

    def forward(self, coarse: torch.Tensor, skip: torch.Tensor,
                finer: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inter = self.conv(coarse)
        x = torch.cat((self.upsample(inter), self.reduce_skip(skip),
                       self.downsample(self.reduce_finer(finer))), 1)
        return inter, self.csp(self.reduce(x))


class DownStage(nn.Module):
    def __init__(self, c_in: int, c_skip: int, c_out: int, csp: Csp):
        super().__init__()
        self.conv = ConvBNReLU(c_in, c_out // 2, 3, 2)
        self.csp = CSP(c_out // 2 + c_skip, c_out, *csp, rep=False)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.csp(torch.cat((self.conv(x), skip), 1))


class DFLHead(nn.Module):
    """One level: 1x1 stem, a 3x3 per branch, 1x1 predictors -> [B, 4 * 17 + nc, H, W]."""

    def __init__(self, c_in: int, inter: int, num_classes: int):
        super().__init__()
        self.stem = ConvBNReLU(c_in, inter)
        self.reg = nn.Sequential(ConvBNReLU(inter, inter, 3), nn.Conv2d(inter, 4 * BINS, 1))
        self.cls = nn.Sequential(ConvBNReLU(inter, inter, 3), nn.Conv2d(inter, num_classes, 1))
        with torch.no_grad():
            self.cls[-1].bias.fill_(-math.log((1 - PRIOR_PROB) / PRIOR_PROB))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        return torch.cat((self.reg(x), self.cls(x)), 1)


def _head_width(c: int, mult: float) -> int:
    """super-gradients' width_multiplier(c, mult, 8): c * mult rounded up to a multiple of 8."""
    return math.ceil(int(c * mult) / 8) * 8


class YOLONASNet(nn.Module):
    """images [B, 3, H, W] -> per-level raw head maps [B, 4 * 17 + nc, H/s, W/s], s = 8, 16, 32."""

    def __init__(self, arch: Arch, num_classes: int):
        super().__init__()
        self.stem = QARepVGG(3, STEM, stride=2)
        self.stages = nn.ModuleList()
        c = STEM
        for c_out, n, hidden, concat in arch.stages:
            self.stages.append(nn.Sequential(QARepVGG(c, c_out, stride=2),
                                             CSP(c_out, c_out, n, hidden, rep=True, concat=concat)))
            c = c_out
        self.spp = SPP(c, SPP_OUT)
        c2, c3, c4 = (s[0] for s in arch.stages[:3])
        n1, n2, n3, n4 = NECK_OUT
        self.up1 = UpStage(SPP_OUT, c4, c3, n1, arch.up[0])
        self.up2 = UpStage(n1, c3, c2, n2, arch.up[1])
        self.down1 = DownStage(n2, n2, n3, arch.down[0])
        self.down2 = DownStage(n3, n1, n4, arch.down[1])
        self.heads = nn.ModuleList(DFLHead(c, _head_width(w, arch.head_width), num_classes)
                                   for c, w in zip((n2, n3, n4), HEAD_INTER))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        c2 = self.stages[0](self.stem(x))
        c3 = self.stages[1](c2)
        c4 = self.stages[2](c3)
        c5 = self.spp(self.stages[3](c4))
        inter1, x = self.up1(c5, c4, c3)
        inter2, p3 = self.up2(x, c3, c2)
        p4 = self.down1(p3, inter2)
        p5 = self.down2(p4, inter1)
        return tuple(head(p) for head, p in zip(self.heads, (p3, p4, p5)))


class YOLONASModel(DFLDetector):
    """Training model (families/base.py contract): a DFL head of BINS = REG_MAX + 1 bins a side;
    `fuse()` makes every QARepVGG block one 3x3 conv."""

    def __init__(self, size: str, num_classes: int):
        super().__init__(size, num_classes, YOLONASNet(ARCHS[size], num_classes), STRIDES, REG_MAX, BINS)


def build(size: str, num_classes: int) -> YOLONASModel:
    return build_model(YOLONASModel, "YOLO-NAS", ARCHS, size, num_classes)
