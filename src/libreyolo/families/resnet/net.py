"""ResNet (He et al., 2016) as torchvision defines it; the head is sized to the dataset."""

from __future__ import annotations

from ..classifier import Classifier

ARCHS = {"18": "resnet18"}


def build(size: str, num_classes: int) -> Classifier:
    import torchvision

    return Classifier(getattr(torchvision.models, ARCHS[size])(weights=None, num_classes=num_classes), num_classes)
