"""RF-DETR family declaration (registered by families/__init__.py)."""

from __future__ import annotations

from ..base import CapturePlan, FamilySpec, backbone_of
from .loss import criterion
from .net import ARCHS, build
from .weights import load_backbone

SPEC = FamilySpec(
    name="rfdetr",
    display="RF-DETR",
    # RF-DETR N, S and M of github:roboflow/rf-detr (README model table, Apache-2.0 weights),
    # spelled as the LibreYOLO weights are (LibreRFDETRn.pt ...). L (704 px) and the PML-licensed
    # XL/2XL (ViT-B) are not built.
    sizes=("n", "s", "m"),
    build=build,
    criterion=criterion,
    weights_prefix="LibreRFDETR",
    aliases=("rf-detr",),
    size_names={"nano": "n", "small": "s", "medium": "m"},
    # The ViT (upstream's `backbone.0.encoder`) at lr_encoder; the projector trains at lr.
    backbone=backbone_of,
    pretrained=load_backbone,
    # From rfdetr/config.py TrainConfig and ModelConfig (what `RFDETRNano().train()` runs) and
    # rfdetr/main.py (the optimizer and clipping):
    # - AdamW (betas torch's (0.9, 0.999)), lr 1e-4, lr_encoder 1.5e-4 (backbone_lr 1.5), weight
    #   decay 1e-4 (none on the ViT's norms, biases and embeddings, as our no-decay groups);
    # - 100 epochs, lr_drop 100: the step schedule never drops inside the run, a flat LR (lrf 1);
    #   warmup_epochs 0;
    # - batch 4 x grad_accum_steps 4: nbs 16; clip_max_norm 0.1; EMA (use_ema; decay 0.993, tau 100);
    # - amp True (ModelConfig.amp);
    # - multi_scale with expanded scales around the size's resolution (ours: x0.5-1.5 of imgsz),
    #   a horizontal flip, a random resize + crop half the time; no mosaic, no mixup, no colour
    #   jitter (datasets/coco.py make_coco_transforms_square_div_64);
    # - loss gains IA-BCE 1 (cls_loss_coef), L1 5, GIoU 2 (`box`); group_detr 13 is the
    #   architecture's (net.py Arch.groups: the group queries and encoder heads are parameters).
    # Not expressible: the ViT's layer-wise lr decay (lr_vit_layer_decay 0.8 per block down from
    # the last) and lr_component_decay 0.7 (the ViT at 0.7^2, the decoder at 0.7 of its lr); the
    # EMA's tau warmup; upstream's resize/crop schedule (ours: the affine jitter).
    defaults={"optimizer": "adamw", "lr0": 1e-4, "backbone_lr": 1.5, "weight_decay": 1e-4, "momentum": 0.9,
              "epochs": 100, "lrf": 1.0, "warmup_epochs": 0.0, "warmup_bias_lr": 0.0, "warmup_momentum": 0.9,
              "nbs": 16, "clip_grad": 0.1, "ema": True, "amp": True, "multi_scale": True, "mosaic": 0.0,
              "mixup": 0.0, "hsv_h": 0.0, "hsv_s": 0.0, "hsv_v": 0.0, "cls": 1.0, "box": 2.0},
    size_defaults={size: {"imgsz": arch.imgsz} for size, arch in ARCHS.items()},
    capture=CapturePlan("encoder", note=(
        "normalisation + windowed ViT + projector + per-group query selection + decoder: "
        "everything but the Hungarian matching and the loss (no denoising queries, so every "
        "shape follows the input's); cuda_graph=full captures those too")),
)
