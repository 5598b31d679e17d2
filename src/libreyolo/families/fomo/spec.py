"""FOMO family declaration (registered by families/__init__.py)."""

from __future__ import annotations

from ..base import CapturePlan, FamilySpec
from .loss import criterion
from .net import build

SPEC = FamilySpec(
    name="fomo",
    display="FOMO",
    sizes=("035",),                 # MobileNetV2 width (alpha) 0.35: fomo-035, LibreFOMO035.pt
    build=build,
    criterion=criterion,
    weights_prefix="LibreFOMO",
    size_names={"0.35": "035"},     # fomo-0.35
    tasks=("points",),
    # Edge Impulse's FOMO training defaults (the expert-mode script of its FOMO block, and the FOMO
    # docs' "lower the learning rate to 0.001 to start"): Adam at a constant lr 0.001, no weight
    # decay, schedule, warmup, clipping or weight EMA (plain Keras `model.fit`), 60 epochs of batch
    # 32 (nbs 32: one optimizer step per batch, as Keras steps), the best epoch kept by validation
    # F1 (our fitness), points at probability > 0.5 (`minimum_confidence_rating=0.5`: conf), the
    # 96 x 96 input of its docs' examples and its published microcontroller figures. Adam is AdamW
    # without decay; beta1 0.9 (Keras' default; its epsilon 1e-7 against torch's 1e-8).
    # - amp False, as the training-speed reference we follow runs FOMO: Edge Impulse trains it in
    #   float32 (Keras' default policy) before quantising to int8 for deployment, and the network is
    #   20 k parameters of 1x1 and depthwise convs on 12 x 12 to 28 x 28 maps, bound by kernel
    #   launches, not arithmetic: half precision would add weight casts and save no time that
    #   matters. `amp=true` is the user's choice.
    # - Augmentation (Edge Impulse's script adds none of its own) for 96-224 px inputs: no mosaic
    #   (a 2 x 2 mosaic halves each image's side: at 96 px its objects shrink below the 8 px cell and
    #   their centres crowd into shared cells, one class each) and no mixup (a faded object keeps a
    #   full-weight centre label, x100 in the loss); scale jitter +-25 % instead of +-50 % (FOMO's
    #   setting is objects of a near-fixed size, fixed cameras in Edge Impulse's words, and at 96 px
    #   the default's halving takes a 12 px object under one cell and drops boxes under 2 px);
    #   translation (centres cross cell borders), flips and colour jitter as for the detectors.
    defaults={"imgsz": 96, "epochs": 60, "batch": 32, "nbs": 32, "optimizer": "adamw", "lr0": 0.001,
              "momentum": 0.9, "weight_decay": 0.0, "lr_schedule": "linear", "lrf": 1.0, "warmup_epochs": 0.0,
              "clip_grad": 0.0, "ema": False, "amp": False, "conf": 0.5, "mosaic": 0.0, "mixup": 0.0,
              "no_aug_epochs": 0, "scale": 0.25},
    capture=CapturePlan("network", note="the whole network (MobileNetV2 trunk and 1x1 head); the loss stays eager"),
)
