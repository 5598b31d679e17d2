"""SegFormer family declaration (registered by families/__init__.py)."""

from __future__ import annotations

from ..base import CapturePlan, FamilySpec, backbone_of
from ..segment import criterion
from .net import build

SPEC = FamilySpec(
    name="segformer",
    display="SegFormer",
    sizes=("b0",),
    build=build,
    criterion=criterion,
    weights_prefix="LibreSegFormer",  # LibreSegFormerb0.pt
    tasks=("segment",),
    # The authors' ADE20K recipe (NVlabs/SegFormer local_configs/segformer/B0/
    # segformer.b0.512x512.ade.160k.py, _base_/datasets/ade20k_repeat.py; the same in
    # mmsegmentation's segformer_mit-b0_8xb2-160k_ade20k-512x512.py): AdamW lr 6e-5, betas (0.9,
    # 0.999), weight decay 0.01, "head" lr_mult 10; poly decay power 1.0 to 0 after a linear warmup
    # of 1500 iterations from 1e-6 x lr; 8 GPUs x 2 images = batch 16, 160k iterations, 512 x 512
    # crops of a random resize (ratio 0.5-2.0), flip 0.5, photometric distortion; no gradient
    # clipping, no EMA.
    # Expressed here: lr0 6e-4 is the decoder's lr and backbone_lr 0.1 gives the encoder 6e-5
    # (FamilySpec.backbone below; the same two learning rates as the recipe's x10 on the head).
    # nbs 16 = batch: one optimizer step per batch of 16, no accumulation, weight decay unscaled.
    # 160k iterations of 16 images are 127 epochs of ADE20K's 20,210 training images.
    # hsv_v / hsv_s stand in for PhotoMetricDistortion's brightness (+/-32 of 255, here x0.5-1.5)
    # and saturation (x0.5-1.5); its contrast is not drawn, and hue (+/-18 of 180) stays off: hue
    # jitter costs 7.6 ms per 224 px image on a CPU core (mobilenetv4/spec.py). Not expressed:
    # the crop's category-ratio retry (cat_max_ratio 0.75), and weight decay on biases and the
    # decoder's BatchNorm (mmseg decays them; our optimizer never decays biases and norms).
    defaults={"imgsz": 512, "epochs": 127, "batch": 16, "nbs": 16, "optimizer": "adamw", "lr0": 6e-4,
              "backbone_lr": 0.1, "momentum": 0.9, "weight_decay": 0.01, "lr_schedule": "poly", "lr_power": 1.0,
              "lrf": 0.0, "warmup_iters": 1500, "warmup_bias_lr": 0.0, "clip_grad": 0.0, "ema": False,
              "resize_min": 0.5, "resize_max": 2.0, "fliplr": 0.5, "hsv_h": 0.0, "hsv_s": 0.5, "hsv_v": 0.5,
              "mosaic": 0.0, "mixup": 0.0, "no_aug_epochs": 0},
    capture=CapturePlan("network", note="the whole network; the loss stays eager; drop-path replays its own "
                                        "random stream (statistically, not bitwise, eager's)"),
    backbone=backbone_of,  # the MiT encoder: the recipe's decoder at 10x its lr (see above)
)
