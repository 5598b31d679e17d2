"""D-FINE and DEIM losses: the core's set-prediction loss (VFL, L1, GIoU) plus FGL and DDF; DEIM
swaps VFL for MAL.

Facts from github:Peterande/D-FINE src/zoo/dfine/dfine_criterion.py, configs/dfine/include/
dfine_hgnetv2.yml (`weight_dict: {loss_vfl: 1, loss_bbox: 5, loss_giou: 2, loss_fgl: 0.15,
loss_ddf: 1.5}`, VFL alpha 0.75 gamma 2, reg_max 32), and github:ShihuaHuang95/DEIM
engine/deim/deim_criterion.py, configs/base/deim.yml (`loss_mal: 1`, gamma 1.5, mal_alpha None,
use_uni_set True by default):
- Output sets: every decoder layer, the layer-0 "pre" box head, the encoder query selection
  (each Hungarian-matched on its own, all in ONE solve) and the dn queries of every layer and of
  the pre head (fixed pairs, terms divided by the group count).
- Classification (VFL, or MAL for DEIM) uses each set's own matching. L1, GIoU and FGL use the
  *union set* (`union_pairs`): every query matched to a target in any of the decoder layers,
  pre or encoder sets, paired with the target it was matched to most often. Upstream divides
  those terms by the union's size; here each image's union terms are scaled by
  n_i / |union_i| so the batch keeps ONE normaliser, the number of target boxes (PerImageLoss).
- FGL (fine-grained localisation): per edge of a matched query, the target edge distance in the
  FDR units around the layer's reference (`box_to_distance`) falls between two bins of W(n);
  cross-entropy of the corner logits against both, weighted by the linear interpolation, times
  the IoU of the layer's box with its target (detached). Decoder and dn layers.
- DDF (decoupled distillation focal): layers 0..L-2 learn the last layer's corner distributions,
  KL(softmax(teacher / T) || softmax(student / T)) * T^2 (T = 5) per edge, weighted by the IoU
  (matched queries) or the teacher's max class probability (the rest), averaged separately over
  matched and unmatched edges and mixed with weights sqrt(8 * count / B) of each. Here the means
  and counts are per image and the image's value is multiplied by n_i (per-image sums, one
  normaliser): an image without targets contributes no DDF. The last layer is its own teacher
  (exactly 0, as upstream); at initialisation every layer's corners are 0 (zero-init heads),
  so DDF starts at exactly 0 too.
- MAL (matchability-aware, DEIM): BCE against (IoU one-hot)^gamma, weight p^gamma on negatives
  and 1 on the positive entry, gamma 1.5.
Float32, vectorised over images, sets and layers (no loop over images), no `.item()`. This module
adds no host sync: a D-FINE step's (model.host_syncs, counted on the GPU by
tests/gpu/test_detr_gpu.py) are the denoising group count (detr/denoise.py; none under
static_shapes) and, where the Triton solve is missing, the matcher's (detr/matcher.py).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..base import Targets
from ..detr.boxes import cxcywh_to_xyxy, iou_giou
from ..detr.criterion import DETRLoss, NormTargets, SetPairs, dn_live, dn_pairs, normalise_targets
from ..detr.output import INPUT_WH, DETROutput
from .decoder import box_to_distance, weighting_function

GAIN_FGL, GAIN_DDF = 0.15, 1.5   # include/dfine_hgnetv2.yml DFINECriterion weight_dict
DDF_T = 5.0                       # dfine_criterion.py loss_local(T=5)
DDF_BATCH_SCALE = 8.0             # loss_local: batch_scale = 8 / per-GPU batch
MAL_GAMMA = 1.5                   # DEIM configs/base/deim.yml DEIMCriterion gamma
UNION_SETS = ("dec", "pre", "enc")


def union_pairs(pairs: dict[str, SetPairs], queries: int) -> SetPairs:
    """The union set over `UNION_SETS`: per query [B, 1, Q] the target it was matched to most
    often (ties: the lower target index), mask = matched anywhere."""
    q = torch.cat([pairs[n].query for n in UNION_SETS], 1)    # [B, S, M]
    mask = torch.cat([pairs[n].mask for n in UNION_SETS], 1)
    b, _, m = q.shape
    counts = q.new_zeros(b, queries * m, dtype=torch.float32)
    flat = q * m + torch.arange(m, device=q.device)
    counts.scatter_add_(1, flat.flatten(1), mask.flatten(1).float())
    best, target = counts.view(b, queries, m).max(-1)
    query = torch.arange(queries, device=q.device).expand(b, queries)
    return SetPairs(query.unsqueeze(1), target.unsqueeze(1), (best > 0).unsqueeze(1))


def expand_pairs(pairs: SetPairs, sets: int) -> SetPairs:
    return SetPairs(*(t.expand(-1, sets, -1) for t in pairs))


def gather_pairs(t: Tensor, index: Tensor) -> Tensor:
    """t [B, S, Q, K], index [B, S, P] -> [B, S, P, K]."""
    return t.gather(2, index.unsqueeze(-1).expand(*index.shape, t.shape[-1]))


class DFINELoss(DETRLoss):
    """Items (vfl | mal, l1, giou, fgl, ddf): gain-weighted sums over every output set."""

    extra_names = ("fgl", "ddf")

    def __init__(self, model: Any, cfg: Any = None, backend: str | None = None):
        super().__init__(model, cfg, backend)
        model = getattr(model, "module", model)
        decoder = model.decoder
        self.reg_max, self.reg_scale = decoder.reg_max, decoder.reg_scale
        self._w = weighting_function(decoder.reg_max, 0.5, decoder.reg_scale)
        self._w_on: dict[torch.device, Tensor] = {}  # W(n) per device, copied once

    def project(self, device: torch.device) -> Tensor:
        if device not in self._w_on:
            self._w_on[device] = self._w.to(device)
        return self._w_on[device]

    def output_sets(self, out: DETROutput) -> dict[str, tuple[Tensor, Tensor]]:
        return {"dec": (out.logits, out.boxes),
                "pre": (out.extra["pre_logits"].unsqueeze(1), out.extra["pre_boxes"].unsqueeze(1)),
                "enc": (out.enc_logits, out.enc_boxes)}

    def _per_image(self, preds: DETROutput, targets: Targets) -> tuple[Tensor, Tensor]:
        out = preds.to(torch.float32)
        tgt = normalise_targets(targets, out.extra[INPUT_WH])
        sets = self.output_sets(out)
        pairs = self.match(sets, tgt)
        q = out.logits.shape[2]
        union = union_pairs(pairs, q)
        n = tgt.valid.sum(1).float()
        union_scale = n / union.mask.sum((1, 2)).clamp(min=1)  # n_i / |union_i|
        cls = l1 = gi = 0.0
        for name, (logits, boxes) in sets.items():
            cls = cls + self.pair_terms(logits, boxes, pairs[name], tgt)[0]
            # Box terms on the union pairs; the class term of this call is discarded, so it runs
            # on class channel 0 only (cheap).
            _, a, g = self.pair_terms(logits[..., :1], boxes, expand_pairs(union, logits.shape[1]), tgt)
            l1, gi = l1 + a * union_scale, gi + g * union_scale
        layers = expand_pairs(union, out.logits.shape[1])
        fgl = self.fgl(out.boxes, out.extra["corners"], out.extra["refs"], layers, tgt) * union_scale
        ddf_w = self.ddf_weights(layers.mask[:, 0], n)
        ddf = self.ddf(out.logits, out.boxes, out.extra["corners"], layers, tgt, ddf_w)
        if out.dn_logits.shape[2] > 0:
            g, live = out.dn_groups, dn_live(out)
            dn = dn_pairs(out.dn_target, out.dn_logits.shape[1], tgt.valid)
            dn_pre = dn_pairs(out.dn_target, 1, tgt.valid)
            for (logits, boxes), p in (((out.dn_logits, out.dn_boxes), dn),
                                       ((out.extra["dn_pre_logits"].unsqueeze(1),
                                         out.extra["dn_pre_boxes"].unsqueeze(1)), dn_pre)):
                c, a, b = self.pair_terms(logits, boxes, p, tgt, live)
                cls, l1, gi = cls + c / g, l1 + a / g, gi + b / g
            fgl = fgl + self.fgl(out.dn_boxes, out.extra["dn_corners"], out.extra["dn_refs"], dn, tgt) / g
            ddf = ddf + self.ddf(out.dn_logits, out.dn_boxes, out.extra["dn_corners"], dn, tgt, ddf_w, live)
        terms = [cls * self.gain_cls, l1 * self.gain_l1, gi * self.gain_giou, fgl * GAIN_FGL, ddf * GAIN_DDF]
        return torch.stack(terms, 1), n

    # ------------------------------------------------------------------ FGL
    def fgl(self, boxes: Tensor, corners: Tensor, refs: Tensor, pairs: SetPairs, tgt: NormTargets) -> Tensor:
        """Per-image sum over layers and matched queries: boxes/refs [B, L, Q, 4], corners
        [B, L, Q, 4 * (reg_max + 1)] -> [B]."""
        b, s, p = pairs.query.shape
        true = tgt.boxes.unsqueeze(1).expand(b, s, -1, 4).gather(2, pairs.target.unsqueeze(-1).expand(b, s, p, 4))
        pred = gather_pairs(boxes, pairs.query)
        ref = gather_pairs(refs, pairs.query)
        logits = gather_pairs(corners, pairs.query).unflatten(-1, (4, self.reg_max + 1))
        with torch.no_grad():
            iou = iou_giou(cxcywh_to_xyxy(pred), cxcywh_to_xyxy(true))[0]
            left, w_left, w_right = self.bin_targets(box_to_distance(ref, cxcywh_to_xyxy(true), self.reg_scale))
        logp = F.log_softmax(logits, -1)
        ce_left = -logp.gather(-1, left.unsqueeze(-1)).squeeze(-1)
        ce_right = -logp.gather(-1, (left + 1).unsqueeze(-1)).squeeze(-1)
        loss = ((ce_left * w_left + ce_right * w_right) * iou.unsqueeze(-1)).sum(-1)
        return torch.where(pairs.mask, loss, 0.0).sum((1, 2))

    def bin_targets(self, dist: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Edge distances -> (left bin, its weight, the right bin's weight), as upstream's
        translate_gt + bbox2distance: below W(0) all weight on bin 0, at/above W(reg_max) all on
        bin reg_max, else linear between the neighbouring bins."""
        w = self.project(dist.device)
        idx = (w <= dist.unsqueeze(-1)).sum(-1) - 1                 # [..., 4], -1 .. reg_max
        inside = (idx >= 0) & (idx < self.reg_max)
        left = idx.clamp(0, self.reg_max - 1)
        lo, hi = w[left], w[left + 1]
        w_right = torch.where(inside, (dist - lo).abs() / ((dist - lo).abs() + (hi - dist).abs()).clamp(min=1e-12),
                              (idx >= self.reg_max).to(dist.dtype))
        return left, 1.0 - w_right, w_right

    # ------------------------------------------------------------------ DDF
    def ddf_weights(self, matched: Tensor, n: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Per image (w_pos, w_neg, n) from the non-dn matched mask [B, Q]: the mixing weights
        sqrt(8 * edges) of the matched and unmatched edges (upstream's batch_scale with one image)."""
        pos = matched.sum(1).float() * 4
        neg = matched.shape[1] * 4 - pos
        return (pos * DDF_BATCH_SCALE).sqrt(), (neg * DDF_BATCH_SCALE).sqrt(), n

    def ddf(self, logits: Tensor, boxes: Tensor, corners: Tensor, pairs: SetPairs, tgt: NormTargets,
            weights: tuple[Tensor, Tensor, Tensor], keep: Tensor | None = None) -> Tensor:
        """Layers 0..L-2 distilled from layer L-1 -> [B] (n_i times the image's mixed mean); `keep
        [B, Q]` (None: all) the queries that count, the dead dn slots left out of the unmatched mean."""
        layers = corners.shape[1]
        if layers < 2:
            return corners.new_zeros(corners.shape[0])
        b, _, q, _ = corners.shape
        student = corners[:, :-1].unflatten(-1, (4, self.reg_max + 1))
        teacher = corners[:, -1:].detach().unflatten(-1, (4, self.reg_max + 1))
        kl = F.kl_div(F.log_softmax(student / DDF_T, -1), F.softmax(teacher / DDF_T, -1),
                      reduction="none").sum(-1) * DDF_T ** 2              # [B, L-1, Q, 4]
        aux = SetPairs(*(t[:, :-1] for t in pairs))
        with torch.no_grad():
            true = tgt.boxes.unsqueeze(1).expand(b, layers - 1, -1, 4).gather(
                2, aux.target.unsqueeze(-1).expand(*aux.target.shape, 4))
            pred = gather_pairs(boxes[:, :-1], aux.query)
            iou = torch.where(aux.mask, iou_giou(cxcywh_to_xyxy(pred), cxcywh_to_xyxy(true))[0], 0.0)
            weight = logits[:, -1:].detach().sigmoid().amax(-1).expand(b, layers - 1, q).clone()
            matched = torch.zeros(b, layers - 1, q, dtype=torch.bool, device=corners.device)
            matched.scatter_(2, aux.query, aux.mask)
            # a query appears at most once per layer with mask True; unmatched slots write nothing
            weight.scatter_(2, aux.query, torch.where(aux.mask, iou, weight.gather(2, aux.query)))
        loss = kl * weight.unsqueeze(-1)
        m4 = matched.unsqueeze(-1).expand_as(loss)
        unmatched = ~m4 if keep is None else ~m4 & keep[:, None, :, None]
        pos_n, neg_n = m4.sum((2, 3)).float(), unmatched.sum((2, 3)).float()     # [B, L-1]
        pos = torch.where(m4, loss, 0.0).sum((2, 3)) / pos_n.clamp(min=1)
        neg = torch.where(unmatched, loss, 0.0).sum((2, 3)) / neg_n.clamp(min=1)
        w_pos, w_neg, n = (w.unsqueeze(1) for w in weights)
        mixed = (pos * w_pos + neg * w_neg) / (w_pos + w_neg).clamp(min=1e-12)
        return (mixed * n).sum(1)


class DEIMLoss(DFINELoss):
    """DEIM: MAL replaces VFL (items mal, l1, giou, fgl, ddf)."""

    cls_name = "mal"

    def classification(self, logits: Tensor, onehot: Tensor, score: Tensor) -> Tensor:
        p = logits.detach().sigmoid()
        weight = p.pow(MAL_GAMMA) * (1 - onehot) + onehot
        return F.binary_cross_entropy_with_logits(logits, score.pow(MAL_GAMMA), weight=weight, reduction="none")


def criterion(model: Any, cfg: Any = None) -> DFINELoss:
    return DFINELoss(model, cfg)


def deim_criterion(model: Any, cfg: Any = None) -> DEIMLoss:
    return DEIMLoss(model, cfg)
