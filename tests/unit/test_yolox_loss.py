"""YOLOX loss and SimOTA assigner: hand-worked assignment, loop reference, class-cost identity,
vectorisation (batch == one image at a time), finiteness with empty images, gains, L1 switch."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from testkit import random_targets

from libreyolo.families.common import bbox_iou
from libreyolo.families.yolox import build, criterion
from libreyolo.families.yolox.assign import SimOTAAssigner, class_cost

pytestmark = pytest.mark.usefixtures("one_thread")


# ----------------------------------------------------------------------------- assigner
def _hand_example():
    """Six anchors on a row, stride 8 (centre radius 2.5 * 8 = 20 px), centres x = 4, 12, ..., 44
    at y = 4; one class, every probability 0.25 so every class cost is BCE(sqrt 0.25, 1) = ln 2.

    gt0 [0, 0, 16, 8]: in box {0, 1}, in centre region (|x - 8| < 20) {0, 1, 2}.
    gt1 [24, 0, 48, 8]: in box {3, 4, 5}, centre region (|x - 36| < 20) {2, 3, 4, 5}.
    gt2 [26, 0, 46, 8]: in box {3, 4, 5}, centre region {2, 3, 4, 5}.
    A padded gt covering everything must never take an anchor.
    Predicted boxes and their IoUs (gt0, gt1, gt2):
      a0 [0, 0, 16, 8]   1,    0,     0         a3 [24, 0, 48, 8]  0,  1,     0.833
      a1 [4, 0, 16, 8]   0.75, 0,     0         a4 [26, 0, 46, 8]  0,  0.833, 1
      a2 [8, 0, 24, 8]   0.333, 0,    0         a5 [36, 0, 48, 8]  0,  0.5,   0.455
    Dynamic k = int(sum of IoUs): gt0 2 (2.08), gt1 2 (2.33), gt2 2 (2.29).
    Costs ln2 + 3 * -ln(IoU) (+1e5 outside box-and-centre): gt0 takes a0 (0.69), a1 (1.56);
    gt1 takes a3 (0.69), a4 (1.24); gt2 takes a4 (0.69), a3 (1.24). a3 goes to gt1 and a4 to gt2,
    each anchor's cheaper gt. a2 and a5 stay background.
    """
    centres = torch.tensor([[4.0, 4], [12, 4], [20, 4], [28, 4], [36, 4], [44, 4]])
    strides = torch.full((6, 1), 8.0)
    pd_boxes = torch.tensor([[[0.0, 0, 16, 8], [4, 0, 16, 8], [8, 0, 24, 8],
                              [24, 0, 48, 8], [26, 0, 46, 8], [36, 0, 48, 8]]])
    probs = torch.full((1, 6, 1), 0.25)
    gt_boxes = torch.tensor([[[0.0, 0, 16, 8], [24, 0, 48, 8], [26, 0, 46, 8], [0, 0, 64, 64]]])
    labels = torch.zeros(1, 4, dtype=torch.long)
    valid = torch.tensor([[True, True, True, False]])
    return probs, pd_boxes, centres, strides, labels, gt_boxes, valid


def test_assigner_hand_worked():
    out = SimOTAAssigner(1)(*_hand_example())
    assert out.fg.tolist() == [[True, True, False, True, True, False]]
    gt0, gt1, gt2 = [0.0, 0, 16, 8], [24.0, 0, 48, 8], [26.0, 0, 46, 8]
    assert [out.boxes[0, i].tolist() for i in (0, 1, 3, 4)] == [gt0, gt0, gt1, gt2]
    assert out.iou[0].tolist() == pytest.approx([1.0, 0.75, 0.0, 1.0, 1.0, 0.0], abs=1e-5)
    assert out.labels[0].tolist() == [0] * 6


def test_assigner_hand_worked_k1_and_empty_image():
    probs, pd_boxes, centres, strides, labels, boxes, valid = _hand_example()
    # Only gt0 valid, and a1's prediction shrunk so gt0's IoUs sum to 1 + 0.25 + 0.33 < 2: k = 1,
    # gt0 takes only a0. Image 1: the same picture with no valid gt: nothing is assigned.
    pd = pd_boxes.clone()
    pd[0, 1] = torch.tensor([12.0, 0, 16, 8])
    only0 = torch.tensor([[True, False, False, False]])
    out = SimOTAAssigner(1)(probs.repeat(2, 1, 1), pd.repeat(2, 1, 1), centres, strides,
                            labels.repeat(2, 1), boxes.repeat(2, 1, 1),
                            torch.cat((only0, torch.zeros_like(only0))))
    assert out.fg.tolist() == [[True] + [False] * 5, [False] * 6]
    assert out.iou[1].abs().sum() == 0


def test_class_cost_equals_summed_bce():
    gen = torch.Generator().manual_seed(0)
    probs = torch.rand(2, 7, 5, generator=gen)
    probs[0, 0, 0] = 0.0  # the clamp keeps the cost finite where BCE clamps its log
    labels = torch.randint(0, 5, (2, 3), generator=gen)
    got = class_cost(probs, labels)
    want = torch.zeros(2, 3, 7)
    for b in range(2):
        for g in range(3):
            onehot = F.one_hot(labels[b, g], 5).float().expand(7, 5)
            want[b, g] = F.binary_cross_entropy(probs[b], onehot, reduction="none").sum(-1)
    assert torch.allclose(got, want, atol=1e-4)


def _reference_simota(probs, pd_boxes, centres, strides, labels, boxes, valid):
    """Per-image, per-gt loops written straight from the YOLOX description (ragged candidates)."""
    b, a, c = probs.shape
    fg = torch.zeros(b, a, dtype=torch.bool)
    gt_of = torch.full((b, a), -1)
    for i in range(b):
        gts = [j for j in range(boxes.shape[1]) if valid[i, j]]
        if not gts:
            continue
        x, y, r = centres[:, 0], centres[:, 1], strides[:, 0] * 2.5
        inb, inc = {}, {}
        for j in gts:
            x1, y1, x2, y2 = boxes[i, j].tolist()
            inb[j] = (x > x1) & (y > y1) & (x < x2) & (y < y2)
            inc[j] = ((x - (x1 + x2) / 2).abs() < r) & ((y - (y1 + y2) / 2).abs() < r)
        cand = [k for k in range(a) if any(inb[j][k] or inc[j][k] for j in gts)]
        cost, iou = {}, {}
        for j in gts:
            onehot = F.one_hot(labels[i, j], c).float()
            for k in cand:
                iou[j, k] = bbox_iou(boxes[i, j], pd_boxes[i, k]).clamp(min=0).item()
                cls = F.binary_cross_entropy(probs[i, k].sqrt(), onehot, reduction="sum").item()
                penalty = 0.0 if inb[j][k] and inc[j][k] else 1e5
                cost[j, k] = cls + 3 * -torch.log(torch.tensor(iou[j, k] + 1e-8)).item() + penalty
        claims = {}
        for j in gts:
            top = sorted((iou[j, k] for k in cand), reverse=True)[:10]
            dyn = max(int(torch.tensor(top).sum().item()), 1)
            for k in sorted(cand, key=lambda k: cost[j, k])[:dyn]:
                claims.setdefault(k, []).append(j)
        for k, js in claims.items():
            fg[i, k] = True
            gt_of[i, k] = js[0] if len(js) == 1 else min(gts, key=lambda j: cost[j, k])
    return fg, gt_of


def test_assigner_matches_loop_reference_on_random_scene():
    gen = torch.Generator().manual_seed(3)
    side = 8
    ys, xs = torch.meshgrid(torch.arange(side) + 0.5, torch.arange(side) + 0.5, indexing="ij")
    centres = torch.stack((xs, ys), -1).reshape(-1, 2) * 8  # 64 anchors, stride 8
    strides = torch.full((64, 1), 8.0)
    b, a, c = 3, side * side, 4
    probs = torch.rand(b, a, c, generator=gen)
    centre = centres.unsqueeze(0) + (torch.rand(b, a, 2, generator=gen) - 0.5) * 8
    half = 4 + torch.rand(b, a, 2, generator=gen) * 16
    pd_boxes = torch.cat((centre - half, centre + half), -1)
    tg = random_targets(gen, b, 8, 64, c, [3, 0, 6])
    out = SimOTAAssigner(c)(probs, pd_boxes, centres, strides, tg.labels, tg.boxes, tg.valid)
    fg, gt_of = _reference_simota(probs, pd_boxes, centres, strides, tg.labels, tg.boxes, tg.valid)
    assert fg.any() and torch.equal(out.fg, fg)
    idx = gt_of.clamp(min=0)
    want_boxes = tg.boxes.gather(1, idx.unsqueeze(-1).expand(b, a, 4))
    assert torch.equal(out.boxes[fg], want_boxes[fg])
    assert torch.equal(out.labels[fg], tg.labels.gather(1, idx)[fg])


def test_l1_term_follows_set_epoch_and_targets_invert_decoding():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(5)
    model = build("n", 3).train()
    crit = criterion(model, None)
    tg = random_targets(gen, 2, 8, 64, 3, [3, 2])
    with torch.no_grad():
        preds = model(torch.rand(2, 3, 64, 64))
        _, off = crit(preds, tg)
        assert model.set_epoch(5, SimpleNamespace(epochs=10, no_aug_epochs=5)) is not None
        _, on = crit(preds, tg)
    assert off[3] == 0 and on[3] > 0 and torch.allclose(off[:3], on[:3])
    # The L1 targets are exactly the raw outputs that decode to the gt box.
    grid, strides = model.grids(preds)
    boxes = torch.tensor([[10.0, 20, 50, 36]]).expand(1, grid.shape[0], 4)
    raw = crit.l1_targets(boxes, grid, strides)
    from libreyolo.families.yolox.net import decode_boxes
    assert torch.allclose(decode_boxes(raw, grid, strides), boxes, atol=1e-4)


def test_gains_from_cfg():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(4)
    model = build("n", 3).train()
    tg = random_targets(gen, 2, 8, 64, 3, [3, 2])
    with torch.no_grad():
        preds = model(torch.rand(2, 3, 64, 64))
    base = criterion(model, None)
    doubled = criterion(model, SimpleNamespace(box=10.0, cls=2.0))
    _, items = base(preds, tg)
    _, items2 = doubled(preds, tg)
    assert base.gains == (5.0, 1.0)
    assert torch.allclose(items2[[0, 2]], items[[0, 2]] * 2, rtol=1e-5)
    assert torch.allclose(items2[1], items[1])
