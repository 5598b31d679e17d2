"""LingBot-Vision family declaration (registered by families/__init__.py)."""

from __future__ import annotations

from ..base import CapturePlan, FamilySpec, backbone_of
from ..segment import criterion
from .net import build

SPEC = FamilySpec(
    name="lingbot",
    display="LingBot-Vision",
    sizes=("s",),
    build=build,
    criterion=criterion,
    weights_prefix="LibreLingBotVision",    # LibreLingBotVisions.pt
    aliases=("lingbotvision",),             # lingbot-s, lingbot-vision-s, LingBot-Vision-S
    size_names={"small": "s"},
    tasks=("segment",),
    # DINOv3's ADE20K linear-probe recipe (facebookresearch/dinov3, eval/segmentation/configs/
    # config-ade20k-linear-training.yaml; transforms.py make_segmentation_train_transforms), the
    # dense protocol of the backbone family LingBot-Vision builds on: AdamW lr 1e-3, betas (0.9,
    # 0.999), weight decay 1e-3; batch 16 (2 x 8 GPUs) for 40k iterations; a linear warmup of 1500
    # iterations from 1e-6 x lr, then a cosine to 0 (final_div_factor inf); no gradient clipping
    # ('inf'), no EMA, cross-entropy only; the short side resized to 512 x U(0.5, 2.0), a 512 crop,
    # flip 0.5, photometric distortion (brightness +-32 of 255, contrast and saturation x0.5-1.5,
    # hue +-0.5 of the circle, each with probability 0.5).
    # Expressed here: nbs 16 = batch (one optimizer step per batch, decay unscaled); warmup_iters;
    # 40k iterations of 16 images are 32 epochs of ADE20K's 20,210 training images; the cosine
    # steps per epoch (the recipe's per iteration); hsv_v / hsv_s stand in for brightness and
    # saturation (always drawn); contrast is not drawn, hue stays off (7.6 ms per 224 px image on a
    # CPU core: mobilenetv4/spec.py). Not expressed: decay on norms and biases (DINOv3 decays every
    # parameter). The probe freezes a pretrained backbone; without its weights the whole network
    # trains (backbone_lr=1; backbone_lr=0 is the frozen probe). bfloat16 autocast: the backbone's
    # own training ran in bfloat16 (lbot_vision_vits.yaml: norm_layer layernormbf16, RoPE kept in
    # fp32); the probe ran in float32 (model_dtype FLOAT32), which amp=false gives.
    defaults={"imgsz": 512, "epochs": 32, "batch": 16, "nbs": 16, "optimizer": "adamw", "lr0": 1e-3,
              "momentum": 0.9, "weight_decay": 1e-3, "lr_schedule": "cosine", "lrf": 0.0, "warmup_iters": 1500,
              "warmup_bias_lr": 0.0, "clip_grad": 0.0, "ema": False, "amp_dtype": "bfloat16",
              "resize_min": 0.5, "resize_max": 2.0, "fliplr": 0.5, "hsv_h": 0.0, "hsv_s": 0.5, "hsv_v": 0.5,
              "mosaic": 0.0, "mixup": 0.0, "no_aug_epochs": 0},
    capture=CapturePlan("network", note="the whole network; the loss stays eager; no random op inside (no "
                                         "drop-path, no dropout): graphed = eager to float32 rounding"),
    backbone=backbone_of,
)
