"""`DETRLoss`: the set-prediction loss of RT-DETR v1/v2, the base D-FINE and DEIM extend.

From rtdetrv2_pytorch/src/zoo/rtdetr/rtdetrv2_criterion.py and the r18 configs
(`weight_dict: {loss_vfl: 1, loss_bbox: 5, loss_giou: 2}`, `alpha: 0.75, gamma: 2.0`):
- every output set (each decoder layer, the encoder query-selection head(s)) is matched to the
  targets on its own (Hungarian, matcher.py), here all sets of a step in ONE batched solve;
- VFL (Zhang et al., VarifocalNet, 2021): BCE-with-logits against the IoU-valued one-hot
  target (IoU of the matched pair, detached), weighted alpha p^gamma on the negatives and the
  target score on the positive entry; summed over queries and classes (upstream's
  `loss.mean(1).sum() * Q` is that sum);
- L1 on the cxcywh normalised boxes and 1 - GIoU, on the matched pairs;
- the dn queries (denoise.py): positive slot j of every group reconstructs target j (fixed
  pairs, no matching), every dn term divided by the group count;
- one normaliser: the number of target boxes (PerImageLoss: B * sum_i raw_i / max(sum_i n_i, 1)).

Seams for the other families:
- `classification(logits, onehot, score)` is the class term, elementwise ([B, S, Q, C], summed by
  `pair_terms`, which leaves out the queries its `keep` mask drops: the dead dn slots of a
  static-shape denoising, denoise.py); DEIM's MAL replaces it (and sets `cls_name = "mal"`).
- `output_sets(out)` lists the matched sets (D-FINE adds its pre-head);
- `match_cost(...)` is the Hungarian cost (DEIMv2 switches it late in training);
- `extra_terms(out, pairs, targets)` returns more gain-weighted per-image sums ([B] each, keys
  = `extra_names`), D-FINE's "fgl"/"ddf"; it receives every set's pairs.
Vectorised over images and sets: matched predictions are gathered with [B, S, P] indices and a
mask, no loop over images. Float32 inside. Host syncs: the matcher's solve (matcher.py) only.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..base import Targets
from ..common import PerImageLoss
from .boxes import cxcywh_to_xyxy, iou_giou, xyxy_to_cxcywh
from .matcher import match_cost, solve
from .output import DN_LIVE, INPUT_WH, DETROutput

# rtdetrv2 configs/rtdetrv2/include/rtdetrv2_r50vd.yml RTDETRCriterionv2 (r18 inherits it).
VFL_ALPHA, VFL_GAMMA = 0.75, 2.0
GAIN_CLS, GAIN_L1, GAIN_GIOU = 1.0, 5.0, 2.0


class SetPairs(NamedTuple):
    """Prediction/target pairs of S output sets: query [B, S, P], target [B, S, P] (index into
    the targets' M), mask [B, S, P] (a real pair). Hungarian sets: P = M, pair m = target m."""

    query: Tensor
    target: Tensor
    mask: Tensor


class NormTargets(NamedTuple):
    """Targets in the DETR frame: boxes [B, M, 4] cxcywh normalised by the input, labels, valid."""

    boxes: Tensor
    labels: Tensor
    valid: Tensor


class DETRLoss(PerImageLoss):
    cls_name = "vfl"
    extra_names: tuple[str, ...] = ()
    backend = "auto"  # matcher.py: "auto", "tla" or "scipy"

    def __init__(self, model: Any, cfg: Any = None, backend: str | None = None):
        model = getattr(model, "module", model)  # DDP wrapper -> the model
        self.num_classes = model.num_classes
        self.backend = backend or self.backend
        # cfg `cls` scales the class term, `box` the GIoU term (the box-overlap gain, as in the
        # YOLO families); L1 has no config key: its upstream weight 5.
        self.gain_cls = float(getattr(cfg, "cls", GAIN_CLS)) if cfg is not None else GAIN_CLS
        self.gain_giou = float(getattr(cfg, "box", GAIN_GIOU)) if cfg is not None else GAIN_GIOU
        self.gain_l1 = GAIN_L1
        self.item_names = (self.cls_name, "l1", "giou", *self.extra_names)

    # ------------------------------------------------------------------ seams
    def classification(self, logits: Tensor, onehot: Tensor, score: Tensor) -> Tensor:
        """VFL per entry: logits/onehot/score [B, S, Q, C] -> [B, S, Q, C] (upstream loss_labels_vfl)."""
        p = logits.detach().sigmoid()
        weight = VFL_ALPHA * p.pow(VFL_GAMMA) * (1 - onehot) + score
        return F.binary_cross_entropy_with_logits(logits, score, weight=weight, reduction="none")

    def output_sets(self, out: DETROutput) -> dict[str, tuple[Tensor, Tensor]]:
        """The Hungarian-matched sets, name -> (logits [B, S, Q, C], boxes [B, S, Q, 4])."""
        return {"dec": (out.logits, out.boxes), "enc": (out.enc_logits, out.enc_boxes)}

    def match_cost(self, logits: Tensor, boxes: Tensor, labels: Tensor, tgt_boxes: Tensor) -> Tensor:
        """The matching cost of N stacked sets [N, M, Q] (matcher.match_cost's arguments)."""
        return match_cost(logits, boxes, labels, tgt_boxes)

    def extra_terms(self, out: DETROutput, pairs: dict[str, SetPairs], tgt: NormTargets) -> dict[str, Tensor]:
        """More gain-weighted per-image sums ([B] each, keys = `extra_names`); none here."""
        return {}

    # ------------------------------------------------------------------ the loss
    def _per_image(self, preds: DETROutput, targets: Targets) -> tuple[Tensor, Tensor]:
        out = preds.to(torch.float32)
        tgt = normalise_targets(targets, out.extra[INPUT_WH])
        sets = self.output_sets(out)
        pairs = self.match(sets, tgt)
        cls, l1, gi = 0.0, 0.0, 0.0
        for name, (logits, boxes) in sets.items():
            c, a, g = self.pair_terms(logits, boxes, pairs[name], tgt)
            cls, l1, gi = cls + c, l1 + a, gi + g
        if out.dn_logits.shape[2] > 0:
            pairs["dn"] = dn_pairs(out.dn_target, out.dn_logits.shape[1], tgt.valid)
            c, a, g = self.pair_terms(out.dn_logits, out.dn_boxes, pairs["dn"], tgt, dn_live(out))
            cls, l1, gi = cls + c / out.dn_groups, l1 + a / out.dn_groups, gi + g / out.dn_groups
        terms = [cls * self.gain_cls, l1 * self.gain_l1, gi * self.gain_giou]
        extra = self.extra_terms(out, pairs, tgt)
        terms += [extra[k] for k in self.extra_names]
        return torch.stack(terms, 1), tgt.valid.sum(1).float()

    def match(self, sets: dict[str, tuple[Tensor, Tensor]], tgt: NormTargets) -> dict[str, SetPairs]:
        """Every set of `sets` matched in one solve (their Q must agree) -> name -> SetPairs."""
        names = list(sets)
        logits = torch.cat([sets[n][0] for n in names], 1)  # [B, S, Q, C]
        boxes = torch.cat([sets[n][1] for n in names], 1)
        b, s, q, _ = logits.shape
        m = tgt.labels.shape[1]

        def per_set(t: Tensor) -> Tensor:  # [B, M, ...] -> [B * S, M, ...]
            return t.unsqueeze(1).expand(b, s, *t.shape[1:]).flatten(0, 1)

        cost = self.match_cost(logits.detach().flatten(0, 1), boxes.detach().flatten(0, 1),
                               per_set(tgt.labels), per_set(tgt.boxes))
        res = solve(cost, per_set(tgt.valid), self.backend)
        query, mask = res.query.view(b, s, m), res.matched.view(b, s, m)
        target = torch.arange(m, device=query.device).expand(b, s, m)
        out, start = {}, 0
        for n in names:
            k = sets[n][0].shape[1]
            out[n] = SetPairs(query[:, start:start + k], target[:, start:start + k], mask[:, start:start + k])
            start += k
        return out

    def pair_terms(self, logits: Tensor, boxes: Tensor, pairs: SetPairs, tgt: NormTargets,
                   keep: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """(class, L1, 1 - GIoU) per image [B] of S sets: logits [B, S, Q, C], boxes [B, S, Q, 4];
        `keep [B, Q]` (None: all) the queries whose class term counts (a dropped query has no pair)."""
        b, s, q, c = logits.shape
        p = pairs.query.shape[2]
        pred = boxes.gather(2, pairs.query.unsqueeze(-1).expand(b, s, p, 4))
        true = tgt.boxes.unsqueeze(1).expand(b, s, -1, 4).gather(2, pairs.target.unsqueeze(-1).expand(b, s, p, 4))
        label = tgt.labels.unsqueeze(1).expand(b, s, -1).gather(2, pairs.target).clamp(0, c - 1)
        iou, g = iou_giou(cxcywh_to_xyxy(pred), cxcywh_to_xyxy(true))
        zero = torch.zeros((), device=logits.device)
        l1 = torch.where(pairs.mask, (pred - true).abs().sum(-1), zero).sum((1, 2))
        gi = torch.where(pairs.mask, 1 - g, zero).sum((1, 2))
        # One query takes at most one target per set, so scatter_add writes each entry once.
        flat = pairs.query * c + label
        onehot = logits.new_zeros(b, s, q * c).scatter_add_(2, flat, pairs.mask.float()).view(b, s, q, c)
        score = logits.new_zeros(b, s, q * c).scatter_add_(
            2, flat, torch.where(pairs.mask, iou.detach(), zero)).view(b, s, q, c)
        cls = self.classification(logits, onehot, score)
        if keep is not None:
            cls = torch.where(keep[:, None, :, None], cls, zero)
        return cls.sum((1, 2, 3)), l1, gi


def normalise_targets(targets: Targets, wh: Tensor) -> NormTargets:
    """Pixel xyxy targets -> cxcywh normalised by the input (w, h) ([B, 2])."""
    scale = wh.float().repeat(1, 2).unsqueeze(1)  # [B, 1, 4]
    boxes = xyxy_to_cxcywh(targets.boxes.float() / scale)
    return NormTargets(boxes, targets.labels.long(), targets.valid.bool())


def dn_live(out: DETROutput) -> Tensor | None:
    """[B, D] the dn queries the loss counts (the live slots, denoise.py), or None: all of them."""
    return out.extra.get(DN_LIVE)


def dn_pairs(dn_target: Tensor, layers: int, valid: Tensor) -> SetPairs:
    """The fixed dn pairs: query d reconstructs target dn_target[d] (>= 0), for every layer.
    A pair whose target is not valid in `valid [B, M]` is dropped (the same output scored
    against other targets, e.g. an all-empty batch in the tests)."""
    b, d = dn_target.shape
    query = torch.arange(d, device=dn_target.device).expand(b, layers, d)
    target = dn_target.clamp(min=0)
    mask = (dn_target >= 0) & valid.gather(1, target)
    return SetPairs(query, target.unsqueeze(1).expand(b, layers, d), mask.unsqueeze(1).expand(b, layers, d))


def criterion(model: Any, cfg: Any = None) -> DETRLoss:
    return DETRLoss(model, cfg)
