"""YOLOX family declaration (registered by families/__init__.py)."""

from __future__ import annotations

from ..base import CapturePlan, FamilySpec
from .loss import criterion
from .net import build

SPEC = FamilySpec(
    name="yolox",
    display="YOLOX",
    sizes=("n", "t", "s", "m", "l", "x"),
    build=build,
    criterion=criterion,
    weights_prefix="LibreYOLOX",
    # No alias: "yolox" itself is the common spelling. parse_arch matches the longest family
    # spelling first, so "yolox-s" can never be read as some shorter family name plus a size.
    size_names={"nano": "n", "tiny": "t"},
    # Only where the published YOLOX recipe (exps/default + yolox_base.py of the official repo)
    # differs from the generic defaults. Learning rate: YOLOX uses 0.01 per 64 images, which is
    # lr0 0.01 at our nominal batch nbs 64, with SGD nesterov (named here: the generic default
    # `optimizer=auto` would pick AdamW for short runs); weight decay 5e-4 already matches.
    # - momentum 0.9, constant (no momentum warmup), and no gradient clipping;
    # - 5 warmup epochs from lr 0 for every group (warmup_bias_lr 0), then cosine to 0.05 * lr0;
    # - mixup on every mosaic image, rotation +/-10 deg, shear +/-2 deg;
    # - mosaic scale jitter 0.1-2.0 (mosaic_scale): our symmetric `scale` gets closest with 0.9
    #   (0.1-1.9);
    # - mosaic and mixup closed for the last 15 epochs (the L1 term switches on there too);
    # - loss gains: IoU term 5.0 (reg_weight), classification 1.0.
    # Not expressed: the 416 px input of nano/tiny and the multi-scale range (image size stays
    # the user's `imgsz`), nano's depthwise convs (the network's own choice, in net.py).
    defaults={
        "optimizer": "sgd", "momentum": 0.9, "warmup_momentum": 0.9, "clip_grad": 0.0,
        "warmup_epochs": 5.0, "warmup_bias_lr": 0.0, "lr_schedule": "cosine", "lrf": 0.05,
        "mixup": 1.0, "scale": 0.9, "degrees": 10.0, "shear": 2.0, "no_aug_epochs": 15,
        "box": 5.0, "cls": 1.0,
    },
    # exps/default/yolox_tiny.py and yolox_nano.py: no mixup, mosaic scale 0.5-1.5; nano also
    # mosaics only half of the images (mosaic_prob 0.5).
    size_defaults={"n": {"mixup": 0.0, "scale": 0.5, "mosaic": 0.5}, "t": {"mixup": 0.0, "scale": 0.5}},
    # The optimizer and the augmentation are its 300-epoch COCO schedule's; the loss gains are the
    # head's own and stay in every run (recipe=auto).
    long_run=("optimizer", "momentum", "warmup_momentum", "clip_grad", "warmup_epochs", "warmup_bias_lr",
              "lr_schedule", "lrf", "mixup", "scale", "degrees", "shear", "no_aug_epochs", "mosaic"),
    # The whole network is static-shape and sync-free; SimOTA and the loss stay eager.
    capture=CapturePlan("network", note=(
        "the whole network; SimOTA and the loss stay eager; the L1 branch at "
        "`no_aug_epochs` invalidates and re-captures")),
)
