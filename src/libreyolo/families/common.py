"""Building blocks shared by the YOLO-style families (YOLOv9 first; YOLOX and RTMDet reuse them).

Box conventions used throughout: boxes are xyxy; "distances" are (left, top, right, bottom) from
an anchor point; anchor points and distances are in grid units (pixels / stride) unless a name
says `_px`. Every helper here is shape-static and host-sync-free so it can sit in the training
hot path.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import CheckpointError, ConfigError

# The YOLO recipes (YOLOv5 onwards, YOLOv9 included) run BatchNorm with eps 1e-3 and momentum 0.03:
# the running stats then average over ~33 steps, which keeps them stable under the small
# per-GPU batches these detectors train with.
BN_EPS = 1e-3
BN_MOMENTUM = 0.03


class ConvBNAct(nn.Module):
    """Conv2d (no bias) -> BatchNorm -> SiLU; `fuse_()` folds the BN into the conv for inference."""

    def __init__(self, c_in: int, c_out: int, k: int = 1, s: int = 1, g: int = 1, act: bool = True):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, k, s, k // 2, groups=g, bias=False)
        self.bn: nn.Module = nn.BatchNorm2d(c_out, eps=BN_EPS, momentum=BN_MOMENTUM)
        self.act: nn.Module = nn.SiLU() if act else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))

    @torch.no_grad()
    def fuse_(self) -> None:
        if isinstance(self.bn, nn.Identity):
            return
        weight, bias = fold_bn(self.conv.weight, self.bn)
        conv = self.conv
        self.conv = nn.Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride,
                              conv.padding, groups=conv.groups, bias=True).to(weight.device)
        self.conv.weight.copy_(weight)
        self.conv.bias.copy_(bias)
        self.bn = nn.Identity()


def drop_batch_counters_(model: nn.Module) -> nn.Module:
    """Remove the BatchNorm `num_batches_tracked` counters that nothing reads; returns `model`.

    In training mode every BatchNorm adds 1 to its counter on each forward, one kernel launch per
    norm (221 per YOLOv9-t forward, `benchmarks/op_count.py`), and the EMA copies the counters
    after every update. The count only matters with `momentum=None` (a cumulative average), so
    norms with a momentum lose the buffer and torch skips the increment. A state dict that still
    carries the counters (an older checkpoint) loads: the key is dropped on the way in.
    """
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.momentum is not None \
                and m.num_batches_tracked is not None:
            m.num_batches_tracked = None
            m.register_load_state_dict_pre_hook(_drop_counter_key)
    return model


def _drop_counter_key(module: nn.Module, state_dict: dict, prefix: str, *_) -> None:
    state_dict.pop(prefix + "num_batches_tracked", None)


def fold_bn(weight: torch.Tensor, bn: nn.BatchNorm2d) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight, bias) of one conv equal to `bn(conv(x))` in eval mode (running statistics)."""
    scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    return weight * scale.reshape(-1, 1, 1, 1), bn.bias - bn.running_mean * scale


def fuse_model_(model: nn.Module) -> nn.Module:
    """Fold every foldable block (anything with `fuse_`) into its deploy form, in place."""
    for module in list(model.modules()):
        if hasattr(module, "fuse_"):
            module.fuse_()
    return model


def prior_prob_bias(num_classes: int, stride: int, img_size: int = 640, objects: float = 5.0) -> float:
    """Classification bias so the initial sigmoid equals the prior of ~`objects` boxes per image.

    With `num_classes` classes and (img_size / stride)^2 cells per level, a cell is positive for
    a given class with probability objects / nc / cells; starting the logits there keeps the
    early BCE from being swamped by thousands of easy negatives.
    """
    return math.log(objects / num_classes / (img_size / stride) ** 2)


def build_model(model_cls: type[nn.Module], display: str, sizes, size: str, num_classes: int) -> nn.Module:
    """What every family's `build(size, num_classes)` does: one-line errors for bad arguments,
    then `model_cls(size, num_classes)` with its unused BatchNorm counters dropped."""
    if size not in sizes:
        raise ConfigError(f"unknown {display} size {size!r}; choose one of {', '.join(sizes)}")
    if not isinstance(num_classes, int) or num_classes < 1:
        raise ConfigError(f"num_classes must be a positive integer, got {num_classes!r}")
    return drop_batch_counters_(model_cls(size, num_classes))


# --------------------------------------------------------------------------- anchors / decode
def make_anchors(shapes: tuple[tuple[int, int], ...], strides: tuple[int, ...], dtype: torch.dtype,
                 device: torch.device, offset: float = 0.5) -> tuple[torch.Tensor, torch.Tensor]:
    """Anchor centres [A, 2] (x, y, grid units) and strides [A, 1], levels in order, row-major."""
    points, stride_list = [], []
    for (h, w), s in zip(shapes, strides):
        ys = torch.arange(h, device=device, dtype=dtype) + offset
        xs = torch.arange(w, device=device, dtype=dtype) + offset
        gy, gx = torch.meshgrid(ys, xs, indexing="ij")
        points.append(torch.stack((gx, gy), -1).reshape(-1, 2))
        stride_list.append(torch.full((h * w, 1), float(s), device=device, dtype=dtype))
    return torch.cat(points), torch.cat(stride_list)


class AnchorCache:
    """Anchors per (feature shapes, dtype, device): built once with device-side arange, no sync.

    `offset` 0.5 gives cell centres (YOLOv9), 0.0 cell corners (YOLOX grids, RTMDet priors);
    `pixels=True` returns the points in input pixels instead of grid units (RTMDet).
    """

    def __init__(self, strides: tuple[int, ...], offset: float = 0.5, pixels: bool = False):
        self.strides = tuple(strides)
        self.offset, self.pixels = offset, pixels
        self._cache: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, feats: tuple[torch.Tensor, ...] | list[torch.Tensor],
                 dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        shapes = tuple((int(f.shape[-2]), int(f.shape[-1])) for f in feats)
        device = feats[0].device
        key = (shapes, dtype, device)
        if key not in self._cache:
            points, strides = make_anchors(shapes, self.strides, dtype, device, self.offset)
            self._cache[key] = (points * strides if self.pixels else points, strides)
        return self._cache[key]


def flatten_levels(preds: tuple[torch.Tensor, ...] | list[torch.Tensor],
                   dtype: torch.dtype | None = None) -> torch.Tensor:
    """Per-level head maps [B, C, Hi, Wi] (any memory format) -> one contiguous [B, A, C].

    Contiguous on purpose: the softmax/BCE that follow reduce over the last dim, which would be a
    strided (slow) kernel on the transposed view. The cast to `dtype` rides on the same copy.
    """
    x = torch.cat([p.flatten(2) for p in preds], 2).transpose(1, 2)
    return x.to(dtype or x.dtype, memory_format=torch.contiguous_format)


def dfl_decode(logits: torch.Tensor, reg_max: int) -> torch.Tensor:
    """[..., 4 * reg_max] bin logits -> [..., 4] expected distances (softmax over the bins)."""
    probs = logits.unflatten(-1, (4, reg_max)).softmax(-1)
    bins = torch.arange(reg_max, device=logits.device, dtype=probs.dtype)
    return probs @ bins


def dist2bbox(dist: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
    """ltrb distances [..., 4] around anchor points [..., 2] -> xyxy [..., 4]."""
    lt, rb = dist.chunk(2, -1)
    return torch.cat((points - lt, points + rb), -1)


def bbox2dist(points: torch.Tensor, boxes: torch.Tensor, max_dist: float) -> torch.Tensor:
    """xyxy boxes [..., 4] -> ltrb distances from points [..., 2], clamped to the DFL range.

    The clamp stops just below `max_dist` so the upper DFL bin (floor + 1) stays in range.
    """
    x1y1, x2y2 = boxes.chunk(2, -1)
    return torch.cat((points - x1y1, x2y2 - points), -1).clamp(0, max_dist - 0.01)


# --------------------------------------------------------------------------- IoU
def bbox_iou(box1: torch.Tensor, box2: torch.Tensor, ciou: bool = False,
             eps: float = 1e-7) -> torch.Tensor:
    """IoU (or CIoU) of xyxy boxes, broadcasting over the leading dims: [..., 4] x [..., 4] -> [...].

    Works per coordinate, so a pairwise call ([B, M, 1, 4] with [B, 1, A, 4]) allocates only
    [B, M, A] intermediates, never a [B, M, A, 4] one. CIoU (Zheng et al., 2020) subtracts the
    normalised centre distance and an aspect-ratio consistency term from IoU.
    """
    # Per-box terms first (cheap in a pairwise call: [B, M, 1] or [B, 1, A]); every op that
    # mixes box1 and box2 is a full-size [B, M, A] kernel, so those are kept few.
    b1x1, b1y1, b1x2, b1y2 = box1.unbind(-1)
    b2x1, b2y1, b2x2, b2y2 = box2.unbind(-1)
    w1, h1 = b1x2 - b1x1, (b1y2 - b1y1) + eps
    w2, h2 = b2x2 - b2x1, (b2y2 - b2y1) + eps
    inter = ((torch.minimum(b1x2, b2x2) - torch.maximum(b1x1, b2x1)).clamp(min=0)
             * (torch.minimum(b1y2, b2y2) - torch.maximum(b1y1, b2y1)).clamp(min=0))
    iou = inter / (w1 * h1 + w2 * h2 - inter + eps)
    if not ciou:
        return iou
    c2 = ((torch.maximum(b1x2, b2x2) - torch.minimum(b1x1, b2x1)).square()  # enclosing diagonal^2
          + (torch.maximum(b1y2, b2y2) - torch.minimum(b1y1, b2y1)).square() + eps)
    rho2 = (((b2x1 + b2x2) * 0.5 - (b1x1 + b1x2) * 0.5).square()  # centre distance^2
            + ((b2y1 + b2y2) * 0.5 - (b1y1 + b1y2) * 0.5).square())
    # v = 4 / pi^2 (atan(w2 / h2) - atan(w1 / h1))^2, the 2 / pi folded into the per-box angles.
    v = (torch.atan(w2 / h2) * (2 / math.pi) - torch.atan(w1 / h1) * (2 / math.pi)).square()
    with torch.no_grad():  # alpha is a trade-off weight, not something to differentiate through
        alpha = v / (v - iou + (1 + eps))
    return iou - (rho2 / c2 + v * alpha)


def dfl_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Distribution focal loss (GFL, Li et al., 2020), per side then averaged: -> [...].

    logits [..., 4, R]; target [..., 4] continuous distances in [0, R - 1). The target is split
    between its two neighbouring integer bins with linear weights, and the loss is the weighted
    cross-entropy against both.
    """
    logp = F.log_softmax(logits, -1)
    left = target.long()
    w_left = (left + 1).to(target.dtype) - target
    lp_left = logp.gather(-1, left.unsqueeze(-1)).squeeze(-1)
    lp_right = logp.gather(-1, (left + 1).unsqueeze(-1)).squeeze(-1)
    return -(lp_left * w_left + lp_right * (1 - w_left)).mean(-1)


# --------------------------------------------------------------------------- the shared contract
class YOLOStyleModel(nn.Module):
    """The training-model contract for single-stage families (families/base.py), the classifiers
    included: `self.net` is the whole network, so it is what CUDA graphs capture and nothing eager
    remains after it.
    Subclasses set `self.net` and define `decode(raw outputs)`, the task's predict form (detection:
    [B, A, 4 + nc]; classification: [B, classes] probabilities)."""

    net: nn.Module

    @property
    def capturable(self) -> nn.Module:
        return self.net

    def forward_train(self, captured: tuple[torch.Tensor, ...], targets=None) -> tuple[torch.Tensor, ...]:
        return captured

    def forward(self, images: torch.Tensor):
        return self.net(images) if self.training else self.predict(images)

    def predict(self, images: torch.Tensor) -> torch.Tensor:
        return self.decode(self.net(images))


class DFLDetector(YOLOStyleModel):
    """An anchor-free single-stage detector whose head gives, per anchor point, 4 x `bins`
    distance-bin logits (distribution focal loss: Li et al., arXiv 2006.04388) and then the class
    logits: YOLOv9 and YOLO-NAS. `forward(images)` returns the raw per-level head maps in train mode
    and `predict(images)` in eval mode; `self.net` is the whole network (what CUDA graphs capture).

    `reg_max` keeps each family's own meaning (the loss reads it): YOLOv9's is the bin count,
    YOLO-NAS's the largest distance, one less than its bins."""

    def __init__(self, size: str, num_classes: int, net: nn.Module, strides: tuple[int, ...],
                 reg_max: int, bins: int):
        super().__init__()
        self.size = size
        self.num_classes = num_classes
        self.strides = strides
        self.reg_max = reg_max
        self.bins = bins
        self.net = net
        self.anchors = AnchorCache(strides)

    def decode(self, preds: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """Raw head maps -> [B, A, 4 + nc]: xyxy boxes in input pixels, then sigmoid scores.

        Decoded in float32 even under autocast: half precision would cost ~0.5 px at 640.
        """
        points, strides = self.anchors(preds, torch.float32)
        with torch.autocast(preds[0].device.type, enabled=False):
            x = flatten_levels(preds, torch.float32)
            dist = dfl_decode(x[..., : 4 * self.bins], self.bins)
            boxes = dist2bbox(dist, points) * strides
            return torch.cat((boxes, x[..., 4 * self.bins:].sigmoid()), -1)

    def fuse(self) -> DFLDetector:
        """Deploy form, in place: the network's re-parameterisable blocks merged (`fuse_model_`),
        BN folded into the convs. Inference only: the folded BN no longer trains, so the model is
        put in eval mode."""
        fuse_model_(self.eval().net)
        return self


class PerImageLoss:
    """loss = B * sum_i raw_i / max(sum_i norm_i, 1), from per-image sums computed in float32.

    Subclasses implement `_per_image(preds, targets) -> (raw [B, K] gain-weighted sums,
    norm [B])`. Keeping every term a per-image sum with one batch normaliser makes the
    vectorised loss testable one image at a time (tests/unit/test_families.py).
    """

    item_names: tuple[str, ...]

    def __call__(self, preds: tuple[torch.Tensor, ...], targets) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (scalar loss already multiplied by the batch size, detached gain-weighted items [K])."""
        raw, norm = self.per_image(preds, targets)
        items = raw.sum(0) / norm.sum().clamp(min=1)
        return items.sum() * raw.shape[0], items.detach()

    def per_image(self, preds: tuple[torch.Tensor, ...], targets) -> tuple[torch.Tensor, torch.Tensor]:
        # float32 throughout even when called inside an autocast region (matmuls and exps in the
        # decode would otherwise drop to half precision).
        with torch.autocast(preds[0].device.type, enabled=False):
            return self._per_image(preds, targets)


def load_published_part(part: nn.Module, what: str, name: str, fetch_weights, convert, source: str) -> str:
    """A family's published part weights (`FamilySpec.pretrained`): `name` fetched through
    `fetch_weights` (resolve.fetch_weights, (name, check) -> (path or None, why not)), `convert(path)`
    our state dict for `part`, which must fill it exactly (CheckpointError in one line otherwise).
    Returns the one line that says what happened; offline, `part` keeps its random init."""
    def load(path) -> None:
        ours = convert(path)
        own = part.state_dict()
        if ours.keys() != own.keys() or any(ours[k].shape != own[k].shape for k in own):
            raise CheckpointError(f"'{path}' does not fit {what} "
                                  f"({len(ours)} tensors for its {len(own)}, or other shapes)")
        part.load_state_dict(ours)

    path, problem = fetch_weights(name, load)
    if path is None:
        return f"{problem}; {what} starts from random init"
    load(path)
    return f"{what} starts from the {source} weights {path}"
