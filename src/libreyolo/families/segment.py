"""What the semantic-segmentation families share: the training model around a network, and the loss.

A subclass hands `SegmentationModel` its network: normalised images [B, 3, S, S] -> per-class
logits [B, C, S / r, S / r] at the network's own output stride r (SegFormer: 4). The model puts
the input normalisation in front (ImageNet mean and std, as the classifiers do, families/
classifier.py), so the step hands it [0, 1] images and the whole network, from the normalisation
to the logits, is one static-shape region for CUDA graphs (`capturable`); nothing eager follows.

- `capturable(images [B, 3, S, S] in [0, 1]) -> (logits [B, C, S/r, S/r],)`: what is captured;
- `forward_train(captured, targets) -> (logits,)`: the captured tuple itself;
- `predict(images) -> [B, C, S, S]`: softmax probabilities, the logits upsampled (bilinear,
  align_corners=False, as mmsegmentation's `resize`) to the input size (tasks/segment.py);
- `num_classes`.

`SegmentationLoss` is per-pixel cross-entropy over the valid pixels in the engine's loss form
(families/common.py `PerImageLoss`): raw_i = the summed cross-entropy of image i's valid pixels,
norm_i = its valid-pixel count, loss = B * sum_i raw_i / max(sum_i norm_i, 1), i.e. B x the mean
cross-entropy per valid pixel of the whole batch; `GlobalLoss` keeps that exact under DDP (the
pixel count is summed over the ranks). mmsegmentation's CrossEntropyLoss averages over every
pixel, ignored ones included, unless `avg_non_ignore=True`; we average over the valid ones, which
keeps a batch's loss independent of how much of it is padding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .classifier import Normalized
from .common import PerImageLoss, YOLOStyleModel

# The unlabelled-pixel value of the convention of mmsegmentation, Cityscapes' trainIds and ADE20K's
# reduced labels: the loss's default, and a dataset's mask value unless its yaml says otherwise
# (data/segment.py).
IGNORE_INDEX = 255


class SegmentationModel(YOLOStyleModel):
    """Training model (families/base.py contract) for a segmentation network `net`
    (normalised images -> logits at the network's output stride)."""

    def __init__(self, net: nn.Module, num_classes: int):
        super().__init__()
        self.net = Normalized(net)
        self.num_classes = int(num_classes)

    def predict(self, images: torch.Tensor) -> torch.Tensor:
        """[B, C, S, S] per-pixel class probabilities at the input size."""
        return upsample(self.net(images)[0].float(), images.shape[-2:]).softmax(dim=1)


def upsample(logits: torch.Tensor, size) -> torch.Tensor:
    """Logits [B, C, h, w] resized to `size` (bilinear, align_corners=False); unchanged when equal."""
    if tuple(logits.shape[-2:]) == tuple(size):
        return logits
    return F.interpolate(logits, size=tuple(size), mode="bilinear", align_corners=False)


class SegmentationLoss(PerImageLoss):
    """Cross-entropy per valid pixel (mask != ignore_index), the logits upsampled to the mask size."""

    item_names = ("ce",)

    def __init__(self, ignore_index: int = IGNORE_INDEX):
        self.ignore_index = int(ignore_index)

    def _per_image(self, preds: tuple[torch.Tensor, ...], targets) -> tuple[torch.Tensor, torch.Tensor]:
        masks = targets.masks.long()
        logits = upsample(preds[0].float(), masks.shape[-2:])
        ce = F.cross_entropy(logits, masks, ignore_index=self.ignore_index, reduction="none")  # 0 where ignored
        valid = (masks != self.ignore_index).sum((1, 2))
        return ce.sum((1, 2))[:, None], valid.to(ce.dtype)


def criterion(model: nn.Module, cfg) -> SegmentationLoss:
    return SegmentationLoss(getattr(cfg, "ignore_index", IGNORE_INDEX))
