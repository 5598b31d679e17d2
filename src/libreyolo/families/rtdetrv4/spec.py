"""RT-DETRv4 family declaration (registered by families/__init__.py); network and loss in ../dfine."""

from __future__ import annotations

from ..base import FamilySpec, backbone_of
from ..dfine.loss import deim_criterion
from ..dfine.net import build_deim
from ..dfine.spec import CAPTURE

SPEC = FamilySpec(
    name="rtdetrv4",
    display="RT-DETRv4",
    sizes=("s",),
    build=build_deim,
    criterion=deim_criterion,
    weights_prefix="LibreRTDETRv4",
    aliases=("rt-detrv4",),
    size_names={"small": "s"},
    backbone=backbone_of,
    # github:RT-DETRs/RT-DETRv4 configs/rtv4/rtv4_hgnetv2_s_coco.yml: the D-FINE-s network
    # (configs/dfine/dfine_hgnetv2_s_coco.yml, HGNetv2-B0) with DEIM's decoder activations and
    # losses (configs/base/rtv4.yml: mal 1 gamma 1.5, bbox 5, giou 2, fgl 0.15, ddf 1.5) and
    # DEIM-s's optimiser and schedule (lr 0.0004, backbone 0.0002, wd 0.0001, flat 64 of 132,
    # no_aug 12, mosaic/mixup 0.5): every default inherited from DEIM.
    # Left out: the distillation from a DINOv3 ViT-B/16 teacher (`loss_distill` 10 on a feature
    # projector of the AIFI output, `distill_teacher_dim: 768`), which needs the teacher's
    # weights; without it this trains DEIM-s.
    inherits="deim",
    capture=CAPTURE,
)
