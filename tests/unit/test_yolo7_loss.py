"""YOLOv7 OTA assignment and loss: hand-worked candidates, the matching against a loop-per-gt
reference written from the authors' ComputeLossOTA, the loss terms and their normalisation,
the gains from the config."""

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from testkit import random_targets

from libreyolo.families.base import Targets
from libreyolo.families.common import bbox_iou
from libreyolo.families.yolo7 import build, criterion
from libreyolo.families.yolo7.assign import OTAAssigner, first_nominations, nominate
from libreyolo.families.yolo7.loss import BALANCE
from libreyolo.families.yolo7.net import rows

pytestmark = pytest.mark.usefixtures("one_thread")


def _layout(size="t", px=64):
    model = build(size, 2)
    maps = tuple(torch.zeros(1, 21, px // s, px // s) for s in model.strides)
    return model.layouts(maps)


def _one_gt(box):
    return torch.tensor([[box]], dtype=torch.float32), torch.tensor([[True]])


# ----------------------------------------------------------------------------- candidates
def test_nominate_hand_worked():
    """One 16 x 24 gt centred at (19, 29) px of a 64 px image, tiny's anchors.

    P3 (stride 8): centre (2.375, 3.625) in cells: the left half of its cell in x (and not the
    first cell), the lower half in y: the centre cell (2, 3), the left one (1, 3) and the one
    below (2, 4). All three anchors fit (largest side ratio: 1.85, 1.25, 2.06 < 4).
    P4 (stride 16): centre (1.19, 1.81): cells (1, 1), (0, 1), (1, 2); anchors 30x61 and 62x45 fit
    (ratios 2.54 and 3.88), 59x119 does not (119 / 24 = 4.96). P5: no anchor fits (116 / 16 > 4).
    """
    layout = _layout()
    boxes, valid = _one_gt([11.0, 17.0, 27.0, 41.0])
    got_rows, ok = nominate(layout, boxes, valid)
    p3 = {a * 64 + y * 8 + x for a in range(3) for x, y in ((2, 3), (1, 3), (2, 4))}
    p4 = {192 + a * 16 + y * 4 + x for a in range(2) for x, y in ((1, 1), (0, 1), (1, 2))}
    assert set(got_rows[ok].tolist()) == p3 | p4 and int(ok.sum()) == 15


def test_nominate_edges_padding_and_first_nominations():
    layout = _layout()
    # A gt in the first cell gets no left/upper neighbour (centre <= 1 cell from the edge); one in
    # the right half of the last-but-one column takes the last column; a padded row takes nothing.
    boxes = torch.tensor([[[0.0, 0.0, 12.0, 14.0], [45.0, 40.0, 60.6, 54.0], [0.0, 0.0, 64.0, 64.0]]])
    valid = torch.tensor([[True, True, False]])
    got_rows, ok = nominate(layout, boxes, valid)
    first = {r % 64 for r in got_rows[0, 0][ok[0, 0]].tolist() if r < 192}
    assert first == {0 * 8 + 0, 1 * 8 + 0, 0 * 8 + 1}  # centre (0.75, 0.875): right and below only
    second = {r % 64 for r in got_rows[0, 1][ok[0, 1]].tolist() if r < 192}
    assert second == {5 * 8 + 6, 5 * 8 + 7, 6 * 8 + 6}  # centre (6.6, 5.875): its cell, right, below
    assert not ok[0, 2].any()
    # Two gts nominating the same rows: each row is one candidate.
    twin = boxes[:, :1].repeat(1, 2, 1)
    r, o = nominate(layout, twin, torch.ones(1, 2, dtype=torch.bool))
    r, o = r.flatten(1), o.flatten(1)
    first_only = first_nominations(r, o, layout.cells.shape[0])
    assert set(r[first_only].tolist()) == set(r[o].tolist()) and int(first_only.sum()) * 2 == int(o.sum())


# ----------------------------------------------------------------------------- matching
def _row_predictions(layout, gen, nc):
    """Per-row predicted boxes near each row's cell, anchor-sized, and random class x obj scores."""
    a = layout.cells.shape[0]
    centre = (layout.cells + 0.5 + torch.rand(a, 2, generator=gen) - 0.5) * layout.strides
    wh = layout.anchors * (0.5 + 1.5 * torch.rand(a, 2, generator=gen))
    return torch.cat((centre - wh / 2, centre + wh / 2), -1), torch.rand(a, nc, generator=gen) * 0.9 + 0.05


def _reference_match(layout, boxes, probs, gt_boxes, labels, valid):
    """({row: gt}, rows several gts took) for one image, straight from ComputeLossOTA.build_targets:
    find_3_positive's candidates (per gt, level, anchor, offset), then every gt against every
    candidate row."""
    cand = []
    for j in range(gt_boxes.shape[0]):
        if not valid[j]:
            continue
        x1, y1, x2, y2 = gt_boxes[j].tolist()
        for lv, sizes in zip(layout.levels, layout.sizes.tolist()):
            gx, gy = (x1 + x2) / 2 / lv.stride, (y1 + y2) / 2 / lv.stride
            cells = [(int(gx), int(gy))]
            if gx % 1 < 0.5 and gx > 1:
                cells.append((int(gx - 0.5), int(gy)))
            if gy % 1 < 0.5 and gy > 1:
                cells.append((int(gx), int(gy - 0.5)))
            if (lv.w - gx) % 1 < 0.5 and lv.w - gx > 1:
                cells.append((int(gx + 0.5), int(gy)))
            if (lv.h - gy) % 1 < 0.5 and lv.h - gy > 1:
                cells.append((int(gx), int(gy + 0.5)))
            for a, (aw, ah) in enumerate(sizes):
                rw, rh = (x2 - x1) / aw, (y2 - y1) / ah
                if max(rw, 1 / rw, rh, 1 / rh) >= 4.0:
                    continue
                for cx, cy in cells:
                    cx, cy = min(max(cx, 0), lv.w - 1), min(max(cy, 0), lv.h - 1)
                    row = lv.start + a * lv.h * lv.w + cy * lv.w + cx
                    if row not in cand:
                        cand.append(row)
    gts = [j for j in range(gt_boxes.shape[0]) if valid[j]]
    if not cand:
        return {}, 0
    iou = {(j, r): max(bbox_iou(gt_boxes[j], boxes[r]).item(), 0.0) for j in gts for r in cand}
    cost = {}
    for j in gts:
        onehot = F.one_hot(labels[j], probs.shape[1]).float()
        for r in cand:
            p = probs[r].sqrt()
            bce = -(onehot * p.log().clamp(min=-100) + (1 - onehot) * (1 - p).log().clamp(min=-100)).sum()
            cost[j, r] = bce.item() - 3.0 * math.log(iou[j, r] + 1e-8)
    taken: dict[int, list[int]] = {}
    for j in gts:
        k = max(int(sum(sorted((iou[j, r] for r in cand), reverse=True)[:10])), 1)
        for r in sorted(cand, key=lambda r: cost[j, r])[:k]:
            taken.setdefault(r, []).append(j)
    return {r: (js[0] if len(js) == 1 else min(gts, key=lambda j: cost[j, r])) for r, js in taken.items()}, \
        sum(len(js) > 1 for js in taken.values())


def test_matching_equals_the_loop_reference():
    layout, nc, b, m = _layout(px=128), 3, 2, 8
    assigner = OTAAssigner(nc)
    most_rows = conflicts = 0
    for seed in range(3):
        gen = torch.Generator().manual_seed(seed)
        targets = random_targets(gen, b, m, 128, nc, [7, 3], min_wh=8.0, pos=0.8, extent=0.3)
        boxes, probs = (torch.stack(t) for t in zip(*(_row_predictions(layout, gen, nc) for _ in range(b))))
        cand = assigner.candidates(layout, targets.boxes, targets.valid)
        idx = cand.rows.unsqueeze(-1)
        out = assigner(cand, boxes.gather(1, idx.expand(-1, -1, 4)), probs.gather(1, idx.expand(-1, -1, nc)),
                       targets.labels, targets.boxes, targets.valid)
        for i in range(b):
            want, taken_twice = _reference_match(layout, boxes[i], probs[i], targets.boxes[i], targets.labels[i],
                                                 targets.valid[i])
            got = {}
            for s in out.fg[i].nonzero().flatten().tolist():
                j = int((targets.boxes[i] == out.boxes[i, s]).all(-1).float().argmax())
                assert out.labels[i, s] == targets.labels[i, j]
                got[int(cand.rows[i, s])] = j
            assert got == want, (seed, i)
            most_rows = max([most_rows, *(list(got.values()).count(j) for j in got.values())])
            conflicts += taken_twice
    assert most_rows > 1 and conflicts > 0  # dynamic k > 1 and the tie-break were exercised


# ----------------------------------------------------------------------------- loss
def _reference_terms(model, preds, targets, gains=(0.05, 0.3), obj_gain=1.0):
    """(box, obj, cls) sums per image and the per-image normaliser, computed row by row from
    the assignment: the formulas of loss.py's docstring."""
    crit = criterion(model, None)
    layout = model.layouts(preds)
    x = rows(preds, torch.float32)
    cand = crit.assigner.candidates(layout, targets.boxes, targets.valid)
    xs = x.gather(1, cand.rows.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
    boxes = layout.decode(xs[..., :4], cand.rows)
    probs = xs[..., 5:].sigmoid() * xs[..., 4:5].sigmoid()
    out = crit.assigner(cand, boxes, probs, targets.labels, targets.boxes, targets.valid)
    nc = model.num_classes
    raws, norms = [], []
    for i in range(x.shape[0]):
        tobj = torch.zeros(x.shape[1])
        box = cls = 0.0
        pos = out.fg[i].nonzero().flatten().tolist()
        for s in pos:
            ciou = bbox_iou(boxes[i, s], out.boxes[i, s], ciou=True)
            box += 1 - ciou
            tobj[cand.rows[i, s]] = ciou.clamp(min=0)
            onehot = F.one_hot(out.labels[i, s], nc).float()
            cls += F.binary_cross_entropy_with_logits(xs[i, s, 5:], onehot, reduction="sum")
        obj = 0.0
        for lv, bal in zip(layout.levels, BALANCE):
            part = slice(lv.start, lv.start + 3 * lv.h * lv.w)
            bce = F.binary_cross_entropy_with_logits(x[i, part, 4], tobj[part], reduction="sum")
            obj += bal * bce / (3 * (640 / lv.stride) ** 2)
        n = max(len(pos), 1)
        cls_term = gains[1] * nc / 80 * 3 * cls / (n * nc) if nc > 1 else 0.0
        raws.append(torch.tensor([gains[0] * 3 * box / n, obj_gain * obj, cls_term], dtype=torch.float32))
        norms.append(float(len(pos) > 0))
    return torch.stack(raws), torch.tensor(norms)


@pytest.mark.parametrize("nc", [1, 4])
def test_loss_terms_and_normalisation(nc):
    torch.manual_seed(0)
    model = build("t", nc).train()
    targets = random_targets(torch.Generator().manual_seed(5), 3, 8, 64, nc, [3, 0, 6], min_wh=8.0)
    with torch.no_grad():
        preds = model(torch.rand(3, 3, 64, 64))
        raw, norm = criterion(model, None).per_image(preds, targets)
        want_raw, want_norm = _reference_terms(model, preds, targets)
    assert torch.allclose(raw, want_raw, rtol=1e-4, atol=1e-7) and torch.equal(norm, want_norm)
    assert norm.tolist() == [1.0, 0.0, 1.0] and (raw[:, 1] > 0).all()
    assert (raw[:, 2] == 0).all() if nc == 1 else (raw[[0, 2], 2] > 0).all()  # one class: no class term


@pytest.mark.parametrize("px", [64, 128])
def test_objectness_is_the_authors_at_any_image_size(px):
    """Without objects: obj_gain x (imgsz / 640)^2 x sum_l balance_l x mean BCE(obj_l, 0), the
    authors' ComputeLossOTA with train.py's gain scaling, for one image."""
    torch.manual_seed(0)
    model = build("b", 3).train()
    with torch.no_grad():
        preds = model(torch.rand(1, 3, px, px))
        empty = Targets(torch.zeros(1, 8, 4), torch.zeros(1, 8, dtype=torch.long), torch.zeros(1, 8, dtype=torch.bool))
        _, items = criterion(model, None)(preds, empty)
    obj = [p.unflatten(1, (3, -1))[:, :, 4] for p in preds]  # [1, 3 anchors, H, W] per level
    upstream = sum(bal * F.binary_cross_entropy_with_logits(o, torch.zeros_like(o)) for o, bal in zip(obj, BALANCE))
    assert items[1].item() == pytest.approx(0.7 * (px / 640) ** 2 * upstream.item(), rel=1e-5)
    assert items[0] == 0 and items[2] == 0


def test_gains_come_from_the_config():
    torch.manual_seed(0)
    model = build("t", 3).train()
    targets = random_targets(torch.Generator().manual_seed(3), 2, 8, 64, 3, [4, 2], min_wh=8.0)
    with torch.no_grad():
        preds = model(torch.rand(2, 3, 64, 64))
        _, base = criterion(model, None)(preds, targets)
        _, scaled = criterion(model, SimpleNamespace(box=0.5, cls=0.9))(preds, targets)
    assert torch.allclose(scaled, base * torch.tensor([10.0, 1.0, 3.0]), rtol=1e-5)
