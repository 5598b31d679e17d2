"""The point-detection task (tasks/points.py, eval/points.py): the probability map into points,
the evaluator on hand-worked cases, predict's Results, and the detection batch it reuses.

Maps are 4 x 4 cells (32 px input, 8 px cells: cell (x, y) has its centre at (8x + 4, 8y + 4));
two classes, a = 0 and b = 1.
"""

import pytest
import torch
from torch import nn

from libreyolo.data import Batch
from libreyolo.eval.points import components, decode_points, evaluate_points, match_points, padded, rates
from libreyolo.families.base import Targets
from libreyolo.tasks import get_task

pytestmark = pytest.mark.usefixtures("one_thread")

A, B = 0, 1


def _map(n_images, cells, classes=2, size=4):
    """Probability map [n, 1 + classes, size, size]: `cells` = [(image, class, x, y, p)], the rest
    background (probability 1)."""
    probs = torch.zeros(n_images, 1 + classes, size, size)
    probs[:, 0] = 1.0
    for i, c, x, y, p in cells:
        probs[i, 1 + c, y, x] = p
        probs[i, 0, y, x] = 1.0 - p
    return probs


class _Fixed(nn.Module):
    """A 'model' whose prediction is a given map: the evaluator is under test, not a network."""

    def __init__(self, probs, classes=2):
        super().__init__()
        self.probs, self.num_classes = probs, classes

    def predict(self, images):
        return self.probs


def _targets(points):
    """Targets from [[(x, y, class), ...] per image]: a 2 x 2 px box centred on each point."""
    m = max(8, max(len(p) for p in points))
    boxes, labels, valid = torch.zeros(len(points), m, 4), torch.zeros(len(points), m, dtype=torch.long), \
        torch.zeros(len(points), m, dtype=torch.bool)
    for i, image in enumerate(points):
        for j, (x, y, c) in enumerate(image):
            boxes[i, j] = torch.tensor([x - 1.0, y - 1.0, x + 1.0, y + 1.0])
            labels[i, j], valid[i, j] = c, True
    return Targets(boxes, labels, valid)


def _evaluate(cells, truth, dist=8.0, conf=0.5):
    n = len(truth)
    batch = Batch(torch.zeros(n, 3, 32, 32, dtype=torch.uint8), _targets(truth))
    return evaluate_points(_Fixed(_map(n, cells)), [batch], "cpu", conf=conf, dist=dist, names=["a", "b"])


def _counts(metrics):
    """Per class: (instances, precision, recall, F1)."""
    return [(r["instances"], r["precision"], r["recall"], r["f1"]) for r in metrics["per_class"]]


def test_a_true_positive_at_the_distance_edge():
    # Truth a at (4, 4); the point is cell (1, 0), centre (12, 4): exactly 8 px away.
    m = _evaluate([(0, A, 1, 0, 0.9)], [[(4, 4, A)]], dist=8.0)
    assert (m["precision"], m["recall"], m["f1"]) == (1.0, 1.0, 1.0) and m["num_points"] == 1
    # A hair closer threshold: the point is a false positive and the centre a miss.
    m = _evaluate([(0, A, 1, 0, 0.9)], [[(4, 4, A)]], dist=7.99)
    assert (m["precision"], m["recall"], m["f1"]) == (0.0, 0.0, 0.0)


def test_a_duplicate_prediction_is_a_false_positive():
    # Truth a at (20, 12); points at cells (1, 1) and (3, 1), centres (12, 12) and (28, 12), both 8 px
    # away (not neighbours: two points). The better one takes the centre; the other is a duplicate.
    m = _evaluate([(0, A, 1, 1, 0.9), (0, A, 3, 1, 0.7)], [[(20, 12, A)]])
    assert (m["precision"], m["recall"], m["f1"]) == (0.5, 1.0, pytest.approx(2 / 3))
    assert m["per_class"][A]["instances"] == 1 and m["num_points"] == 2


def test_matching_is_greedy_by_score_then_nearest():
    # Points P1 (12, 12) score 0.9 and P2 (28, 12) score 0.6; truths G1 (19, 12) and G2 (12, 20); dist 10.
    # P1 is within reach of both and takes the nearer, G1 (7 px; G2 is 8 px); P2 reaches only G1
    # (9 px), already taken: a false positive, and G2 is missed. TP 1, FP 1, FN 1.
    m = _evaluate([(0, A, 1, 1, 0.9), (0, A, 3, 1, 0.6)], [[(19, 12, A), (12, 20, A)]], dist=10.0)
    assert (m["precision"], m["recall"], m["f1"]) == (0.5, 0.5, 0.5)


def test_a_wrong_class_is_a_false_positive_and_a_miss():
    m = _evaluate([(0, B, 1, 1, 0.9)], [[(12, 12, A)]])
    assert (m["precision"], m["recall"], m["f1"]) == (0.0, 0.0, 0.0)
    # a: one centre, no point of its class (precision undefined); b: one point, nothing to find.
    assert _counts(m) == [(1, None, 0.0, 0.0), (0, 0.0, None, 0.0)]


def test_images_without_objects():
    # Image 1 holds nothing and nothing is predicted there: it changes no count. Image 2 holds nothing
    # but gets a point: a false positive. Image 0 has a hit. TP 1, FP 1, FN 0.
    m = _evaluate([(0, A, 0, 0, 0.9), (2, B, 2, 2, 0.8)], [[(4, 4, A)], [], []])
    assert (m["precision"], m["recall"], m["f1"]) == (0.5, 1.0, pytest.approx(2 / 3)) and m["num_images"] == 3
    assert [r["images"] for r in m["per_class"]] == [1, 0]
    # Nothing anywhere, nothing predicted: nothing to find and nothing found.
    m = _evaluate([], [[], []])
    assert (m["precision"], m["recall"], m["f1"]) == (1.0, 1.0, 1.0)
    assert _counts(m) == [(0, None, None, None), (0, None, None, None)]


def test_rates_from_counts():
    assert rates(3, 1, 2) == (0.75, 0.6, 6 / 9)
    assert rates(0, 0, 4) == (None, 0.0, 0.0) and rates(0, 2, 0) == (0.0, None, 0.0) and rates(0, 0, 0) == (None,) * 3


def test_neighbouring_cells_of_a_class_are_one_point():
    cells = [(0, A, 0, 0, 0.6), (0, A, 1, 1, 0.9),           # diagonal neighbours: one point
             (0, A, 3, 0, 0.7),                               # alone: another
             (0, B, 2, 3, 0.8), (0, B, 3, 3, 0.55),           # b's pair beside a's cells: one b point
             (0, A, 2, 2, 0.4)]                               # below conf: nothing
    pts = decode_points(_map(1, cells), 0.5)
    got = sorted(zip(pts.cls.tolist(), pts.xy.tolist(), pts.score.tolist()))
    # The pair's box spans cells 0-1 in x and y: centre (8, 8); its score is its best cell's.
    assert got == [(A, [8.0, 8.0], pytest.approx(0.9)), (A, [28.0, 4.0], pytest.approx(0.7)),
                   (B, [24.0, 28.0], pytest.approx(0.8))]
    assert pts.score.tolist() == sorted(pts.score.tolist(), reverse=True)  # best first within the image


def test_components_follow_a_winding_blob_and_keep_images_apart():
    mask = torch.zeros(2, 5, 5, dtype=torch.bool)
    mask[0, 0, :] = mask[0, :, 4] = mask[0, 4, :] = True     # a U turned on its side: one component
    mask[0, 2, 0] = True                                     # a lone cell
    mask[1, 0, 0] = True                                     # the same place, another map
    labels = components(mask)
    ids = {int(v) for v in labels[0][mask[0]]}
    assert len(ids) == 2 and (labels[0][~mask[0]] == 0).all()
    assert labels[0, 0, 0] == labels[0, 4, 0] and labels[0, 2, 0] != labels[0, 0, 0]


def test_points_pad_per_image_best_first():
    pts = decode_points(_map(3, [(0, A, 0, 0, 0.6), (2, B, 3, 3, 0.9), (2, A, 0, 3, 0.95)]), 0.5)
    xy, cls, valid = padded(pts, 3)
    assert valid.tolist() == [[True, False], [False, False], [True, True]]
    assert cls[2].tolist() == [A, B] and xy[2, 0].tolist() == [4.0, 28.0]
    tp = match_points(xy, cls, valid, torch.tensor([[[4.0, 4]], [[0, 0]], [[28, 28]]]),
                      torch.tensor([[A], [A], [B]]), torch.tensor([[True], [False], [True]]), 8.0)
    assert tp.tolist() == [[True, False], [False, False], [False, True]]
    # A batch without a single ground-truth point: every prediction is a false positive.
    none = match_points(xy, cls, valid, torch.zeros(3, 0, 2), torch.zeros(3, 0, dtype=torch.long),
                        torch.zeros(3, 0, dtype=torch.bool), 8.0)
    assert none.shape == (3, 2) and not none.any()


def test_predict_results_are_points_in_original_pixels():
    from types import SimpleNamespace

    from libreyolo.predict.draw import annotate
    from libreyolo.predict.post import PostOptions, points_results

    task = get_task("points")
    image = torch.full((3, 48, 64), 40, dtype=torch.uint8)  # 64 x 48: letterboxed to 32 x 32, ratio 0.5
    prepared, meta = task.prepare(image, 32)
    assert prepared.shape == (3, 32, 32) and meta == (0.5, (0, 4))
    frame = SimpleNamespace(name="x.png", path=None, frame=None, image=image)
    probs = _map(1, [(0, B, 1, 1, 0.9), (0, A, 3, 0, 0.6)])
    [r] = points_results(probs, [meta], [frame], ["a", "b"], PostOptions(conf=0.5))
    # Cell (1, 1): (12, 12) in the network -> ((12 - 0) / 0.5, (12 - 4) / 0.5); cell (3, 0): (28, 4) -> (56, 0).
    assert r.task == "points" and r.points.tolist() == [[24.0, 16.0], [56.0, 0.0]] and r.classes.tolist() == [B, A]
    assert r.summary() == "2 points (1 a, 1 b)" and len(r) == 2
    d = r.to_dict()
    assert d["points"][0] == {"point": [24.0, 16.0], "score": pytest.approx(0.9), "class": B, "name": "b"}
    assert "detections" not in d
    drawn = annotate(image, r)
    assert drawn.shape == image.shape and not torch.equal(drawn, image) and torch.equal(image, torch.full_like(image, 40))
    assert (drawn[:, 16, 24] != 40).any()  # the dot is on the point
    [few] = points_results(probs, [meta], [frame], ["a", "b"], PostOptions(conf=0.5, max_det=1))
    assert few.classes.tolist() == [B]
    [none] = points_results(probs, [meta], [frame], ["a", "b"], PostOptions(conf=0.95))
    assert len(none) == 0 and none.summary() == "no points" and torch.equal(annotate(image, none), image)


def test_the_task_reuses_the_detection_batch_for_bench():
    task = get_task("points")
    tg = _targets([[(4, 4, A)], []])
    batch = Batch(torch.zeros(2, 3, 32, 32, dtype=torch.uint8), tg)
    back = task.unpack_batch(task.pack_batch(batch), False)
    assert torch.equal(back.images, batch.images) and all(torch.equal(a, b) for a, b in zip(back.targets, tg))
    assert task.fitness({"f1": 0.25, "precision": 1.0, "recall": 0.1}) == 0.25
    head, rows = task.table({"f1": 0.5, "precision": 0.5, "recall": 0.5, "num_images": 2, "per_class": [
        {"class": "a", "images": 1, "instances": 3, "precision": None, "recall": 0.0, "f1": 0.0}]})
    assert head == ["class", "images", "instances", "P", "R", "F1"]
    assert rows == [["all", "2", "3", "0.500", "0.500", "0.500"], ["a", "1", "3", "-", "0.000", "0.000"]]
