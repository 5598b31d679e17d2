"""YOLOv9 (GELAN, inference form): network, task-aligned assigner, loss, and the family spec."""

from .loss import YOLO9Loss, criterion
from .net import ARCHS, YOLO9Model, build

__all__ = ["ARCHS", "YOLO9Loss", "YOLO9Model", "build", "criterion"]
