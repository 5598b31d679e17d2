"""RTMDet assigner and loss: hand-worked assignment, a loop reference, the [B, M, A] soft class
cost reformulation, QFL/GIoU references, batch == one image at a time, empty images, gains."""

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from testkit import random_targets

from libreyolo.families.rtmdet import build, criterion
from libreyolo.families.rtmdet.assign import assign, soft_class_cost
from libreyolo.families.rtmdet.boxes import box_giou, box_iou


# ----------------------------------------------------------------------------- assigner
def _hand_example():
    """Six priors on a row, y = 8, x = 0, 8, ..., 40, stride 8; all logits 0 (p = 0.5), 2 classes.

    Image 0: gt0 [2, 2, 20, 14] class 0 holds priors 1, 2; gt1 [18, 2, 46, 14] class 1 holds 3, 4, 5;
    a padded third row covers everything. Predictions: p1 = gt0 exactly, p2 [10, 2, 20, 14]
    (IoU 120/216 = 0.556 with gt0), p3 = gt1 exactly, p4 [22, 2, 42, 14] (IoU 240/336 = 0.714),
    p5 [36, 2, 46, 14] (IoU 0.357); p1, p2 also touch gt1 (IoU 24/528, 24/432).
      gt0: top IoUs 1 + 0.556 + 0.045 -> k = 1 -> its cheapest candidate, prior 1 (IoU cost 0).
      gt1: 1 + 0.714 + 0.357 + 0.056 + 0.045 = 2.17 -> k = 2 -> priors 3 (cost ~0.18) and
      4 (~1.05) beat 5 (~3.11: -3 ln 0.357 = 3.09) and 1, 2 (-3 ln 0.05 ~ 9).
    Image 1: gt0 [2, 2, 20, 14] class 0 and gt1 [4, 2, 22, 14] class 1 both hold priors 1, 2;
    p1 = gt0 exactly, p2 a junk box [0, 0, 1, 1]. Each gt has k = 1 and both pick prior 1
    (gt1: IoU 192/240 = 0.8 there, ~0 at prior 2). Conflict: cost(gt0) = 0.173 (BCE(0, 1) * 0.25)
    + 0 + 10^(0.375 - 3) ~ 0.176 < cost(gt1) = 0.062 + 0.669 + 0.004 ~ 0.736 -> gt0 keeps it.
    Image 2: no valid gt.
    """
    points = torch.tensor([[0.0, 8], [8, 8], [16, 8], [24, 8], [32, 8], [40, 8]])
    strides = torch.full((6, 1), 8.0)
    far = [0.0, 0, 4, 4]
    pd0 = [far, [2, 2, 20, 14], [10, 2, 20, 14], [18, 2, 46, 14], [22, 2, 42, 14], [36, 2, 46, 14]]
    pd1 = [far, [2, 2, 20, 14], [0, 0, 1, 1], far, far, far]
    pd_boxes = torch.tensor([pd0, pd1, pd0])
    gt_boxes = torch.tensor([[[2.0, 2, 20, 14], [18, 2, 46, 14], [0, 0, 64, 64]],
                             [[2.0, 2, 20, 14], [4, 2, 22, 14], [0, 0, 64, 64]],
                             [[2.0, 2, 20, 14], [18, 2, 46, 14], [0, 0, 64, 64]]])
    labels = torch.tensor([[0, 1, 1], [0, 1, 0], [0, 1, 1]])
    valid = torch.tensor([[True, True, False], [True, True, False], [False, False, False]])
    return torch.zeros(3, 6, 2), pd_boxes, points, strides, labels, gt_boxes, valid


def test_assigner_hand_worked():
    out = assign(*_hand_example())
    assert out.fg.tolist() == [[False, True, False, True, True, False],
                               [False, True, False, False, False, False],
                               [False] * 6]
    assert out.boxes[0, 1].tolist() == [2, 2, 20, 14] and out.labels[0, 1] == 0
    assert out.boxes[0, 3].tolist() == [18, 2, 46, 14] and out.labels[0, 3] == 1
    assert out.boxes[0, 4].tolist() == [18, 2, 46, 14] and out.labels[0, 4] == 1
    assert out.boxes[1, 1].tolist() == [2, 2, 20, 14] and out.labels[1, 1] == 0  # conflict won
    want = torch.tensor([[0, 1, 0, 1, 240 / 336, 0], [0, 1, 0, 0, 0, 0], [0] * 6])
    assert torch.allclose(out.ious, want.float(), atol=1e-5)


def test_assigner_min_k_raises_the_floor_of_dynamic_k():
    """gt0's top IoUs sum to 1.6 (k = 1): a floor of 2 adds its next cheapest candidate, prior 2
    (IoU 0.556); gt1's k is 2 already, so it keeps priors 3 and 4."""
    out = assign(*_hand_example(), min_k=2)
    assert out.fg[0].tolist() == [False, True, True, True, True, False]
    assert out.labels[0, 2] == 0 and abs(out.ious[0, 2].item() - 120 / 216) < 1e-5


def _reference_assign(logits, pd_boxes, points, strides, labels, boxes, valid, topk=13):
    """Per-image loop with boolean indexing, step by step as mmdet's DynamicSoftLabelAssigner."""
    b, a, c = logits.shape
    fg = torch.zeros(b, a, dtype=torch.bool)
    ious_out = torch.zeros(b, a)
    gt_out = torch.zeros(b, a, dtype=torch.long)
    for i in range(b):
        gts, lab = boxes[i][valid[i]], labels[i][valid[i]]
        if len(gts) == 0:
            continue
        deltas = torch.cat((points[:, None] - gts[:, :2], gts[:, 2:] - points[:, None]), -1)
        cand = (deltas.min(-1).values > 0).any(1)
        if not cand.any():
            continue
        pri, x = points[cand], logits[i][cand]
        dist = (pri[:, None] - (gts[:, :2] + gts[:, 2:]) / 2).norm(dim=-1) / strides[cand]
        iou = box_iou(pd_boxes[i][cand][:, None], gts[None])  # [V, G]
        soft = F.one_hot(lab, c).float()[None] * iou[..., None]
        xs = x[:, None].expand(-1, len(gts), -1)
        cls = (F.binary_cross_entropy_with_logits(xs, soft, reduction="none")
               * (soft - xs.sigmoid()).pow(2)).sum(-1)
        cost = cls - torch.log(iou + 1e-7) * 3 + torch.pow(10, dist - 3)
        ks = iou.topk(min(topk, len(pri)), 0).values.sum(0).int().clamp(min=1)
        match = torch.zeros_like(cost)
        for g in range(len(gts)):
            match[cost[:, g].topk(int(ks[g]), largest=False).indices, g] = 1
        for v in range(len(pri)):
            if match[v].sum() > 1:
                match[v] = 0
                match[v, cost[v].argmin()] = 1
        idx = cand.nonzero().flatten()
        hit = match.sum(1) > 0
        fg[i, idx[hit]] = True
        ious_out[i, idx[hit]] = (match * iou).sum(1)[hit]
        gt_out[i, idx[hit]] = valid[i].nonzero().flatten()[match[hit].argmax(1)]
    return fg, ious_out, gt_out


def test_assigner_matches_loop_reference_on_random_scene():
    gen = torch.Generator().manual_seed(3)
    side = 8
    ys, xs = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
    points = torch.stack((xs, ys), -1).reshape(-1, 2).float() * 8  # 64 priors, stride 8
    strides = torch.full((side * side, 1), 8.0)
    b, a, c = 3, side * side, 4
    logits = torch.randn(b, a, c, generator=gen) * 2
    centre = points.unsqueeze(0) + torch.rand(b, a, 2, generator=gen) * 8
    half = 3 + torch.rand(b, a, 2, generator=gen) * 14
    pd_boxes = torch.cat((centre - half, centre + half), -1)
    tg = random_targets(gen, b, 8, 64, c, [3, 0, 6], min_wh=6.0)
    out = assign(logits, pd_boxes, points, strides, tg.labels, tg.boxes, tg.valid)
    fg, ious, gt_idx = _reference_assign(logits, pd_boxes, points, strides, tg.labels, tg.boxes,
                                         tg.valid)
    assert fg.sum() > 5 and torch.equal(out.fg, fg)
    assert torch.allclose(out.ious, ious, atol=1e-6)
    want_boxes = tg.boxes.gather(1, gt_idx.unsqueeze(-1).expand(b, a, 4))
    assert torch.equal(out.boxes[fg], want_boxes[fg])
    assert torch.equal(out.labels[fg], tg.labels.gather(1, gt_idx)[fg])


def test_soft_class_cost_equals_direct_sum_over_classes():
    gen = torch.Generator().manual_seed(0)
    b, m, a, c = 2, 3, 5, 4
    logits = torch.randn(b, a, c, generator=gen) * 3
    labels = torch.randint(0, c, (b, m), generator=gen)
    ious = torch.rand(b, m, a, generator=gen)
    soft = F.one_hot(labels, c).float()[:, :, None] * ious[..., None]  # [B, M, A, C]
    x = logits[:, None].expand(b, m, a, c)
    direct = (F.binary_cross_entropy_with_logits(x, soft, reduction="none")
              * (soft - x.sigmoid()).square()).sum(-1)
    assert torch.allclose(soft_class_cost(logits, labels, ious), direct, atol=1e-5)


def test_box_iou_and_giou_reference():
    a = torch.tensor([[0.0, 0, 10, 10], [0, 0, 10, 10], [0, 0, 2, 2], [5, 5, 3, 3]])
    b = torch.tensor([[5.0, 0, 15, 10], [0, 0, 10, 10], [4, 4, 6, 6], [0, 0, 1, 1]])
    # inter 50, union 150, enclosing 150 | equal | disjoint: enclosing 36, union 8 |
    # inverted box (negative width, as linear distances can give): finite, no overlap.
    assert torch.allclose(box_iou(a, b)[:3], torch.tensor([1 / 3, 1, 0]))
    assert torch.allclose(box_giou(a, b)[:3], torch.tensor([1 / 3, 1, -28 / 36]))
    assert torch.isfinite(box_giou(a, b)).all() and box_iou(a, b)[3] == 0
    pair = box_iou(a[:, None], b[None])
    assert pair.shape == (4, 4) and torch.allclose(pair[1, 0], box_iou(a[1], b[0]))


def test_qfl_term_matches_split_formula():
    """The dense QFL equals GFL's form: negatives BCE(x, 0) p^2, the positive's class
    BCE(x, IoU) |IoU - p|^2; the normaliser is the positives' IoU sum."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(5)
    model = build("t", 3).train()
    crit = criterion(model, SimpleNamespace(box=0.0, cls=1.0))
    tg = random_targets(gen, 1, 8, 64, 3, [5], min_wh=6.0)
    with torch.no_grad():
        preds = model(torch.rand(1, 3, 64, 64))
        raw, norm = crit.per_image(preds, tg)
        x = torch.cat([p.flatten(2) for p in preds], 2).transpose(1, 2)[0, :, :3]
        points, strides = model.priors(preds)
        dist = torch.cat([p.flatten(2) for p in preds], 2).transpose(1, 2)[:, :, 3:]
        boxes = torch.cat((points - dist[..., :2], points + dist[..., 2:]), -1)
        gt = assign(x[None], boxes, points, strides, tg.labels, tg.boxes, tg.valid)
    p = x.sigmoid()
    want = 0.0
    for k in range(x.shape[0]):
        for c in range(3):
            if gt.fg[0, k] and gt.labels[0, k] == c:
                y = gt.ious[0, k].item()
                want += (F.binary_cross_entropy_with_logits(x[k, c], torch.tensor(y))
                         * abs(y - p[k, c].item()) ** 2).item()
            else:
                want += (F.softplus(x[k, c]) * p[k, c] ** 2).item()
    assert gt.fg.any() and raw[0, 0] == 0
    assert raw[0, 1].item() == pytest.approx(want, rel=1e-4)
    assert norm[0].item() == pytest.approx(gt.ious.sum().item(), rel=1e-6)


def test_gains_from_cfg():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(4)
    model = build("t", 3).train()
    tg = random_targets(gen, 2, 8, 64, 3, [3, 2], min_wh=6.0)
    with torch.no_grad():
        preds = model(torch.rand(2, 3, 64, 64))
    base = criterion(model, None)
    doubled = criterion(model, SimpleNamespace(box=4.0, cls=2.0))
    _, items = base(preds, tg)
    _, items2 = doubled(preds, tg)
    assert base.gains == (2.0, 1.0)
    assert torch.allclose(items2, items * 2, rtol=1e-5)
    assert math.isfinite(items.sum().item())
