from typing import Any, NamedTuple

import pytest
import torch
from torch import nn

from libreyolo.eval import evaluate
from libreyolo.families.base import Targets

IMGSZ, NC = 64, 3


class Batch(NamedTuple):
    images: torch.Tensor
    targets: Targets
    image_ids: Any
    orig_sizes: torch.Tensor
    ratios: torch.Tensor
    pads: torch.Tensor


class ReplayModel(nn.Module):
    """Returns prepared predictions, one tensor per predict() call, in order."""

    def __init__(self, preds):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))
        self.preds = list(preds)
        self.seen_dtypes = []

    def predict(self, images):
        assert not self.training and not torch.is_grad_enabled()
        self.seen_dtypes.append(images.dtype)
        return self.preds.pop(0)


def letterbox_params(h, w):
    r = IMGSZ / max(h, w)
    return r, ((IMGSZ - round(w * r)) / 2, (IMGSZ - round(h * r)) / 2)


def make_batch(images_spec, ids):
    """images_spec: per image (h, w, [(x1, y1, x2, y2, cls) in original pixels])."""
    m = 8
    boxes = torch.zeros(len(ids), m, 4)
    labels = torch.zeros(len(ids), m, dtype=torch.long)
    valid = torch.zeros(len(ids), m, dtype=torch.bool)
    ratios, pads, sizes = [], [], []
    for i, (h, w, objs) in enumerate(images_spec):
        r, (pl, pt) = letterbox_params(h, w)
        ratios.append(r), pads.append((pl, pt)), sizes.append((h, w))
        for j, (x1, y1, x2, y2, c) in enumerate(objs):
            boxes[i, j] = torch.tensor([x1 * r + pl, y1 * r + pt, x2 * r + pl, y2 * r + pt])
            labels[i, j], valid[i, j] = c, True
    return Batch(
        images=torch.zeros(len(ids), 3, IMGSZ, IMGSZ, dtype=torch.uint8),
        targets=Targets(boxes, labels, valid),
        image_ids=ids,
        orig_sizes=torch.tensor(sizes),
        ratios=torch.tensor(ratios),
        pads=torch.tensor(pads),
    )


def preds_from_targets(batch, shift=0.0, score=0.9):
    """Predictions equal to the ground truth (in network pixels), optionally shifted right."""
    t = batch.targets
    preds = torch.zeros(t.boxes.shape[0], t.boxes.shape[1], 4 + NC)
    preds[..., :4] = t.boxes + torch.tensor([shift, 0.0, shift, 0.0])
    scores = torch.nn.functional.one_hot(t.labels, NC).float() * score
    preds[..., 4:] = scores * t.valid[..., None]
    return preds


SPEC = [
    [(120, 200, [(10, 10, 60, 50, 0), (100, 30, 180, 110, 1)]), (200, 100, [(5, 20, 90, 180, 2)])],
    [(64, 64, [(0, 0, 32, 32, 1), (30, 30, 64, 64, 1), (10, 40, 25, 60, 0)]), (90, 150, [])],
]


def run(shift=0.0, spec=SPEC, ids=((1, 2), (3, 4)), **kwargs):
    batches = [make_batch(s, list(i)) for s, i in zip(spec, ids)]
    model = ReplayModel([preds_from_targets(b, shift) for b in batches])
    return evaluate(model, batches, "cpu", conf=0.001, iou=0.7, max_det=300, **kwargs), model


def test_perfect_predictions_give_map_one_and_stay_quiet(capfd):
    result, model = run(names=["a", "b", "c"])
    assert result["map50_95"] == pytest.approx(1.0, abs=1e-6)
    assert result["map50"] == pytest.approx(1.0, abs=1e-6)
    assert result["num_images"] == 4 and result["num_dets"] == 6
    assert model.seen_dtypes == [torch.float32, torch.float32]  # uint8 images were scaled
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_shifted_predictions_lower_map():
    perfect, _ = run()
    shifted, _ = run(shift=4.0)
    assert shifted["map50_95"] < perfect["map50_95"] - 0.05
    assert shifted["map50_95"] < shifted["map50"]


def test_ground_truth_and_detections_return_to_original_pixels():
    from libreyolo.eval.coco import _Collector

    batch = make_batch(SPEC[0], [7, 8])
    dets = []
    for p in preds_from_targets(batch):
        p = p[p[:, 4:].amax(1) > 0]
        score, cls = p[:, 4:].max(1, keepdim=True)
        dets.append(torch.cat([p[:, :4], score, cls.float()], 1))
    collector = _Collector()
    collector.add(batch, dets)
    rows = [[k + 1, *obj] for k, (_, _, objs) in enumerate(SPEC[0]) for obj in objs]
    expected = torch.tensor(rows, dtype=torch.float64)  # (image, x1, y1, x2, y2, class)
    assert torch.allclose(torch.tensor(collector.gt[0]), expected, atol=1e-3)
    assert torch.allclose(torch.tensor(collector.dets[0][:, :5]), expected[:, :5], atol=1e-3)
    assert collector.sizes == [(120, 200), (200, 100)]


def test_a_model_that_ignores_the_letterbox_pad_loses():
    batch = make_batch(SPEC[0], [7, 8])
    preds = preds_from_targets(batch)
    _, (pad_left, _) = letterbox_params(200, 100)
    preds[1, 0, [0, 2]] -= pad_left  # image 2 is padded 16 px left and right; forget it
    result = evaluate(ReplayModel([preds]), [batch], "cpu", progress=False)
    # Classes 0 and 1 (image 1) are found exactly, class 2 (image 2) misses at IoU 0.5.
    assert result["map50"] == pytest.approx(2 / 3, abs=1e-6)


def test_no_ground_truth_gives_zeros():
    spec = [[(64, 64, []), (80, 80, [])]]
    batches = [make_batch(s, [1, 2]) for s in spec]
    preds = torch.zeros(2, 8, 4 + NC)
    preds[:, :, :4] = torch.tensor([0.0, 0.0, 20.0, 20.0])
    preds[:, :, 4] = 0.9
    result = evaluate(ReplayModel([preds]), batches, "cpu")
    assert {k: result[k] for k in ("map50_95", "map50", "num_images", "num_dets")} == {
        "map50_95": 0.0, "map50": 0.0, "num_images": 2, "num_dets": 2}
    assert result["precision"] == result["recall"] == 0.0 and result["per_class"][0]["instances"] == 0
    assert result["curves"]["confusion"]["matrix"] == [[0, 2], [0, 0]]  # two detections of nothing


def test_no_detections_gives_zero_map():
    batch = make_batch(SPEC[0], [1, 2])
    preds = torch.zeros(2, 8, 4 + NC)  # every score is 0, below conf
    result = evaluate(ReplayModel([preds]), [batch], "cpu")
    assert result["map50_95"] == 0.0 and result["num_dets"] == 0 and result["num_images"] == 2


def test_repeated_images_count_once_and_string_ids_work():
    # A distributed sampler pads the last batch with repeats; a wrong repeat must not count.
    spec = [SPEC[0], SPEC[0]]
    batches = [make_batch(s, ["x", "y"]) for s in spec]
    good, bad = preds_from_targets(batches[0]), preds_from_targets(batches[1], shift=20.0)
    result = evaluate(ReplayModel([good, bad]), batches, "cpu")
    assert result["num_images"] == 2 and result["num_dets"] == 3
    assert result["map50_95"] == pytest.approx(1.0, abs=1e-6)


def test_training_mode_is_restored():
    batches = [make_batch(SPEC[0], [1, 2])]
    model = ReplayModel([preds_from_targets(batches[0])])
    model.train()
    evaluate(model, batches, "cpu")
    assert model.training
