"""YOLOX: CSPDarknet + PAFPN + decoupled anchor-free head, SimOTA assigner, loss and family spec."""

from .loss import YOLOXLoss, criterion
from .net import ARCHS, YOLOXModel, build

__all__ = ["ARCHS", "YOLOXLoss", "YOLOXModel", "build", "criterion"]
