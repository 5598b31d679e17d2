"""RT-DETR and RT-DETRv2 family declarations (registered by families/__init__.py).

Defaults: only where the published r18 recipes differ from the generic defaults and our config
can express them. Sources (github.com/lyuwenyu/RT-DETR):
  v1: rtdetr_pytorch/configs/rtdetr/{rtdetr_r18vd_6x_coco.yml, include/optimizer.yml,
      include/dataloader.yml, include/rtdetr_r50vd.yml}, trained on 4 GPUs (README torchrun
      --nproc_per_node=4) x batch 4;
  v2: rtdetrv2_pytorch/configs/rtdetrv2/{rtdetrv2_r18vd_120e_coco.yml, include/optimizer.yml,
      include/dataloader.yml, include/rtdetrv2_r50vd.yml}.
Not expressible here: EMA decay 0.9999 with 2000 warmup steps; RandomZoomOut / RandomIoUCrop
(p 0.8) and the photometric ops' own p 0.5; weight decay 0 on the encoder/decoder norms (ours
exempts every norm and bias, the backbone's too); 72 (v1) / 120 (v2) epochs (left to the user,
as for every family).
"""

from __future__ import annotations

from ..base import CapturePlan, FamilySpec, backbone_of
from ..detr.criterion import criterion
from .net import SIZES, build, build_v2

_CAPTURE = CapturePlan("encoder", note=(
    "backbone + hybrid encoder (+ the decoder's input projections); query selection, "
    "denoising, decoder, Hungarian matching and loss stay eager: the denoising query count "
    "follows the batch's largest box count (a new shape per step); cuda_graph=full captures all "
    "of it, the denoising sized by the padded box slots"))


_COMMON = {
    "optimizer": "adamw",      # optimizer.yml: AdamW
    "lr0": 1e-4,               # optimizer.yml: lr 0.0001
    "momentum": 0.9,           # optimizer.yml: betas [0.9, 0.999] (beta1)
    "weight_decay": 1e-4,      # optimizer.yml: weight_decay 0.0001
    "lrf": 1.0,                # optimizer.yml: MultiStepLR milestones [1000] never fires: a flat LR
    "clip_grad": 0.1,          # optimizer.yml: clip_max_norm 0.1
    "ema": True,               # optimizer.yml: use_ema True
    "nbs": 16,                 # dataloader.yml: total batch 16 (v1: 4 GPUs x batch_size 4)
    "multi_scale": True,       # v1 rtdetr_r50vd.yml RTDETR.multi_scale / v2 dataloader.yml collate
                               # scales: 480-800 around 640 (x0.75-1.25; ours x0.5-1.5)
    "mosaic": 0.0,             # dataloader.yml: no mosaic, no mixup
    "mixup": 0.0,
    # dataloader.yml RandomPhotometricDistort (torchvision defaults): hue +-0.05, saturation and
    # contrast 0.5-1.5, brightness 0.875-1.125.
    "hsv_h": 0.05, "hsv_s": 0.5, "hsv_v": 0.125,
    "cls": 1.0,                # rtdetr*_r50vd.yml criterion weight_dict: loss_vfl 1
    "box": 2.0,                # idem: loss_giou 2 (loss_bbox 5 is a family constant, no key)
}

SPEC = FamilySpec(
    name="rtdetr",
    display="RT-DETR",
    sizes=SIZES,
    build=build,
    criterion=criterion,
    weights_prefix="LibreRTDETR",
    joiner="-",
    defaults={**_COMMON,
              # rtdetr_r18vd_6x_coco.yml optimizer params: backbone lr 0.00001 = 0.1 x lr
              "backbone_lr": 0.1,
              # v1 optimizer.yml has no lr_warmup_scheduler: no warmup
              "warmup_epochs": 0.0},
    capture=_CAPTURE,
    backbone=backbone_of,
)

SPEC_V2 = FamilySpec(
    name="rtdetrv2",
    display="RT-DETRv2",
    sizes=SIZES,
    build=build_v2,
    criterion=criterion,
    weights_prefix="LibreRTDETRv2",
    joiner="-",
    defaults={**_COMMON,
              # rtdetrv2_r18vd_120e_coco.yml replaces optimizer.params with the norm group only,
              # so r18's backbone trains at the full lr (include/optimizer.yml's 0.1 x is r50's).
              "backbone_lr": 1.0,
              # include/optimizer.yml LinearWarmup warmup_duration 2000 steps from ~0, every
              # group: at batch 16 on COCO train2017 (117,266 images, 7,329 steps) 0.27 epochs.
              "warmup_epochs": 0.27, "warmup_bias_lr": 0.0, "warmup_momentum": 0.9},
    capture=_CAPTURE,
    backbone=backbone_of,
)
