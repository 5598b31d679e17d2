"""ResNet family declaration (registered by families/__init__.py)."""

from __future__ import annotations

from ..base import CapturePlan, FamilySpec
from ..classifier import criterion
from .net import build

SPEC = FamilySpec(
    name="resnet",
    display="ResNet",
    sizes=("18",),
    build=build,
    criterion=criterion,
    weights_prefix="LibreResNet",
    joiner="",                      # resnet18, as everyone writes it
    tasks=("classify",),
    # torchvision's ResNet-18 recipe (pytorch/vision references/classification, the IMAGENET1K_V1
    # weights): SGD momentum 0.9 (not Nesterov there), lr 0.1 at batch 256, weight decay 1e-4, x0.1
    # every 30 of 90 epochs, no warmup, no label smoothing; RandomResizedCrop(224) + flip for
    # training, resize 256 + centre crop 224 for validation. lr0 is 0.1 scaled to our nominal batch
    # of 64 by the linear rule (Goyal et al., 2017: 0.1 * 64 / 256); `step` is the x0.1 stages.
    defaults={"imgsz": 224, "optimizer": "sgd", "lr0": 0.025, "momentum": 0.9, "weight_decay": 1e-4,
              "lr_schedule": "step", "lrf": 0.01, "warmup_epochs": 0.0, "label_smoothing": 0.0,
              "hsv_h": 0.0, "hsv_s": 0.0, "hsv_v": 0.0, "mosaic": 0.0, "mixup": 0.0, "no_aug_epochs": 0},
    capture=CapturePlan("network", note="the whole network; the loss stays eager"),
)
