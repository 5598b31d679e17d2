"""Per-class rows, P/R at the best mean F1, PR curves and the confusion matrix (eval/details.py)."""

import io

import numpy as np
import pytest

from libreyolo.eval.coco import coco_evaluator
from libreyolo.eval.details import details, greedy_pairs, match
from libreyolo.tasks import get_task

NAMES = ["cat", "dog", "<b>bird</b>"]


def _gt(*rows):  # (image, x1, y1, x2, y2, class)
    return [np.array(rows, dtype=float)]


def _dets(*rows):  # (image, x1, y1, x2, y2, score, class)
    return [np.array(rows, dtype=float)]


def _details(gt, dets, n_images=2):
    ev = coco_evaluator(gt, dets, [(100, 100)] * n_images, NAMES)
    return details(gt, dets, n_images, NAMES, ev.eval["precision"], np.asarray(ev.params.recThrs)), ev


def test_perfect_detections_are_all_ones_and_a_diagonal():
    gt = _gt((1, 10, 10, 40, 40, 0), (1, 50, 50, 90, 90, 1), (2, 10, 10, 60, 60, 0))
    dets = _dets((1, 10, 10, 40, 40, 0.9, 0), (1, 50, 50, 90, 90, 0.8, 1), (2, 11, 11, 60, 60, 0.7, 0))
    out, ev = _details(gt, dets)
    rows = {r["class"]: r for r in out["per_class"]}
    assert (rows["cat"]["images"], rows["cat"]["instances"]) == (2, 2)
    assert rows["cat"]["precision"] == rows["cat"]["recall"] == rows["cat"]["map50"] == 1.0
    assert rows["<b>bird</b>"] == {"class": "<b>bird</b>", "id": 2, "images": 0, "instances": 0, "precision": None,
                                   "recall": None, "map50": None, "map50_95": None}  # nothing to measure
    assert out["precision"] == out["recall"] == 1.0
    # The per-class figures add up to the headline: mAP is their mean over classes with ground truth.
    assert np.mean([r["map50_95"] for r in out["per_class"] if r["instances"]]) == pytest.approx(ev.stats[0], abs=1e-6)
    cm = out["curves"]["confusion"]
    assert cm["names"] == NAMES + ["background"]
    assert cm["matrix"] == [[2, 0, 0, 0], [0, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
    pr = out["curves"]["pr"]
    assert len(pr["recall"]) == 101 and [c["class"] for c in pr["classes"]] == ["cat", "dog"]
    assert all(p == 1.0 for p in pr["classes"][0]["precision"])


def test_confusion_matrix_counts_swaps_misses_and_spurious_boxes():
    gt = _gt((1, 10, 10, 40, 40, 0), (1, 50, 50, 90, 90, 1), (2, 10, 10, 60, 60, 2))
    dets = _dets((1, 10, 10, 40, 40, 0.9, 1),    # a cat called a dog
                 (2, 70, 70, 95, 95, 0.6, 0),    # a cat where there is nothing
                 (2, 70, 70, 95, 95, 0.1, 2))    # below conf 0.25: not in the matrix
    out, _ = _details(gt, dets)
    m = np.array(out["curves"]["confusion"]["matrix"])  # rows predicted, columns true
    assert m[1, 0] == 1                                  # predicted dog, true cat
    assert m[3, 1] == 1 and m[3, 2] == 1                 # the dog and the bird missed (background row)
    assert m[0, 3] == 1                                  # a spurious cat (background column)
    assert m.sum() == 4
    rows = {r["class"]: r for r in out["per_class"]}
    assert rows["cat"]["recall"] == 0.0 and rows["dog"]["precision"] == 0.0


def test_precision_and_recall_are_read_at_the_best_mean_f1():
    # Two cats found (0.9, 0.8), a false cat at 0.3, one cat missed: best F1 keeps only the two sure
    # detections (P 1, R 2/3) rather than all three (P 2/3, R 2/3).
    gt = _gt((1, 0, 0, 20, 20, 0), (1, 30, 30, 50, 50, 0), (2, 0, 0, 20, 20, 0))
    dets = _dets((1, 0, 0, 20, 20, 0.9, 0), (1, 30, 30, 50, 50, 0.8, 0), (2, 60, 60, 80, 80, 0.3, 0))
    out, _ = _details(gt, dets)
    cat = out["per_class"][0]
    assert cat["precision"] == pytest.approx(1.0) and cat["recall"] == pytest.approx(2 / 3)
    f1 = out["curves"]["f1"]
    assert 0.3 < f1["best_conf"] <= 0.8 and len(f1["conf"]) == len(f1["mean_f1"]) == 101


def test_greedy_pairs_take_the_highest_iou_first_and_each_box_once():
    iou = np.array([[0.9, 0.6], [0.8, 0.7]])
    d, g = greedy_pairs(iou, iou >= 0.5)
    assert sorted(zip(d.tolist(), g.tolist())) == [(0, 0), (1, 1)]
    d, g = greedy_pairs(iou, np.zeros_like(iou, dtype=bool))
    assert len(d) == len(g) == 0


def test_no_detections_and_no_images():
    gt = _gt((1, 10, 10, 40, 40, 0))
    out = details(gt, [], 1, NAMES, None, None)
    assert out["precision"] == out["recall"] == 0.0 and out["per_class"][0]["map50"] is None
    assert out["curves"]["confusion"]["matrix"][3][0] == 1 and out["curves"]["pr"]["classes"] == []
    tp, m = match(np.zeros((0, 6)), np.zeros((0, 7)), 0, 2)
    assert len(tp) == 0 and m.sum() == 0


def test_class_table_plain_in_a_log():
    gt = _gt((1, 10, 10, 40, 40, 0), (2, 10, 10, 60, 60, 2))
    dets = _dets((1, 10, 10, 40, 40, 0.9, 0))
    out, ev = _details(gt, dets)
    out.update(map50=float(ev.stats[1]), map50_95=float(ev.stats[0]), num_images=2)
    buf = io.StringIO()
    get_task("detect").report(out, file=buf)  # what val prints
    lines = buf.getvalue().splitlines()
    assert "\x1b[" not in buf.getvalue()
    assert lines[0].split() == ["class", "images", "instances", "P", "R", "mAP50", "mAP50-95"]
    assert lines[1].split()[:3] == ["all", "2", "2"]
    assert lines[2].split() == ["cat", "1", "1", "1.000", "1.000", "1.000", "1.000"]
    assert lines[3].split() == ["dog", "0", "0", "-", "-", "-", "-"]
    assert lines[4].split()[:3] == ["<b>bird</b>", "1", "1"]  # a name is text, never markup


def test_box_iou_is_the_reference_formula_on_two_planes(monkeypatch):
    # Width and height of the overlap as [N, M] planes: an [N, M, 2] array reduced over its last
    # axis was 5x slower for the same products (300 detections against 100 boxes).
    from libreyolo.eval import details as D

    rng = np.random.default_rng(0)
    a, b = rng.uniform(0, 50, (300, 4)), rng.uniform(0, 50, (100, 4))
    a[:, 2:] += a[:, :2]
    b[:, 2:] += b[:, :2]
    b[:3] = a[:3]  # exact matches, and boxes with no overlap at all
    shapes = []
    real = np.clip
    monkeypatch.setattr(D.np, "clip", lambda x, *args, **kw: shapes.append(np.shape(x)) or real(x, *args, **kw))
    iou = D.box_iou(a, b)
    monkeypatch.undo()
    lt, rb = np.maximum(a[:, None, :2], b[None, :, :2]), np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(rb - lt, 0, None).prod(2)
    area_a, area_b = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1]), (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    reference = inter / np.maximum(area_a[:, None] + area_b[None] - inter, 1e-12)
    assert np.array_equal(iou, reference) and (iou == 0).any() and np.allclose(iou[np.arange(3), np.arange(3)], 1)
    assert shapes and all(s == (300, 100) for s in shapes)
