"""YOLOv7: ELAN network with the anchor-based implicit head, its OTA assigner, loss and family spec."""

from .loss import YOLO7Loss, criterion
from .net import ARCHS, YOLO7Model, build

__all__ = ["ARCHS", "YOLO7Loss", "YOLO7Model", "build", "criterion"]
