"""D-FINE family declaration (registered by families/__init__.py)."""

from __future__ import annotations

from ..base import CapturePlan, FamilySpec, backbone_of
from .loss import criterion
from .net import build

# Shared by D-FINE, DEIM and RT-DETRv4 (one network, one captured region).
CAPTURE = CapturePlan("encoder", note=(
    "backbone + hybrid encoder; query selection, denoising, the FDR decoder, Hungarian matching "
    "and loss stay eager: the denoising query count follows the batch's largest box count (a new "
    "shape per step); cuda_graph=full captures all of it, the denoising sized by the padded box slots"))

SPEC = FamilySpec(
    name="dfine",
    display="D-FINE",
    sizes=("n", "s"),
    build=build,
    criterion=criterion,
    weights_prefix="LibreDFINE",
    aliases=("d-fine",),
    size_names={"nano": "n", "small": "s"},
    backbone=backbone_of,
    # From github:Peterande/D-FINE configs/dfine/dfine_hgnetv2_s_coco.yml over include/
    # optimizer.yml and include/dataloader.yml (the n recipe's differences: size_defaults):
    # - AdamW betas (0.9, 0.999), lr 0.0002, backbone lr 0.0001 (backbone_lr 0.5), weight decay
    #   0.0001 (none on norms: the optimizer's usual no-decay groups);
    # - constant LR after warmup (MultiStepLR milestone 500 > the epochs: never decays): lrf 1;
    #   LinearWarmup of every group from 0 (500 iterations; our warmup counts epochs): no bias
    #   LR or momentum ramp;
    # - clip_max_norm 0.1; EMA (decay 0.9999, 1000 warmup updates);
    # - total batch 32 (dataloader.yml): nbs 32;
    # - no mosaic, no mixup (RandomPhotometricDistort / ZoomOut / IoUCrop / flip instead);
    #   the last 12 epochs (132 - stop_epoch 120) without those ops and without multi-scale;
    # - multi-scale 480-800 (base_size_repeat 20; our multi_scale is x0.5-1.5, the nearest);
    # - loss weights vfl 1, bbox (L1) 5, giou 2, fgl 0.15, ddf 1.5: `cls` 1, `box` (GIoU) 2,
    #   the rest constants in loss.py;
    # - amp False, as the training-speed reference we follow runs D-FINE and DEIM: the decoder
    #   clamps activations to +-65504, the largest finite float16, before the last norm of every
    #   layer (decoder.py), a float16 guard that float32 never needs. Upstream's own configs
    #   train with use_amp True (include/optimizer.yml); `amp=true` is the user's choice.
    # Not expressible: 500-iteration warmup, the epoch count (132; left to the user); the
    # backbone's norms at the full lr with decay (upstream's regex groups; ours: backbone_lr, and
    # no decay on any norm).
    defaults={"optimizer": "adamw", "lr0": 0.0002, "backbone_lr": 0.5, "lrf": 1.0, "momentum": 0.9,
              "weight_decay": 0.0001, "warmup_bias_lr": 0.0, "warmup_momentum": 0.9, "clip_grad": 0.1,
              "ema": True, "nbs": 32, "mosaic": 0.0, "mixup": 0.0, "no_aug_epochs": 12,
              "multi_scale": True, "box": 2.0, "cls": 1.0, "amp": False},
    # dfine_hgnetv2_n_coco.yml: lr 0.0008 (backbone 0.0004: backbone_lr 0.5), total batch 128,
    # no multi-scale (base_size_repeat ~), 160 epochs with stop_epoch 148 (12 without aug).
    size_defaults={"n": {"lr0": 0.0008, "nbs": 128, "multi_scale": False}},
    capture=CAPTURE,
)
