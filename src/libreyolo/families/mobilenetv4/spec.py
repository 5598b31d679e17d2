"""MobileNetV4 family declaration (registered by families/__init__.py)."""

from __future__ import annotations

from ..base import CapturePlan, FamilySpec
from ..classifier import criterion
from .net import build

SPEC = FamilySpec(
    name="mobilenetv4",
    display="MobileNetV4",
    sizes=("s",),
    build=build,
    criterion=criterion,
    weights_prefix="LibreMobileNetV4",
    aliases=("mnv4",),
    size_names={"small": "s", "convsmall": "s", "convs": "s"},
    tasks=("classify",),
    # The authors' Conv-S ImageNet recipe (tensorflow/models, official/vision/configs/experiments/
    # image_classification/imagenet_mobilenetv4_conv_small_tpu.yaml): AdamW lr 0.002, beta1 0.6,
    # weight decay 0.01, cosine decay, 5 warmup epochs, label smoothing 0.1, dropout 0.3 (net.py),
    # weight EMA. AdamW's lr is kept as published: its step size does not grow with the batch as
    # SGD's does. Brightness and saturation jitter stand in for the recipe's RandAugment (magnitude
    # 9); hue jitter stays off: it costs 7.6 ms per 224 px image on a CPU core, three times the
    # rest of the pipeline (decode, crop, flip, brightness, saturation) together.
    defaults={"imgsz": 224, "optimizer": "adamw", "lr0": 0.002, "momentum": 0.6, "weight_decay": 0.01,
              "lr_schedule": "cosine", "lrf": 0.01, "warmup_epochs": 5.0, "warmup_bias_lr": 0.0,
              "label_smoothing": 0.1, "hsv_h": 0.0, "hsv_s": 0.4, "hsv_v": 0.4,
              "mosaic": 0.0, "mixup": 0.0, "no_aug_epochs": 0},
    capture=CapturePlan("network", note="the whole network; the loss stays eager"),
)
