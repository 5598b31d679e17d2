"""YOLOX detection loss: SimOTA assignment, IoU + objectness + classification (+ L1) terms.

loss = B * (box_gain * L_iou + L_obj + cls_gain * L_cls + L_l1), each term a sum over the whole
batch divided by one normaliser, the number of positives (at least 1), as YOLOX normalises:
  L_iou = sum over positives of 1 - IoU(pred, gt)^2             (YOLOX's "iou" loss, not GIoU)
  L_obj = sum over ALL anchors of BCE-with-logits(obj, positive?)
  L_cls = sum over positives of BCE-with-logits(cls, one-hot * IoU(pred, gt))   (IoU-aware)
  L_l1  = sum over positives of |raw (dx, dy, log w, log h) - their targets|, only once the
          model's `use_l1` is on (from the epoch mosaic closes, `YOLOXModel.set_epoch`)
Gains as published: box (YOLOX's reg_weight) 5.0, obj and cls 1.0, L1 1.0. `box` and `cls` can be
changed through the config; objectness and L1 have no config key and stay at 1.0.

Per-image sums and positive counts come from `per_image`, so the batch loss is exactly
sum_i raw_i / max(sum_i n_i, 1): the vectorised path is testable one image at a time.
Everything is float32 (autocast outputs are cast up first), shape-static and free of host syncs.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..common import AnchorCache, PerImageLoss, bbox_iou, flatten_levels
from .assign import SimOTAAssigner
from .net import decode_boxes

DEFAULT_GAINS = {"box": 5.0, "cls": 1.0}  # YOLOX reg_weight 5.0; classification weight 1.0
OBJ_GAIN = 1.0
L1_GAIN = 1.0
L1_EPS = 1e-8  # log(w / stride + eps) as YOLOX builds its L1 size targets


class YOLOXLoss(PerImageLoss):
    """Gain-weighted sums per image [B, 4] (box, obj, cls, l1); normaliser: the positive count."""

    item_names = ("box", "obj", "cls", "l1")

    def __init__(self, model: Any, cfg: Any = None):
        self.model = getattr(model, "module", model)  # DDP wrapper -> the model (reads use_l1)
        self.num_classes = self.model.num_classes
        self.grids = AnchorCache(tuple(self.model.strides), offset=0.0)
        self.assigner = SimOTAAssigner(self.num_classes)
        self.gains = tuple(float(getattr(cfg, k, v)) for k, v in DEFAULT_GAINS.items())

    def _per_image(self, preds: tuple[torch.Tensor, ...], targets: Any) -> tuple[torch.Tensor, torch.Tensor]:
        x = flatten_levels(preds, torch.float32)  # [B, A, 5 + C]
        # split, not slicing: its backward is one concat instead of three zero-filled copies.
        raw_box, obj, cls = x.split((4, 1, self.num_classes), -1)
        obj = obj.squeeze(-1)
        grid, strides = self.grids(preds)
        pred_boxes = decode_boxes(raw_box, grid, strides)  # xyxy pixels

        probs = (cls.detach().sigmoid() * obj.detach().sigmoid().unsqueeze(-1))
        assigned = self.assigner(probs, pred_boxes.detach(), (grid + 0.5) * strides, strides,
                                 targets.labels, targets.boxes.float(), targets.valid)
        fg = assigned.fg.to(torch.float32)

        iou = bbox_iou(pred_boxes, assigned.boxes, eps=1e-16)
        box = ((1.0 - iou.square()) * fg).sum(1)
        obj_loss = F.binary_cross_entropy_with_logits(obj, fg, reduction="none").sum(1)
        cls_target = cls.new_zeros(cls.shape).scatter_(-1, assigned.labels.unsqueeze(-1),
                                                        assigned.iou.unsqueeze(-1))
        cls_loss = (F.binary_cross_entropy_with_logits(cls, cls_target, reduction="none")
                    .sum(-1) * fg).sum(1)
        if self.model.use_l1:  # a Python flag set once per epoch, not a tensor: no sync
            l1 = ((raw_box - self.l1_targets(assigned.boxes, grid, strides)).abs().sum(-1)
                  * fg).sum(1)
        else:
            l1 = torch.zeros_like(box)
        g_box, g_cls = self.gains  # python floats: no tensor to copy to the device
        raw = torch.stack((box * g_box, obj_loss * OBJ_GAIN, cls_loss * g_cls, l1 * L1_GAIN), 1)
        return raw, fg.sum(1)

    @staticmethod
    def l1_targets(boxes: torch.Tensor, grid: torch.Tensor, strides: torch.Tensor) -> torch.Tensor:
        """gt xyxy pixels [B, A, 4] -> what the raw outputs should be: (cx / s - gx, cy / s - gy,
        log(w / s), log(h / s)). Sizes are clamped at the eps so junk rows of background anchors
        (masked out afterwards) can never produce a NaN that the mask would not remove."""
        xy = (boxes[..., :2] + boxes[..., 2:]) * 0.5 / strides - grid
        wh = ((boxes[..., 2:] - boxes[..., :2]) / strides).clamp(min=0) + L1_EPS
        return torch.cat((xy, wh.log()), -1)


def criterion(model: Any, cfg: Any = None) -> YOLOXLoss:
    return YOLOXLoss(model, cfg)
