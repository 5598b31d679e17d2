"""EdgeCrafter's ECDet family declaration (registered by families/__init__.py)."""

from __future__ import annotations

from ..base import CapturePlan, FamilySpec, backbone_of
from ..dfine.loss import deim_criterion
from .net import build
from .weights import load_backbone

SPEC = FamilySpec(
    name="ec",
    display="ECDet",
    # ECDet-S and -M of github:Intellindust-AI-Lab/EdgeCrafter (README model zoo), spelled as the
    # LibreYOLO weights are (LibreECs.pt, LibreECm.pt); L and X (ECViT-S/S+) are not built.
    sizes=("s", "m"),
    build=build,
    # ECCriterion (ecdetseg/engine/edgecrafter/criterion.py, configs/ecdet/ecdet.yml) is DEIM's
    # loss: MAL 1 (gamma 1.5), L1 5, GIoU 2, FGL 0.15, DDF 1.5 on the union set.
    criterion=deim_criterion,
    weights_prefix="LibreEC",
    aliases=("ecdet", "edgecrafter"),
    size_names={"small": "s", "medium": "m"},
    backbone=backbone_of,
    pretrained=load_backbone,
    # ECDet trains DEIM's recipe (AdamW betas (0.9, 0.999), weight decay 1e-4 and none on norms
    # and biases, clip 0.1, EMA 0.9999 with 1000 warmup updates, FlatCosine to lr_gamma 0.5 x lr):
    # inherited from `deim`. What configs/ecdet/ecdet.yml and ecdet_{s,m}.yml change:
    # - lr 0.0005, the backbone (ViT and adapter) at 0.000025: backbone_lr 0.05;
    # - flat until mosaic stops (flat_epochs = mosaic_epoch: 36 of 74 for s, 30 of 62 for m:
    #   DEIM's lr_flat 0.485), the last 2 epochs without the strong augmentation (stop_epoch 72 / 60);
    # - mosaic 0.75 and mixup 0.75 (mosaic_prob, mixup_prob), no multi-scale (its collate has none);
    # - amp True (use_amp), sync_bn True; total batch 32 (DEIM's nbs 32).
    # Not expressible: the 2000-iteration quadratic warmup (capped at 3 epochs), mosaic and mixup
    # only up to epoch 36 / 30, the epoch count (left to the user).
    defaults={"lr0": 0.0005, "backbone_lr": 0.05, "mosaic": 0.75, "mixup": 0.75,
              "no_aug_epochs": 2, "multi_scale": False, "amp": True, "sync_bn": True},
    # Mixup on three images of four is tuned for 62-74 COCO epochs from a distilled backbone: a
    # short run gets the generic value (recipe=auto).
    long_run=("mixup",),
    inherits="deim",
    capture=CapturePlan("encoder", note=(
        "normalisation + ECViT + adapter + hybrid encoder; query selection, denoising, the FDR "
        "decoder, Hungarian matching and loss stay eager: the denoising query count follows the "
        "batch's largest box count (a new shape per step); cuda_graph=full captures all of it, the denoising sized by the padded box slots")),
)
