"""DEIMv2 family declaration (registered by families/__init__.py)."""

from __future__ import annotations

from ..base import CapturePlan, FamilySpec, backbone_of
from .loss import criterion
from .net import build

SPEC = FamilySpec(
    name="deimv2",
    display="DEIMv2",
    # The HGNetv2 sizes of github:Intellindust-AI-Lab/DEIMv2 (README model zoo), spelled as the
    # LibreYOLO weights are (LibreDEIMv2atto.pt ... LibreDEIMv2n.pt). S, M, L and X (DINOv3 ViT
    # backbones) are not built.
    sizes=("atto", "femto", "pico", "n"),
    build=build,
    criterion=criterion,
    weights_prefix="LibreDEIMv2",
    size_names={"a": "atto", "f": "femto", "p": "pico", "nano": "n"},
    backbone=backbone_of,
    # DEIMv2 trains DEIM's recipe (AdamW betas (0.9, 0.999), weight decay 1e-4, backbone at 0.5 x
    # lr, clip 0.1, EMA 0.9999 with 1000 warmup updates, FlatCosine to lr_gamma 0.5, MAL and the
    # D-FINE losses at DEIM's weights): inherited from `deim`. What its configs change
    # (configs/deimv2/deimv2_hgnetv2_{atto,femto,pico}_coco.yml over configs/base/deimv2.yml,
    # optimizer.yml, dataloader.yml, runtime.yml; n: size_defaults):
    # - lr 0.0016, backbone 0.0008 (backbone_lr 0.5), total batch 128 (nbs 128);
    # - 500 epochs, flat to epoch 250 (lr_flat 0.5), the last 32 without augmentation;
    # - mosaic 0.5, no mixup and no CopyBlend (mixup_prob / copyblend_prob 0), no multi-scale
    #   (base_size_repeat ~); each size at its own input (atto 320, femto 416, pico 640);
    # - amp True: upstream trains with use_amp True (optimizer.yml) and DEIMv2 is not one of the
    #   families the training-speed reference we follow runs in float32 (D-FINE, DEIM, YOLO-NAS,
    #   FOMO). Its RMSNorms normalise in float32 and the decoder keeps D-FINE's float16 clamp;
    # - sync_bn True (runtime.yml), under multi-GPU training;
    # - the backbone's norms at the backbone lr without decay, as our optimizer groups them;
    # - the matching cost's change at 0.9 of the epochs (n: 0.85) is the model's (net.py).
    # Not expressible: the 4000-iteration (n: 2000) quadratic warmup, the epoch count (left to
    # the user), the EMA restart at the no-aug stage (ema_restart_decay), the augmentation
    # windows (mosaic from epoch 4).
    defaults={"lr0": 0.0016, "lr_flat": 0.5, "nbs": 128, "mosaic": 0.5, "mixup": 0.0, "no_aug_epochs": 32,
              "multi_scale": False, "amp": True, "sync_bn": True},
    # atto: lr 0.002 (backbone 0.001), mosaic_prob 0.3. n (deimv2_hgnetv2_n_coco.yml): lr 0.0008
    # (backbone 0.0004), total batch 32, 160 epochs flat throughout (flat_epoch 7800, lr_gamma 1),
    # the last 12 without augmentation, mixup 0.5 (CopyBlend 0.4 is not expressible).
    size_defaults={"atto": {"lr0": 0.002, "mosaic": 0.3, "imgsz": 320}, "femto": {"imgsz": 416},
                   "n": {"lr0": 0.0008, "nbs": 32, "lr_flat": 1.0, "lrf": 1.0, "no_aug_epochs": 12,
                         "mixup": 0.5}},
    # 32 (n: 12) closing epochs and n's mixup belong to 160-500-epoch COCO schedules: a short
    # run gets the generic values (recipe=auto).
    long_run=("mixup", "no_aug_epochs"),
    inherits="deim",
    capture=CapturePlan("encoder", note=(
        "backbone + encoder (the LiteEncoder of atto/femto/pico, n's hybrid encoder); query "
        "selection, denoising, the FDR decoder, Hungarian matching and loss stay eager: the "
        "denoising query count follows the batch's largest box count (a new shape per step); "
        "cuda_graph=full captures all of it, the denoising sized by the padded box slots")),
)
