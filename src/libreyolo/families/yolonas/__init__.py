"""YOLO-NAS (QARepVGG backbone, PAN neck, DFL heads): network, PPYOLOE-style loss, family spec."""

from .loss import YOLONASLoss, criterion
from .net import ARCHS, YOLONASModel, build

__all__ = ["ARCHS", "YOLONASLoss", "YOLONASModel", "build", "criterion"]
