"""What the classification families share: the training model around a network, and the loss.

The network maps normalised images to logits; `Classifier` puts the input normalisation in front
(ImageNet mean and std, the statistics torchvision's and timm's ImageNet recipes normalise with),
so the step hands it the same [0, 1] images it hands a detector, and the whole thing, from
normalisation to logits, is one static-shape region for CUDA graphs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .common import PerImageLoss, YOLOStyleModel

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class Normalized(nn.Module):
    """images in [0, 1] -> (logits,): the capturable region (a tuple, as the contract says)."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.net((images - self.mean) / self.std),)


class Classifier(YOLOStyleModel):
    """Training model (families/base.py contract) for a classification network: as for the
    single-stage detectors, the whole network (here from the normalisation to the logits) is the
    capturable region and nothing eager follows it."""

    def __init__(self, net: nn.Module, num_classes: int):
        super().__init__()
        self.net = Normalized(net)
        self.num_classes = int(num_classes)

    def decode(self, raw: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """[B, classes] probabilities."""
        return raw[0].float().softmax(dim=1)


class ClassifierLoss(PerImageLoss):
    """Cross-entropy with label smoothing, one term per image; the normaliser counts images, so
    the batch loss is B * the mean cross-entropy (and the DDP form stays exact)."""

    item_names = ("cls",)

    def __init__(self, label_smoothing: float = 0.0):
        self.label_smoothing = float(label_smoothing)

    def _per_image(self, preds: tuple[torch.Tensor, ...], targets) -> tuple[torch.Tensor, torch.Tensor]:
        logits = preds[0].float()
        ce = F.cross_entropy(logits, targets.labels, label_smoothing=self.label_smoothing, reduction="none")
        return ce[:, None], torch.ones_like(ce)


def criterion(model: nn.Module, cfg) -> ClassifierLoss:
    return ClassifierLoss(getattr(cfg, "label_smoothing", 0.0))
