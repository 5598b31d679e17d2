"""ResNet (He et al., 2016) as torchvision defines it; the head is sized to the dataset."""

from __future__ import annotations

from ..classifier import Classifier
from ..common import build_model

ARCHS = {"18": "resnet18"}


class ResNet(Classifier):
    def __init__(self, size: str, num_classes: int):
        import torchvision

        super().__init__(getattr(torchvision.models, ARCHS[size])(weights=None, num_classes=num_classes), num_classes)


def build(size: str, num_classes: int) -> ResNet:
    return build_model(ResNet, "ResNet", ARCHS, size, num_classes)
