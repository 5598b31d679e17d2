"""LingBot-Vision s for semantic segmentation: the ViT-S/16 backbone (vit.py) and a linear head.

The head is DINOv3's linear segmentation probe, the dense readout LingBot-Vision's backbones are
made for (facebookresearch/dinov3, `eval/segmentation/models/heads/linear_head.py` `LinearHead`
with `configs/config-ade20k-linear-training.yaml`: `backbone_out_layers: LAST`,
`use_backbone_norm: True`, `use_batchnorm: True`, `use_cls_token: False`): the last block's patch
tokens after the backbone's final norm, as a [B, 384, H/16, W/16] map, then BatchNorm and a 1 x 1
convolution to the class logits (weight normal std 0.01, bias 0). The logits stay at stride 16;
the loss and `predict` upsample them bilinearly to the mask / input size (families/segment.py), as
DINOv3's training step and `LinearHead.predict` do.

Left out: the probe's Dropout2d(0.1) before the BatchNorm. A dropout inside the captured region
replays its own random stream under CUDA graphs; without it the graphed step computes what the
eager one does, to float32 rounding.
"""

from __future__ import annotations

import torch
from torch import nn

from ..common import build_model
from ..segment import SegmentationModel
from .vit import PATCH, ViT

SIZES = ("s",)
HEAD_INIT_STD = 0.01


class LinearHead(nn.Module):
    """Patch features [B, C, h, w] -> logits [B, classes, h, w]: BatchNorm, then a 1 x 1 convolution."""

    def __init__(self, channels: int, num_classes: int):
        super().__init__()
        self.bn = nn.BatchNorm2d(channels)
        self.conv = nn.Conv2d(channels, num_classes, 1)
        nn.init.normal_(self.conv.weight, std=HEAD_INIT_STD)
        nn.init.zeros_(self.conv.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(self.bn(x))


class LingBotSegNet(nn.Module):
    """Normalised images [B, 3, H, W] -> logits [B, classes, H/16, W/16]."""

    def __init__(self, num_classes: int):
        super().__init__()
        self.backbone = ViT()
        self.head = LinearHead(self.backbone.dim, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        tokens = self.backbone(images)
        b, h, w = images.shape[0], images.shape[-2] // PATCH, images.shape[-1] // PATCH
        patches = tokens[:, self.backbone.prefix:].transpose(1, 2).reshape(b, self.backbone.dim, h, w)
        return self.head(patches)


class LingBotVision(SegmentationModel):
    """Training model: the network behind the ImageNet normalisation (families/segment.py); the
    whole of it is the capturable region."""

    def __init__(self, size: str, num_classes: int):
        super().__init__(LingBotSegNet(num_classes), num_classes)

    @property
    def backbone(self) -> ViT:
        """What trains at `backbone_lr x lr0` (FamilySpec.backbone): `backbone_lr=0` freezes it, the
        linear probe's setting for a pretrained backbone (AdamW's decoupled decay is scaled by the
        learning rate too, so nothing of it moves)."""
        return self.net.net.backbone


def build(size: str, num_classes: int) -> LingBotVision:
    return build_model(LingBotVision, "LingBot-Vision", SIZES, size, num_classes)
