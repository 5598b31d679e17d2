"""YOLOv9 loss and task-aligned assigner: hand-worked assignment, CIoU/DFL references,
vectorisation (batch == one image at a time), finiteness with empty images, cfg gains."""

import math
from types import SimpleNamespace

import pytest
import torch
from testkit import random_targets

from libreyolo.families.common import bbox_iou, dfl_loss
from libreyolo.families.yolo9 import build, criterion
from libreyolo.families.yolo9.assign import TaskAlignedAssigner


# ----------------------------------------------------------------------------- assigner
def _hand_example():
    """Six anchors on a row (y = 5, x = 5..55); two gts; a padded third gt covering everything.

    gt0 [0, 0, 30, 10] class 0 contains anchors 0, 1, 2; gt1 [20, 0, 60, 10] class 1 contains
    anchors 2, 3, 4, 5. All scores are 0.5, so ranking is by CIoU with the predicted boxes:
      anchor 0 predicts gt0 exactly (CIoU 1), anchor 1 a centred 20x6 box (IoU 0.4 with gt0),
      anchor 2 predicts gt1 exactly (CIoU 1 with gt1, IoU 1/6 with gt0),
      anchor 3 a centred 30x8 box (IoU 0.6 with gt1), anchor 4 a centred 20x6 box (IoU 0.3),
      anchor 5 an off-centre 10x10 box (IoU 0.25, minus a centre penalty: CIoU ~0.12).
    """
    points = torch.tensor([[5.0, 5], [15, 5], [25, 5], [35, 5], [45, 5], [55, 5]])
    pd_boxes = torch.tensor([[[0.0, 0, 30, 10], [5, 2, 25, 8], [20, 0, 60, 10],
                              [25, 1, 55, 9], [30, 2, 50, 8], [50, 0, 60, 10]]])
    pd_scores = torch.full((1, 6, 2), 0.5)
    gt_boxes = torch.tensor([[[0.0, 0, 30, 10], [20, 0, 60, 10], [0, 0, 64, 64]]])
    gt_labels = torch.tensor([[0, 1, 1]])
    valid = torch.tensor([[True, True, False]])
    return pd_scores, pd_boxes, points, gt_labels, gt_boxes, valid


def test_assigner_hand_worked_topk3():
    # top-3: gt0 takes {0, 1, 2}, gt1 takes {2, 3, 4} (anchor 5 ranks last). Anchor 2 is claimed
    # twice and goes to gt1, which it overlaps with CIoU 1 (vs IoU 1/6 with gt0).
    out = TaskAlignedAssigner(2, topk=3)(*_hand_example())
    assert out.fg.tolist() == [[True, True, True, True, True, False]]
    gt0, gt1 = [0.0, 0, 30, 10], [20.0, 0, 60, 10]
    assert out.boxes[0, :5].tolist() == [gt0, gt0, gt1, gt1, gt1]
    # Soft targets: t = s^0.5 u^6 normalised per gt so its best anchor gets its best IoU (1 here):
    # an exact prediction scores 1, the others ~IoU^6 (centred boxes: CIoU ~ IoU).
    s = out.scores[0]
    assert s[:, 1].tolist()[:2] == [0.0, 0.0] and s[2:, 0].tolist() == [0.0] * 4
    assert s[0, 0].item() == pytest.approx(1.0, abs=1e-5)
    assert s[2, 1].item() == pytest.approx(1.0, abs=1e-5)
    assert s[1, 0].item() == pytest.approx(0.4 ** 6, rel=0.02)
    assert s[3, 1].item() == pytest.approx(0.6 ** 6, rel=0.02)
    assert s[4, 1].item() == pytest.approx(0.3 ** 6, rel=0.02)
    assert s[5].tolist() == [0.0, 0.0]


def test_assigner_hand_worked_default_topk_and_empty_image():
    pd_scores, pd_boxes, points, labels, boxes, valid = _hand_example()
    # Image 1 is the same picture with no valid gt: nothing may be assigned there.
    batch = (pd_scores.repeat(2, 1, 1), pd_boxes.repeat(2, 1, 1), points, labels.repeat(2, 1),
             boxes.repeat(2, 1, 1), torch.cat((valid, torch.zeros_like(valid))))
    out = TaskAlignedAssigner(2)(*batch)  # top-10 > candidates: every candidate is positive
    assert out.fg.tolist() == [[True] * 6, [False] * 6]
    assert out.boxes[0, :, 0].tolist() == [0.0, 0.0, 20.0, 20.0, 20.0, 20.0]
    assert out.scores[1].abs().sum() == 0


def _reference_assign(pd_scores, pd_boxes, points, labels, boxes, valid, topk=10):
    """Loop-per-gt reference written straight from the TOOD/YOLOv9 description."""
    b, a, c = pd_scores.shape
    fg = torch.zeros(b, a, dtype=torch.bool)
    scores = torch.zeros(b, a, c)
    for i in range(b):
        claims = {}  # anchor -> list of (gt, overlap, metric)
        for j in range(boxes.shape[1]):
            if not valid[i, j]:
                continue
            x1, y1, x2, y2 = boxes[i, j].tolist()
            inside = [k for k in range(a) if x1 < points[k, 0] < x2 and y1 < points[k, 1] < y2]
            u = {k: max(bbox_iou(boxes[i, j], pd_boxes[i, k], ciou=True).item(), 0.0) for k in inside}
            t = {k: pd_scores[i, k, labels[i, j]].item() ** 0.5 * u[k] ** 6 for k in inside}
            for k in sorted(inside, key=lambda k: -t[k])[:topk]:
                claims.setdefault(k, []).append((j, u[k], t[k]))
        per_gt = {}
        for k, cl in claims.items():
            j, u, t = max(cl, key=lambda e: e[1]) if len(cl) > 1 else cl[0]
            per_gt.setdefault(j, []).append((k, u, t))
        for j, members in per_gt.items():
            best_u = max(u for _, u, _ in members)
            best_t = max(t for _, _, t in members)
            for k, _, t in members:
                fg[i, k] = True
                scores[i, k, labels[i, j]] = t * best_u / (best_t + 1e-9)
    return fg, scores


def test_assigner_matches_loop_reference_on_random_scene():
    gen = torch.Generator().manual_seed(3)
    a_side = 8
    ys, xs = torch.meshgrid(torch.arange(a_side) + 0.5, torch.arange(a_side) + 0.5, indexing="ij")
    points = torch.stack((xs, ys), -1).reshape(-1, 2) * 8  # 64 anchors, stride 8
    b, a, c = 3, a_side * a_side, 4
    pd_scores = torch.rand(b, a, c, generator=gen)
    centre = points.unsqueeze(0) + (torch.rand(b, a, 2, generator=gen) - 0.5) * 8
    half = 4 + torch.rand(b, a, 2, generator=gen) * 16
    pd_boxes = torch.cat((centre - half, centre + half), -1)
    tg = random_targets(gen, b, 8, 64, c, [3, 0, 6])
    out = TaskAlignedAssigner(c, topk=5)(pd_scores, pd_boxes, points, tg.labels, tg.boxes, tg.valid)
    fg, scores = _reference_assign(pd_scores, pd_boxes, points, tg.labels, tg.boxes, tg.valid, 5)
    assert fg.any() and torch.equal(out.fg, fg)
    assert torch.allclose(out.scores, scores, atol=1e-5)


# ----------------------------------------------------------------------------- CIoU / DFL
def _ciou_reference(b1, b2):
    x1, y1, x2, y2 = b1
    u1, v1, u2, v2 = b2
    w1, h1, w2, h2 = x2 - x1, y2 - y1, u2 - u1, v2 - v1
    iw = max(0.0, min(x2, u2) - max(x1, u1))
    ih = max(0.0, min(y2, v2) - max(y1, v1))
    inter = iw * ih
    iou = inter / (w1 * h1 + w2 * h2 - inter)
    diag2 = (max(x2, u2) - min(x1, u1)) ** 2 + (max(y2, v2) - min(y1, v1)) ** 2
    centre2 = ((x1 + x2) / 2 - (u1 + u2) / 2) ** 2 + ((y1 + y2) / 2 - (v1 + v2) / 2) ** 2
    v = 4 / math.pi ** 2 * (math.atan(w2 / h2) - math.atan(w1 / h1)) ** 2
    alpha = v / (1 - iou + v)
    return iou - centre2 / diag2 - alpha * v


def test_ciou_matches_reference_formula():
    gen = torch.Generator().manual_seed(0)
    xy = torch.rand(2, 200, 2, generator=gen, dtype=torch.float64) * 50
    wh = 1 + torch.rand(2, 200, 2, generator=gen, dtype=torch.float64) * 40
    b1, b2 = torch.cat((xy[0], xy[0] + wh[0]), -1), torch.cat((xy[1], xy[1] + wh[1]), -1)
    got = bbox_iou(b1, b2, ciou=True)
    want = torch.tensor([_ciou_reference(p.tolist(), q.tolist()) for p, q in zip(b1, b2)],
                        dtype=torch.float64)
    assert torch.allclose(got, want, atol=1e-6)
    # Pairwise broadcasting gives the same numbers as the element-wise call.
    pair = bbox_iou(b1[:5, None], b2[None, :7], ciou=True)
    assert pair.shape == (5, 7)
    assert torch.allclose(pair[2, 4], bbox_iou(b1[2], b2[4], ciou=True))
    assert torch.allclose(bbox_iou(b1, b1, ciou=True), torch.ones(200, dtype=torch.float64))


def test_dfl_loss_matches_two_bin_cross_entropy():
    logits = torch.randn(3, 4, 16)
    target = torch.tensor([[0.0, 2.5, 7.25, 14.98]] * 3)
    logp = logits.log_softmax(-1)
    want = torch.zeros(3)
    for i in range(3):
        for side in range(4):
            t = target[i, side].item()
            lo = math.floor(t)
            want[i] -= ((lo + 1 - t) * logp[i, side, lo] + (t - lo) * logp[i, side, lo + 1]) / 4
    assert torch.allclose(dfl_loss(logits, target), want, atol=1e-6)


def test_gains_from_cfg():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(4)
    model = build("t", 3).train()
    tg = random_targets(gen, 2, 8, 64, 3, [3, 2])
    with torch.no_grad():
        preds = model(torch.rand(2, 3, 64, 64))
    base = criterion(model, None)
    doubled = criterion(model, SimpleNamespace(box=15.0, cls=1.0, dfl=3.0))
    _, items = base(preds, tg)
    _, items2 = doubled(preds, tg)
    assert base.gains == (7.5, 0.5, 1.5)
    assert torch.allclose(items2, items * 2, rtol=1e-5)


def test_assigner_min_side_gives_a_tiny_gt_candidates():
    """A 6 px gt centred between the centres of 8 px cells (at 4, 12, 20, 28) has no anchor
    centre inside; grown to 16 px for the candidate test it has the 2 x 2 cells around it (the
    IoU, and so the soft target, is still against the real box)."""
    points = torch.tensor([[x + 4.0, y + 4.0] for y in range(0, 32, 8) for x in range(0, 32, 8)])
    gt = torch.tensor([[[13.0, 13.0, 19.0, 19.0]]])  # centre (16, 16): no cell centre inside
    pd_boxes = gt.expand(1, len(points), 4).clone()  # every anchor predicts the gt exactly
    scores = torch.full((1, len(points), 2), 0.5)
    labels, valid = torch.zeros(1, 1, dtype=torch.long), torch.ones(1, 1, dtype=torch.bool)
    plain = TaskAlignedAssigner(2, topk=10)(scores, pd_boxes, points, labels, gt, valid)
    assert not plain.fg.any()
    grown = TaskAlignedAssigner(2, topk=10, min_side=16)(scores, pd_boxes, points, labels, gt, valid)
    inside = [i for i, (x, y) in enumerate(points.tolist()) if 8 < x < 24 and 8 < y < 24]
    assert grown.fg[0].nonzero().flatten().tolist() == inside == [5, 6, 9, 10]
    assert torch.allclose(grown.scores[0, inside, 0], torch.ones(4))  # IoU 1 with the real box
