"""YOLOv7 detection loss: OTA assignment, CIoU box, IoU-target objectness and BCE class terms.

The terms are upstream's (`ComputeLossOTA`, utils/loss.py of the official repository):
  box: 1 - CIoU(pred, gt) over the positives;
  obj: BCE-with-logits(objectness, target) over every row, target = the positive's CIoU
       (detached, clamped at 0; `gr` = 1), 0 elsewhere; levels weighted 4.0 / 1.0 / 0.4 (P3-P5);
  cls: BCE-with-logits(class logits, one-hot) over the positives (none with one class: upstream
       skips the term, and the model scores by objectness alone).
Gains (hyp.scratch.p5 / .tiny): box 0.05, obj 0.7 (b) / 1.0 (t), cls 0.3 (b) / 0.5 (t); `box` and
`cls` come from the config, obj has no config key. train.py scales cls by nc / 80 and obj by
(imgsz / 640)^2, built in below.

Normalisation. Upstream divides each level's box and class terms by that level's positive count
in the batch, and objectness by the level's row count (batch x anchors x cells). LibreYOLO's loss
contract is one normaliser per batch, a sum of per-image counts (PerImageLoss: the batch loss
equals the per-image sums, and DDP trains the single-process loss of the global batch), which
cannot hold per-level batch counts. So, per image i with P_i positives:
  box_i = box_gain * 3 * sum_pos (1 - CIoU) / P_i
  cls_i = cls_gain * nc / 80 * 3 * sum_pos mean_c BCE / P_i
  obj_i = obj_gain * sum_l balance_l * sum_{rows of l} BCE / (3 anchors x cells of l at 640 px)
and the normaliser n_i = 1 if P_i > 0 else 0, so loss = B * sum_i raw_i / max(sum_i n_i, 1).
Objectness is then upstream's exactly (its (imgsz / 640)^2 gain times the mean over the rows is
this fixed per-row weight), and the box and class terms are too when the positives split evenly
over the levels (upstream's sum of three level means = 3 x one mean) and the images; otherwise
each image's positives weigh equally instead of each level's. An image without objects adds its
objectness and no normaliser, so in a batch with empty images objectness weighs B / (images with
objects) times upstream's.

Everything is float32 (autocast outputs are cast up first), shape-static and free of host syncs.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..common import PerImageLoss, bbox_iou
from .assign import OTAAssigner
from .net import NUM_ANCHORS, STRIDES, rows

DEFAULT_GAINS = {"box": 0.05, "cls": 0.3}  # hyp.scratch.p5.yaml (tiny's cls 0.5: its spec)
OBJ_GAIN = {"b": 0.7, "t": 1.0}            # hyp.scratch.p5.yaml / hyp.scratch.tiny.yaml `obj`
BALANCE = (4.0, 1.0, 0.4)                  # ComputeLossOTA.balance for 3 levels (P3, P4, P5)
REFERENCE_PX = 640                         # the image size the obj gain is quoted at
LEVELS = len(STRIDES)


class YOLO7Loss(PerImageLoss):
    """Gain-weighted sums per image [B, 3] (box, obj, cls); normaliser: 1 per image with positives."""

    item_names = ("box", "obj", "cls")

    def __init__(self, model: Any, cfg: Any = None):
        model = getattr(model, "module", model)  # DDP wrapper -> the model
        self.num_classes = model.num_classes
        self.layouts = model.layouts
        self.assigner = OTAAssigner(self.num_classes)
        g_box, g_cls = (float(getattr(cfg, k, v)) for k, v in DEFAULT_GAINS.items())
        # Folded into per-positive weights: upstream's 3 level means (x3 for one mean), its
        # nc / 80 class scaling and the mean over classes (/ nc).
        self.box_weight = g_box * LEVELS
        self.cls_weight = g_cls * LEVELS / 80 if self.num_classes > 1 else 0.0
        self.obj_gain = OBJ_GAIN[model.size]
        self._row_weights: dict[tuple, torch.Tensor] = {}

    def row_weights(self, layout) -> torch.Tensor:
        """[A] objectness weight of each row: balance_l / (anchors x cells of level l at 640 px)."""
        key = (layout.levels, layout.level.device)
        if key not in self._row_weights:
            per_level = [BALANCE[i] / (NUM_ANCHORS * (REFERENCE_PX / s) ** 2) for i, s in enumerate(STRIDES)]
            self._row_weights[key] = torch.tensor(per_level, device=layout.level.device)[layout.level]
        return self._row_weights[key]

    def _per_image(self, preds: tuple[torch.Tensor, ...], targets: Any) -> tuple[torch.Tensor, torch.Tensor]:
        layout = self.layouts(preds)
        x = rows(preds, torch.float32)  # [B, A, 5 + C], autocast outputs cast up
        b, a, width = x.shape
        gt_boxes = targets.boxes.float()
        cand = self.assigner.candidates(layout, gt_boxes, targets.valid)
        # The slots' predictions, with gradient: box and class terms live only there.
        xs = x.gather(1, cand.rows.unsqueeze(-1).expand(-1, -1, width))  # [B, N, 5 + C]
        boxes = layout.decode(xs[..., :4], cand.rows)
        with torch.no_grad():
            probs = xs[..., 5:].sigmoid() * xs[..., 4:5].sigmoid()
        assigned = self.assigner(cand, boxes.detach(), probs, targets.labels, gt_boxes, targets.valid)
        fg = assigned.fg
        positives = fg.sum(1)  # [B]
        per_positive = 1.0 / positives.clamp(min=1)

        # A slot that is not a positive is scored against its own (detached) box, not the junk
        # gt row it was handed: where() keeps its term out, and this keeps its gradient finite.
        gt = torch.where(fg.unsqueeze(-1), assigned.boxes, boxes.detach())
        ciou = torch.where(fg, bbox_iou(boxes, gt, ciou=True), 0.0)  # [B, N]
        box = (fg.float() - ciou).sum(1) * per_positive
        logits = xs[..., 5:]
        onehot = torch.zeros_like(logits).scatter_(-1, assigned.labels.unsqueeze(-1), 1.0)
        cls = F.binary_cross_entropy_with_logits(logits, onehot, reduction="none").sum(-1)
        cls = torch.where(fg, cls, 0.0).sum(1) * per_positive

        # Objectness target of a positive's row: its CIoU. A positive's row is unique (assign.py),
        # the other slots add exact zeros: a sum, so no order of the duplicate writes matters.
        tobj = x.new_zeros(b, a).scatter_add_(1, cand.rows, ciou.detach().clamp(min=0))
        obj = F.binary_cross_entropy_with_logits(x[..., 4], tobj, reduction="none")
        obj = (obj * self.row_weights(layout)).sum(1)
        raw = torch.stack((box * self.box_weight, obj * self.obj_gain, cls * self.cls_weight), 1)
        return raw, (positives > 0).float()


def criterion(model: Any, cfg: Any = None) -> YOLO7Loss:
    return YOLO7Loss(model, cfg)
