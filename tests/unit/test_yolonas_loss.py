"""YOLO-NAS loss: the PP-YOLOE terms against a loop written from their formulas, the assigner's
plain-IoU metric, VFL's weights, the recipe's gains."""

import math
from types import SimpleNamespace

import pytest
import torch
from testkit import random_targets

from libreyolo.families.yolo9.assign import TaskAlignedAssigner
from libreyolo.families.yolonas import build, criterion
from libreyolo.families.yolonas.loss import varifocal

pytestmark = pytest.mark.usefixtures("one_thread")


def test_assigner_ranks_by_plain_iou_without_ciou():
    """One gt [20, 0, 60, 10]; anchor 0 predicts it exactly, anchor 1 an off-centre quarter of it
    (IoU 0.25; CIoU subtracts a centre penalty). With alpha 1 and equal scores the soft target
    of anchor 1 is (u1 / u0)^6 * u0 = IoU^6 with the plain IoU."""
    points = torch.tensor([[25.0, 5.0], [55.0, 5.0]])
    pd_boxes = torch.tensor([[[20.0, 0, 60, 10], [50.0, 0, 60, 10]]])
    scores = torch.full((1, 2, 2), 0.5)
    gt, labels, valid = torch.tensor([[[20.0, 0, 60, 10]]]), torch.tensor([[1]]), torch.tensor([[True]])
    plain = TaskAlignedAssigner(2, topk=13, alpha=1.0, beta=6.0, ciou=False)(scores, pd_boxes, points, labels, gt, valid)
    assert plain.fg.tolist() == [[True, True]] and plain.labels.tolist() == [[1, 1]]
    assert plain.scores[0, 0, 1].item() == pytest.approx(1.0, abs=1e-5)
    assert plain.scores[0, 1, 1].item() == pytest.approx(0.25 ** 6, rel=1e-4)
    with_ciou = TaskAlignedAssigner(2, topk=13, alpha=1.0, beta=6.0)(scores, pd_boxes, points, labels, gt, valid)
    assert with_ciou.scores[0, 1, 1] < 0.5 * plain.scores[0, 1, 1]


def test_varifocal_weights():
    """Positive entry: BCE against t weighted t (a positive whose t is 0 costs nothing);
    elsewhere 0.75 p^2 BCE against 0."""
    logits = torch.tensor([[1.0, -2.0, 0.5]])
    target = torch.tensor([[0.6, 0.0, 0.0]])
    onehot = torch.tensor([[True, False, True]])
    got = varifocal(logits, target, onehot)
    p = logits.sigmoid()
    want0 = 0.6 * -(0.6 * math.log(p[0, 0]) + 0.4 * math.log(1 - p[0, 0]))
    want1 = 0.75 * p[0, 1] ** 2 * -math.log(1 - p[0, 1])
    assert torch.allclose(got, torch.tensor([[want0, want1, 0.0]]), atol=1e-6)


def _giou(a, b):
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    enclose = (max(a[2], b[2]) - min(a[0], b[0])) * (max(a[3], b[3]) - min(a[1], b[1]))
    return inter / union - (enclose - union) / enclose


def _dfl(logits, target):
    """Two-bin cross-entropy per side, averaged over the 4 sides (GFL)."""
    logp = logits.log_softmax(-1)
    total = 0.0
    for side in range(4):
        t = target[side]
        lo = math.floor(t)
        total -= (lo + 1 - t) * logp[side, lo] + (t - lo) * logp[side, lo + 1]
    return total / 4


def test_loss_matches_a_loop_over_anchors():
    """Every term, anchor by anchor, from PPYoloELoss's formulas; the assignment is the
    vectorised one (its own tests are yolo9's and the one above)."""
    torch.manual_seed(0)
    model = build("s", 3).train()
    crit = criterion(model, None)
    tg = random_targets(torch.Generator().manual_seed(5), 2, 8, 64, 3, [3, 1], min_wh=8.0)
    with torch.no_grad():
        preds = model(torch.rand(2, 3, 64, 64))
        raw, norm = crit.per_image(preds, tg)
    x = torch.cat([p.flatten(2) for p in preds], 2).transpose(1, 2).double()  # [B, A, 68 + 3]
    points, strides = crit.anchors(preds, torch.float32)
    box_logits, cls_logits = x[..., :68].unflatten(-1, (4, 17)), x[..., 68:]
    dist = (box_logits.softmax(-1) * torch.arange(17.0, dtype=torch.float64)).sum(-1)
    pboxes = torch.cat((points - dist[..., :2], points + dist[..., 2:]), -1)
    a = crit.assigner(cls_logits.float().sigmoid(), pboxes.float() * strides, points * strides,
                      tg.labels, tg.boxes, tg.valid)
    for i in range(2):
        box = dfl = cls = 0.0
        for k in range(x.shape[1]):
            t = a.scores[i, k].double()
            for c in range(3):
                z, y = cls_logits[i, k, c].item(), t[c].item()
                p = 1 / (1 + math.exp(-z))
                bce = -(y * math.log(p) + (1 - y) * math.log(1 - p))
                positive = bool(a.fg[i, k]) and c == a.labels[i, k]
                cls += (y if positive else 0.75 * p ** 2) * bce
            if a.fg[i, k]:
                w, s = t.sum().item(), strides[k, 0].item()
                gt = (a.boxes[i, k].double() / s).tolist()
                box += (1 - _giou(pboxes[i, k].tolist(), gt)) * w
                pt = points[k].double()
                ltrb = torch.cat((pt - torch.tensor(gt[:2]), torch.tensor(gt[2:]) - pt)).clamp(0, 15.99)
                dfl += _dfl(box_logits[i, k], ltrb.tolist()) * w
        assert a.fg[i].any()
        want = torch.tensor([2.5 * box, 1.0 * cls, 0.5 * dfl])
        assert torch.allclose(raw[i].double(), want.double(), rtol=1e-4, atol=1e-6), (raw[i], want)
        assert norm[i].item() == pytest.approx(a.scores[i].sum().item(), rel=1e-6)


def test_gains_from_cfg():
    torch.manual_seed(0)
    model = build("s", 3).train()
    tg = random_targets(torch.Generator().manual_seed(4), 2, 8, 64, 3, [3, 2], min_wh=8.0)
    with torch.no_grad():
        preds = model(torch.rand(2, 3, 64, 64))
    base = criterion(model, None)
    doubled = criterion(model, SimpleNamespace(box=5.0, cls=2.0, dfl=1.0))
    assert base.gains == (2.5, 1.0, 0.5)
    assert torch.allclose(doubled(preds, tg)[1], base(preds, tg)[1] * 2, rtol=1e-5)
