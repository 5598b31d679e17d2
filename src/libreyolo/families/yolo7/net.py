"""YOLOv7 network: ELAN backbone, SPPCSPC, ELAN PAN neck and the anchor-based implicit head.

Written from the YOLOv7 paper (Wang, Bochkovskiy & Liao, arXiv 2207.02696) with the layer
structure and widths of the official repository's cfg/training/yolov7.yaml (size "b", the base
YOLOv7) and yolov7-tiny.yaml (size "t"); that repository is GPL-3.0, and it was read for these
facts only. Size "b" is what the LibreYOLO weights call YOLOv7 (`LibreYOLO7b.pt`).

Blocks (paper section 3.1, figure 2; layer numbers are the cfgs'):
- ELAN: two 1x1 branches; the second feeds a chain of 3x3 convs; the branches and chain outputs
  are concatenated, deepest first, and mixed by a 1x1. The base backbone taps every second
  conv of its chain of four (layers 4-11), the base neck every conv (56-63), tiny has chains of
  two and taps both (2-7).
- MP transition (base, 12-16): a 2x2 max-pool + 1x1 branch and a 1x1 + 3x3 stride-2 branch,
  concatenated; tiny downsamples with the max-pool alone in the backbone and a 3x3 stride-2
  conv in the neck.
- SPPCSPC (51): CSP around max-pools 5/9/13; tiny's (29-37) without the 3x3 convs around them.
- RepConv (102-104, base only): 3x3 conv-BN + 1x1 conv-BN, summed, then SiLU. Every RepConv of
  the cfg changes width, so RepVGG's identity branch is never built: the block is YOLOv9's
  RepConvN, reused, and `fuse()` merges it into one 3x3 conv for predict and export.
- IDetect (105): per level, implicit knowledge (YOLOR): a learned per-channel shift before a
  1x1 conv to 3 x (5 + nc) channels and a learned per-channel scale after it (ImplicitA,
  ImplicitM), both folded into the conv by `fuse()`.
Activations: SiLU (base), LeakyReLU 0.1 (tiny, as its cfg; the paper's "tiny-SiLU" row has the
same layers).

Outputs: per level, 3 anchors x (x, y, w, h, objectness, classes) channels, anchor-major. A row is
one (level, anchor, y, x), in that order (`rows`); decoding (`AnchorLayout.decode`) as IDetect:
  xy = (2 sigmoid(t_xy) - 0.5 + cell) * stride,   wh = (2 sigmoid(t_wh))^2 * anchor (pixels).

Size figures: the published 36.9M params / 104.7 GFLOPs (YOLOv7) and 6.2M / 13.8 GFLOPs (tiny) at
640 px, 80 classes (paper tables 1-2) count the deploy form (RepConv merged, BatchNorm and implicit
layers folded: the authors' detect.py prints 6,219,709 and 36,905,341 parameters after fusing).
This network, fused, has exactly those counts; GFLOPs measured with torch.utils.flop_counter
(2 x MACs, as thop x 2): tests/unit/test_yolo7_net.py, docs/families.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ..common import ConvBNAct, YOLOStyleModel, build_model, fuse_model_
from ..yolo9.net import RepConvN

STRIDES = (8, 16, 32)
NUM_ANCHORS = 3
Anchors = tuple[tuple[tuple[int, int], ...], ...]  # (w, h) pixels per anchor, per level P3-P5


@dataclass(frozen=True)
class Arch:
    """One size: the widths of cfg/training/yolov7{,-tiny}.yaml."""

    tiny: bool                              # tiny's block forms (see the module docstring)
    stem: tuple[tuple[int, int], ...]       # 3x3 convs (out, stride) before the first ELAN
    backbone: tuple[tuple[int, int], ...]   # ELAN (branch width, out) at P2, P3, P4, P5
    spp: int                                # SPPCSPC width
    neck: tuple[int, int, int]              # PAN outputs at P3, P4, P5 (the head convs double them)
    anchors: Anchors                        # the cfg's anchors (COCO k-means)


ARCHS: dict[str, Arch] = {
    "t": Arch(True, ((32, 2), (64, 2)), ((32, 64), (64, 128), (128, 256), (256, 512)), 256, (64, 128, 256),
              (((10, 13), (16, 30), (33, 23)), ((30, 61), (62, 45), (59, 119)),
               ((116, 90), (156, 198), (373, 326)))),
    "b": Arch(False, ((32, 1), (64, 2), (64, 1), (128, 2)), ((64, 256), (128, 512), (256, 1024), (256, 1024)),
              512, (128, 256, 512),
              (((12, 16), (19, 36), (40, 28)), ((36, 75), (76, 55), (72, 146)),
               ((142, 110), (192, 243), (459, 401)))),
}


def conv(c_in: int, c_out: int, k: int = 1, s: int = 1, leaky: bool = False) -> ConvBNAct:
    """Conv-BN-SiLU, or Conv-BN-LeakyReLU(0.1) for tiny (its cfg passes nn.LeakyReLU(0.1))."""
    block = ConvBNAct(c_in, c_out, k, s)
    if leaky:
        block.act = nn.LeakyReLU(0.1)
    return block


class ELAN(nn.Module):
    """1x1 branches `side` wide, a chain of `depth` 3x3 convs `mid` wide, every `step`-th chain
    output tapped; all concatenated deepest first, then a 1x1 to `c_out`."""

    def __init__(self, c_in: int, side: int, mid: int, c_out: int, depth: int, step: int, leaky: bool):
        super().__init__()
        self.cv1 = conv(c_in, side, leaky=leaky)
        self.cv2 = conv(c_in, side, leaky=leaky)
        self.chain = nn.ModuleList(conv(side if i == 0 else mid, mid, 3, leaky=leaky) for i in range(depth))
        self.step = step
        self.out = conv(2 * side + depth // step * mid, c_out, leaky=leaky)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ys = [self.cv1(x), self.cv2(x)]
        y = ys[-1]
        for i, m in enumerate(self.chain):
            y = m(y)
            if (i + 1) % self.step == 0:
                ys.append(y)
        return self.out(torch.cat(ys[::-1], 1))


class MPDown(nn.Module):
    """Stride-2 transition: [1x1 -> 3x3 s2, 2x2 max-pool -> 1x1], `half` channels each."""

    def __init__(self, c_in: int, half: int):
        super().__init__()
        self.pool_cv = conv(c_in, half)
        self.cv1 = conv(c_in, half)
        self.cv2 = conv(half, half, 3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat((self.cv2(self.cv1(x)), self.pool_cv(F.max_pool2d(x, 2, 2))), 1)


class SPPCSPC(nn.Module):
    """CSP over spatial pyramid pooling: one 1x1 branch through max-pools 5/9/13 (the base form
    wraps them in 3x3 convs), one 1x1 branch straight; concat; 1x1."""

    def __init__(self, c_in: int, c: int, tiny: bool):
        super().__init__()
        self.cv1 = conv(c_in, c, leaky=tiny)
        self.cv2 = conv(c_in, c, leaky=tiny)
        self.pre = nn.Identity() if tiny else nn.Sequential(conv(c, c, 3), conv(c, c))
        self.post = conv(4 * c, c, leaky=tiny) if tiny else nn.Sequential(conv(4 * c, c), conv(c, c, 3))
        self.out = conv(2 * c, c, leaky=tiny)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ys = [self.pre(self.cv1(x))]
        for _ in range(3):  # chained 5x5 pools = the cfg's parallel 5, 9, 13 (same maxima, less work)
            ys.append(F.max_pool2d(ys[-1], 5, 1, 2))
        return self.out(torch.cat((self.post(torch.cat(ys, 1)), self.cv2(x)), 1))


class ImplicitConv(nn.Module):
    """IDetect's output conv of one level: conv(x + a) * m, a and m learned per channel.

    a and m are 1-D so the optimizer keeps them out of weight decay, as the authors' train.py
    does (its no-decay group pg0 takes every `implicit`). `fuse_` folds both into the conv."""

    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, 1)
        self.add: nn.Parameter | None = nn.Parameter(torch.empty(c_in).normal_(0.0, 0.02))  # ImplicitA
        self.mul: nn.Parameter | None = nn.Parameter(torch.empty(c_out).normal_(1.0, 0.02))  # ImplicitM

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.add is None:
            return self.conv(x)
        return self.conv(x + self.add.view(1, -1, 1, 1)) * self.mul.view(1, -1, 1, 1)

    @torch.no_grad()
    def fuse_(self) -> None:
        if self.add is None:
            return
        w = self.conv.weight  # [out, in, 1, 1]
        self.conv.bias.add_(w.flatten(1) @ self.add).mul_(self.mul)
        w.mul_(self.mul.view(-1, 1, 1, 1))
        self.add = self.mul = None


class IDetect(nn.Module):
    """Per level: ImplicitConv to 3 x (5 + nc) channels. Biases start at the authors' priors
    (`_initialize_biases`, on top of torch's default init): objectness log(8 / cells at 640),
    i.e. 8 objects per 640 px image, classes log(0.6 / (nc - 0.99))."""

    def __init__(self, channels: tuple[int, ...], num_classes: int):
        super().__init__()
        no = 5 + num_classes
        self.m = nn.ModuleList(ImplicitConv(c, NUM_ANCHORS * no) for c in channels)
        with torch.no_grad():
            for level, s in zip(self.m, STRIDES):
                bias = level.conv.bias.view(NUM_ANCHORS, no)
                bias[:, 4] += math.log(8 / (640 / s) ** 2)
                bias[:, 5:] += math.log(0.6 / (num_classes - 0.99))

    def forward(self, feats: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        return tuple(m(f) for m, f in zip(self.m, feats))


class YOLO7Net(nn.Module):
    """images [B, 3, H, W] -> per-level raw maps [B, 3 (5 + nc), H/s, W/s], s = 8, 16, 32."""

    def __init__(self, arch: Arch, num_classes: int):
        super().__init__()
        tiny = arch.tiny
        depth, step = (2, 1) if tiny else (4, 2)  # backbone ELANs: tiny taps both of 2 convs, base every 2nd of 4
        c = 3
        stem = []
        for c_out, s in arch.stem:
            stem.append(conv(c, c_out, 3, s, leaky=tiny))
            c = c_out
        self.stem = nn.Sequential(*stem)
        self.stages = nn.ModuleList()
        skips = []
        for i, (side, c_out) in enumerate(arch.backbone):
            down = [] if i == 0 else [nn.MaxPool2d(2, 2) if tiny else MPDown(c, c // 2)]
            self.stages.append(nn.Sequential(*down, ELAN(c, side, side, c_out, depth, step, tiny)))
            c = c_out
            skips.append(c)
        self.spp = SPPCSPC(c, arch.spp, tiny)
        n3, n4, n5 = arch.neck

        def neck_elan(c_in: int, c_out: int) -> ELAN:  # base: 1x1s c_out wide, 3x3s half; tiny: all half
            side = c_out // 2 if tiny else c_out
            return ELAN(c_in, side, c_out // 2, c_out, 2 if tiny else 4, 1, tiny)

        # Top-down: reduce the coarser map, upsample, concat with a 1x1 of the backbone's level.
        self.reduce5, self.lateral4 = conv(arch.spp, n4, leaky=tiny), conv(skips[2], n4, leaky=tiny)
        self.top4 = neck_elan(2 * n4, n4)
        self.reduce4, self.lateral3 = conv(n4, n3, leaky=tiny), conv(skips[1], n3, leaky=tiny)
        self.top3 = neck_elan(2 * n3, n3)
        # Bottom-up: downsample to twice the width, concat with the top-down map of that level.
        self.down3 = conv(n3, 2 * n3, 3, 2, leaky=True) if tiny else MPDown(n3, n3)
        self.out4 = neck_elan(2 * n3 + n4, n4)
        self.down4 = conv(n4, 2 * n4, 3, 2, leaky=True) if tiny else MPDown(n4, n4)
        self.out5 = neck_elan(2 * n4 + arch.spp, n5)
        self.head_convs = nn.ModuleList(conv(n, 2 * n, 3, leaky=True) if tiny else RepConvN(n, 2 * n)
                                        for n in arch.neck)
        self.head = IDetect(tuple(2 * n for n in arch.neck), num_classes)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        x = self.stem(x)
        p2 = self.stages[0](x)
        p3 = self.stages[1](p2)
        p4 = self.stages[2](p3)
        p5 = self.spp(self.stages[3](p4))
        up = F.interpolate
        t4 = self.top4(torch.cat((self.lateral4(p4), up(self.reduce5(p5), scale_factor=2.0, mode="nearest")), 1))
        n3 = self.top3(torch.cat((self.lateral3(p3), up(self.reduce4(t4), scale_factor=2.0, mode="nearest")), 1))
        n4 = self.out4(torch.cat((self.down3(n3), t4), 1))
        n5 = self.out5(torch.cat((self.down4(n4), p5), 1))
        return self.head([m(f) for m, f in zip(self.head_convs, (n3, n4, n5))])


# --------------------------------------------------------------------------- rows and decoding
class Level(NamedTuple):
    start: int   # first row of the level
    h: int
    w: int
    stride: int


class AnchorLayout(NamedTuple):
    """Per-row constants of one input size: the rows are (level, anchor, y, x) in that order."""

    cells: torch.Tensor    # [A, 2] (x, y) cell of the row, grid units
    anchors: torch.Tensor  # [A, 2] (w, h) of the row's anchor, pixels
    strides: torch.Tensor  # [A, 1]
    level: torch.Tensor    # [A] level index 0..2
    levels: tuple[Level, ...]
    # The same per level, on the device, for work vectorised over the levels (the assigner):
    sizes: torch.Tensor    # [levels, anchors, 2] anchor (w, h) pixels
    grids: torch.Tensor    # [levels, 2] (w, h) in cells
    level_strides: torch.Tensor  # [levels, 1]
    starts: torch.Tensor   # [levels] first row, int64

    def decode(self, t: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Raw (t_x, t_y, t_w, t_h) [..., N, 4] -> xyxy pixels, as IDetect decodes; `rows` [..., N]
        picks the layout rows the N predictions sit at (default: all rows, in order)."""
        cells, anchors, strides = ((self.cells, self.anchors, self.strides) if rows is None
                                   else (self.cells[rows], self.anchors[rows], self.strides[rows]))
        s = t.sigmoid() * 2.0
        xy = (s[..., :2] - 0.5 + cells) * strides
        half = s[..., 2:].square() * anchors * 0.5
        return torch.cat((xy - half, xy + half), -1)


class LayoutCache:
    """AnchorLayout per (feature shapes, device), built once on the device: no sync in the step."""

    def __init__(self, anchors: Anchors):
        self.anchors = anchors
        self._cache: dict[tuple, AnchorLayout] = {}

    def __call__(self, feats: tuple[torch.Tensor, ...] | list[torch.Tensor]) -> AnchorLayout:
        shapes = tuple((int(f.shape[-2]), int(f.shape[-1])) for f in feats)
        device = feats[0].device
        key = (shapes, device)
        if key not in self._cache:
            self._cache[key] = self._build(shapes, device)
        return self._cache[key]

    def _build(self, shapes: tuple[tuple[int, int], ...], device: torch.device) -> AnchorLayout:
        sizes = torch.tensor(self.anchors, dtype=torch.float32, device=device)  # copies once per shape
        cells, anchors, strides, level, levels, start = [], [], [], [], [], 0
        for i, ((h, w), s) in enumerate(zip(shapes, STRIDES)):
            ys, xs = torch.meshgrid(torch.arange(h, device=device, dtype=torch.float32),
                                    torch.arange(w, device=device, dtype=torch.float32), indexing="ij")
            cells.append(torch.stack((xs, ys), -1).reshape(1, h * w, 2).expand(NUM_ANCHORS, -1, -1).reshape(-1, 2))
            anchors.append(sizes[i].unsqueeze(1).expand(-1, h * w, -1).reshape(-1, 2))
            n = NUM_ANCHORS * h * w
            strides.append(torch.full((n, 1), float(s), device=device))
            level.append(torch.full((n,), i, device=device, dtype=torch.long))
            levels.append(Level(start, h, w, s))
            start += n
        per_level = torch.tensor([(lv.w, lv.h, lv.stride, lv.start) for lv in levels], device=device)
        return AnchorLayout(torch.cat(cells), torch.cat(anchors), torch.cat(strides), torch.cat(level),
                            tuple(levels), sizes, per_level[:, :2].float(), per_level[:, 2:3].float(),
                            per_level[:, 3])


def rows(preds: tuple[torch.Tensor, ...] | list[torch.Tensor], dtype: torch.dtype | None = None) -> torch.Tensor:
    """Per-level maps [B, 3 (5 + nc), H, W] (any memory format) -> one contiguous [B, A, 5 + nc],
    rows (level, anchor, y, x) as AnchorLayout orders them; cast to `dtype` on the same copy."""
    x = torch.cat([p.unflatten(1, (NUM_ANCHORS, -1)).permute(0, 1, 3, 4, 2).flatten(1, 3) for p in preds], 1)
    return x.to(dtype or x.dtype, memory_format=torch.contiguous_format)


class YOLO7Model(YOLOStyleModel):
    """Training model (families/base.py contract): `capturable` is the whole network.

    `predict` gives one row per anchor: 3 per cell (`rows_per_cell`)."""

    rows_per_cell = NUM_ANCHORS

    def __init__(self, size: str, num_classes: int):
        super().__init__()
        self.size = size
        self.num_classes = num_classes
        self.strides = STRIDES
        self.net = YOLO7Net(ARCHS[size], num_classes)
        self.layouts = LayoutCache(ARCHS[size].anchors)

    def decode(self, preds: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """Raw maps -> [B, A, 4 + nc]: xyxy boxes in input pixels, then objectness x class scores.

        One class: the objectness alone, as the authors' NMS scores it (their loss leaves the class
        logit untrained then). Decoded in float32 even under autocast: the anchors reach 459 px."""
        layout = self.layouts(preds)
        with torch.autocast(preds[0].device.type, enabled=False):
            x = rows(preds, torch.float32)
            boxes = layout.decode(x[..., :4])
            obj = x[..., 4:5].sigmoid()
            scores = obj if self.num_classes == 1 else obj * x[..., 5:].sigmoid()
            return torch.cat((boxes, scores), -1)

    def fuse(self) -> YOLO7Model:
        """Deploy form, in place: BN folded into the convs, RepConvs merged, implicit layers folded
        into the head convs. Inference only: the model is put in eval mode."""
        fuse_model_(self.eval().net)
        return self


def build(size: str, num_classes: int) -> YOLO7Model:
    return build_model(YOLO7Model, "YOLOv7", ARCHS, size, num_classes)
