"""RF-DETR's criterion: the core set-prediction loss (detr/criterion.py) with IA-BCE and Group DETR.

Facts from github:roboflow/rf-detr rfdetr/models/lwdetr.py SetCriterion and matcher.py
HungarianMatcher, with rfdetr/config.py TrainConfig (`ia_bce_loss: True`, `cls_loss_coef: 1.0`,
`group_detr: 13`) and main.py (`bbox_loss_coef 5`, `giou_loss_coef 2`, `focal_alpha 0.25`,
`set_cost_class 2`, `set_cost_bbox 5`, `set_cost_giou 2`, aux loss on, sum_group_losses off):
- output sets: every decoder layer and the two-stage encoder outputs, and in training each of the
  13 query groups of each on its own: Hungarian-matched separately (the core's cost: focal class
  cost alpha 0.25 gamma 2, L1, GIoU at 2 / 5 / 2), all in the core's one batched solve;
- IA-BCE (IoU-aware BCE, `ia_bce_loss`): a matched query's target-class entry is a BCE against
  t = max(p^alpha IoU^(1 - alpha), 0.01) (p the sigmoid score, both detached; alpha 0.25), every
  other entry a BCE against 0 weighted p^2 (p NOT detached there, as upstream's `prob ** gamma`);
  summed over queries and classes;
- L1 (5) and 1 - GIoU (2) on the matched pairs;
- one normaliser: the target boxes times the group count (upstream's num_boxes x group_detr), so
  each group counts as one copy of the loss averaged over the groups.
Host syncs: the matcher's solve only (no denoising here).
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import Tensor

from ..base import Targets
from ..detr.criterion import DETRLoss
from ..detr.output import DETROutput

IA_ALPHA, IA_GAMMA, IA_FLOOR = 0.25, 2.0, 0.01


class RFDETRLoss(DETRLoss):
    """Items (ia_bce, l1, giou): gain-weighted sums over every layer, group and the encoder."""

    cls_name = "ia_bce"

    def classification(self, logits: Tensor, onehot: Tensor, score: Tensor) -> Tensor:
        """IA-BCE per entry: logits/onehot/score [B, S, Q, C] (score: the pair's IoU) -> [B, S, Q, C]."""
        p = logits.sigmoid()
        t = (p.detach().pow(IA_ALPHA) * score.pow(1 - IA_ALPHA)).clamp(min=IA_FLOOR)
        pos = onehot * t
        neg = onehot * (1 - t) + (1 - onehot) * p.pow(IA_GAMMA)
        # neg x - log sigmoid(x) (pos + neg): BCE(x, t) on a positive entry, p^2 BCE(x, 0) elsewhere
        return neg * logits - F.logsigmoid(logits) * (pos + neg)

    def output_sets(self, out: DETROutput) -> dict[str, tuple[Tensor, Tensor]]:
        """Each (layer, group) of the decoder and each group of the encoder as its own set: the
        decoder's [B, L, G k, *] -> [B, L G, k, *] (the groups lie side by side in the queries)."""
        b, layers, q, c = out.logits.shape
        g = out.enc_logits.shape[1]
        return {"dec": (out.logits.reshape(b, layers * g, q // g, c), out.boxes.reshape(b, layers * g, q // g, 4)),
                "enc": (out.enc_logits, out.enc_boxes)}

    def _per_image(self, preds: DETROutput, targets: Targets) -> tuple[Tensor, Tensor]:
        terms, n = super()._per_image(preds, targets)
        return terms / preds.enc_logits.shape[1], n


def criterion(model: Any, cfg: Any = None) -> RFDETRLoss:
    return RFDETRLoss(model, cfg)
