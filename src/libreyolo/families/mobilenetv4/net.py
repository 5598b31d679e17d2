"""MobileNetV4 (Qin et al., 2024, arXiv 2404.10518) as timm defines it; the head is sized to the
dataset. timm is imported here only, so the other families never pay its import time."""

from __future__ import annotations

from ..classifier import Classifier
from ..common import build_model

ARCHS = {"s": "mobilenetv4_conv_small"}
# Dropout before the classifier: 0.3 in the authors' Conv-S ImageNet config (tensorflow/models,
# official/vision/configs/experiments/image_classification/imagenet_mobilenetv4_conv_small_tpu.yaml).
DROPOUT = 0.3


class MobileNetV4(Classifier):
    def __init__(self, size: str, num_classes: int):
        import timm

        super().__init__(timm.create_model(ARCHS[size], pretrained=False, num_classes=num_classes,
                                           drop_rate=DROPOUT), num_classes)


def build(size: str, num_classes: int) -> MobileNetV4:
    return build_model(MobileNetV4, "MobileNetV4", ARCHS, size, num_classes)
