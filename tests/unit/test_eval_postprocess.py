import pytest
import torch

from libreyolo.eval import postprocess, unletterbox


def make_preds(rows, num_classes=3):
    """rows: (x1, y1, x2, y2, class, score) -> preds [1, N, 4 + nc] with one-hot-ish scores."""
    preds = torch.zeros(1, len(rows), 4 + num_classes)
    for i, (x1, y1, x2, y2, cls, score) in enumerate(rows):
        preds[0, i, :4] = torch.tensor([x1, y1, x2, y2])
        preds[0, i, 4 + cls] = score
    return preds


def test_nms_suppresses_overlapping_boxes_of_one_class():
    preds = make_preds([(10, 10, 50, 50, 0, 0.9), (12, 11, 51, 50, 0, 0.8), (100, 100, 140, 140, 0, 0.7)])
    (out,) = postprocess(preds, conf=0.001, iou=0.7)
    assert out.shape == (2, 6)
    assert torch.allclose(out[:, 4], torch.tensor([0.9, 0.7]))
    assert torch.equal(out[0, :4], torch.tensor([10.0, 10, 50, 50]))


def test_nms_keeps_overlapping_boxes_of_different_classes():
    preds = make_preds([(10, 10, 50, 50, 0, 0.9), (10, 10, 50, 50, 2, 0.8)])
    (out,) = postprocess(preds)
    assert out.shape == (2, 6)
    assert sorted(out[:, 5].tolist()) == [0.0, 2.0]


def test_best_class_per_box_and_conf_filter():
    preds = make_preds([(0, 0, 10, 10, 1, 0.6), (30, 30, 40, 40, 0, 0.0005)])
    preds[0, 0, 4] = 0.3  # a lower second-best class on the first box is not reported
    (out,) = postprocess(preds, conf=0.001)
    assert out.shape == (1, 6)
    assert out[0, 5].item() == 1.0 and abs(out[0, 4].item() - 0.6) < 1e-6


def test_max_det_keeps_the_best_scores():
    rows = [(20 * i, 0, 20 * i + 10, 10, 0, 0.1 + 0.05 * i) for i in range(10)]
    (out,) = postprocess(make_preds(rows), max_det=3)
    assert out.shape == (3, 6)
    assert torch.allclose(out[:, 4], torch.tensor([0.55, 0.5, 0.45]))


def test_batch_with_an_empty_image_and_half_precision():
    preds = torch.cat([make_preds([(0, 0, 10, 10, 0, 0.9)]), make_preds([(0, 0, 10, 10, 0, 0.0)])])
    out = postprocess(preds.half())
    assert [o.shape for o in out] == [(1, 6), (0, 6)]
    assert all(o.dtype == torch.float32 for o in out)


def test_unletterbox_inverts_the_letterbox_and_clips():
    # A 100x200 (h, w) image resized by 0.32 to 32x64, padded 16 px on top into 64x64.
    ratios, pads, sizes = torch.tensor([0.32]), torch.tensor([[0.0, 16.0]]), torch.tensor([[100, 200]])
    orig = torch.tensor([[10.0, 20.0, 150.0, 90.0]])
    net = orig * 0.32 + torch.tensor([0.0, 16.0, 0.0, 16.0])
    assert torch.allclose(unletterbox(net, ratios, pads, sizes), orig, atol=1e-4)
    # Boxes reaching into the padding are clipped to the image.
    outside = torch.tensor([[-5.0, 2.0, 70.0, 60.0]])
    assert torch.allclose(unletterbox(outside, ratios, pads, sizes), torch.tensor([[0.0, 0.0, 200.0, 100.0]]))


def test_multi_label_reports_every_class_above_conf():
    preds = make_preds([(0, 0, 10, 10, 1, 0.6), (30, 30, 40, 40, 0, 0.0005)])
    preds[0, 0, 4] = 0.3  # the first box's second class: a candidate of its own
    (out,) = postprocess(preds, conf=0.001, multi_label=True)
    assert out[:, 5].tolist() == [1.0, 0.0] and torch.allclose(out[:, 4], torch.tensor([0.6, 0.3]))
    assert torch.equal(out[0, :4], out[1, :4])  # the same box, once per class (NMS is per class)
    (single,) = postprocess(preds, conf=0.001)
    assert single.shape == (1, 6)


def test_multi_label_caps_candidates_by_score(monkeypatch):
    import importlib

    module = importlib.import_module("libreyolo.eval.postprocess")

    monkeypatch.setattr(module, "MAX_CANDIDATES", 2)
    preds = make_preds([(0, 0, 10, 10, 0, 0.9), (50, 50, 60, 60, 1, 0.8)])
    preds[0, :, 4:] += 0.01  # every (box, class) pair passes conf: 6 candidates
    (out,) = postprocess(preds, conf=0.001, multi_label=True)
    assert out.shape == (2, 6) and out[:, 4].tolist() == [pytest.approx(0.91), pytest.approx(0.81)]


def test_end_to_end_models_take_the_top_k_query_class_scores_without_nms():
    # Two queries on the same box: NMS would drop one; an end-to-end model keeps both, and a
    # query with two good classes gives two detections.
    boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0], [0.0, 0.0, 10.0, 10.0], [20.0, 20.0, 30.0, 30.0]])
    scores = torch.tensor([[0.9, 0.1], [0.8, 0.7], [0.05, 0.02]])
    preds = torch.cat([boxes, scores], 1)[None]
    dets = postprocess(preds, conf=0.25, max_det=300, nms=False)[0]
    assert dets[:, 4].tolist() == pytest.approx([0.9, 0.8, 0.7]) and dets[:, 5].tolist() == [0, 0, 1]
    assert torch.equal(dets[2, :4], boxes[1])
    top = postprocess(preds, conf=0.0, max_det=2, nms=False)[0]
    assert top[:, 4].tolist() == pytest.approx([0.9, 0.8])
    empty = postprocess(torch.cat([preds, preds * 0], 0).half(), conf=0.25, nms=False)
    assert len(empty[0]) == 3 and empty[1].shape == (0, 6) and empty[1].dtype == torch.float32
