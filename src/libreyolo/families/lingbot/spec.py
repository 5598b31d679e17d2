"""LingBot-Vision family declaration (registered by families/__init__.py)."""

from __future__ import annotations

from ..base import CapturePlan, FamilySpec
from ..segment import criterion
from .net import backbone_of, build

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
    # config-ade20k-linear-training.yaml), the dense protocol of the backbone family LingBot-Vision
    # builds on: AdamW lr 1e-3, betas (0.9, 0.999), weight decay 1e-3, batch 16 (2 x 8 GPUs, so
    # nbs=16: no accumulation, decay unscaled), 512 px crops, flip 0.5, no colour jitter, 1500
    # warmup iterations from ~0 (1e-6 x lr), then a cosine to 0 (final_div_factor inf: lrf=0), no
    # gradient clipping ('inf'), no weight EMA, cross-entropy only. What our config expresses
    # differently (docs/families.md): warmup in epochs (1500 iterations = 1.19 epochs of ADE20K's
    # 20,210 images at batch 16), the cosine stepped per epoch, no decay on norms and biases
    # (DINOv3 decays every parameter), and 40k iterations left to `epochs`. The probe freezes a
    # pretrained backbone; without its weights the whole network trains here (backbone_lr=1;
    # backbone_lr=0 is the frozen probe). bfloat16 autocast: the backbone's own training ran in
    # bfloat16 (lbot_vision_vits.yaml: norm_layer layernormbf16, RoPE kept in fp32); the probe
    # itself ran in float32 (model_dtype FLOAT32), `amp=false` gives that.
    defaults={"imgsz": 512, "batch": 16, "nbs": 16, "optimizer": "adamw", "lr0": 1e-3, "momentum": 0.9,
              "weight_decay": 1e-3, "lr_schedule": "cosine", "lrf": 0.0, "warmup_epochs": 1.19,
              "warmup_bias_lr": 0.0, "clip_grad": 0.0, "ema": False, "amp_dtype": "bfloat16",
              "fliplr": 0.5, "hsv_h": 0.0, "hsv_s": 0.0, "hsv_v": 0.0,
              "mosaic": 0.0, "mixup": 0.0, "no_aug_epochs": 0},
    capture=CapturePlan("network", note="the whole network; the loss stays eager; no random op inside (no "
                                         "drop-path, no dropout): graphed = eager to float32 rounding"),
    backbone=backbone_of,
)
