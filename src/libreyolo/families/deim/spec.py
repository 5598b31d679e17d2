"""DEIM family declaration (registered by families/__init__.py); network and loss in ../dfine."""

from __future__ import annotations

from ..base import FamilySpec, backbone_of
from ..dfine.loss import deim_criterion
from ..dfine.net import build_deim
from ..dfine.spec import CAPTURE

SPEC = FamilySpec(
    name="deim",
    display="DEIM",
    sizes=("n", "s"),
    build=build_deim,
    criterion=deim_criterion,
    weights_prefix="LibreDEIM",
    size_names={"nano": "n", "small": "s"},
    backbone=backbone_of,
    # From github:ShihuaHuang95/DEIM configs/deim_dfine/deim_hgnetv2_s_coco.yml over
    # dfine_hgnetv2_s_coco.yml, configs/base/{deim,optimizer,dataloader}.yml (n: size_defaults):
    # - AdamW betas (0.9, 0.999), lr 0.0004, backbone lr 0.0002 (backbone_lr 0.5), weight decay
    #   0.0001; clip_max_norm 0.1; EMA (0.9999, 1000 warmup updates); total batch 32;
    # - FlatCosine: flat to epoch 64 of 132 (lr_flat 64/132 = 0.485), then a cosine to
    #   lr_gamma 0.5 x lr (lrf 0.5); the last 12 epochs without aug (no_aug_epoch 12);
    # - mosaic with probability 0.5 (mosaic_prob; epochs 4-64), mixup 0.5 (mixup_prob; epochs
    #   4-64), multi-scale as D-FINE s (base_size_repeat 20);
    # - loss weights mal 1 (gamma 1.5), bbox 5, giou 2, fgl 0.15, ddf 1.5;
    # - amp False: upstream trains with use_amp True; see dfine/spec.py.
    # Not expressible: warmup 2000 iterations (quadratic), mosaic/mixup only in epochs 4-64, the
    # 132 epochs; FlatCosine reaching its floor at epoch 120 (total - no_aug) and holding it for
    # the last 12 (ours runs the cosine to the end); the backbone's norms at the full lr with decay
    # (upstream's regex groups; ours: backbone_lr, and no decay on any norm).
    defaults={"optimizer": "adamw", "lr0": 0.0004, "backbone_lr": 0.5, "lr_schedule": "flat_cosine",
              "lr_flat": 0.485, "lrf": 0.5, "momentum": 0.9, "weight_decay": 0.0001,
              "warmup_bias_lr": 0.0, "warmup_momentum": 0.9, "clip_grad": 0.1, "ema": True, "nbs": 32,
              "mosaic": 0.5, "mixup": 0.5, "no_aug_epochs": 12, "multi_scale": True,
              "box": 2.0, "cls": 1.0, "amp": False},
    # deim_hgnetv2_n_coco.yml: lr 0.0008 (backbone 0.0004), total batch 128, flat_epoch 7800
    # (beyond the 160 epochs: flat throughout, lr_gamma 1), no multi-scale.
    size_defaults={"n": {"lr0": 0.0008, "nbs": 128, "lr_flat": 1.0, "lrf": 1.0, "multi_scale": False}},
    capture=CAPTURE,
)
