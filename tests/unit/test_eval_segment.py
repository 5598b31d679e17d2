"""The segmentation evaluator against hand-worked confusion matrices: IoU = TP / (TP + FP + FN),
mIoU over the classes present in the ground truth or the prediction (nanmean), pixel accuracy,
ignored pixels not counted; then evaluate_segment end to end and the per-class table."""

import math

import pytest
import torch
from torch import nn

from libreyolo.data.segment import SegBatch, SegTargets
from libreyolo.eval.segment import confusion, evaluate_segment, scores
from libreyolo.eval.table import segment_table

IGNORE = 255


def _scores(pred, gt, nc):
    return scores(confusion(torch.tensor(pred), torch.tensor(gt), nc, IGNORE))


def test_two_classes_by_hand():
    # gt 0 0 1 1 / pred 0 1 1 1: class 0 TP 1, FN 1 -> 1/2; class 1 TP 2, FP 1 -> 2/3.
    out = _scores([[0, 1, 1, 1]], [[0, 0, 1, 1]], 2)
    assert out["iou"] == pytest.approx([1 / 2, 2 / 3])
    assert out["miou"] == pytest.approx((1 / 2 + 2 / 3) / 2) and out["pixel_acc"] == pytest.approx(3 / 4)
    assert out["acc"] == pytest.approx([1 / 2, 1.0]) and out["pixels"] == [2, 2]


def test_three_classes_with_an_ignored_pixel_and_an_absent_class():
    # 4 classes; the ignored pixel (predicted 3) is not counted, so class 3 is in neither the ground
    # truth nor the (counted) prediction: NaN, left out of the mean.
    # valid (gt, pred): (0,0) (0,2) (1,1) (2,2) (2,1)
    # class 0: TP 1, FN 1, FP 0 -> 1/2; class 1: TP 1, FP 1 -> 1/2; class 2: TP 1, FN 1, FP 1 -> 1/3.
    gt = [[0, 0, 1], [2, IGNORE, 2]]
    pred = [[0, 2, 1], [2, 3, 1]]
    out = _scores(pred, gt, 4)
    assert out["iou"][:3] == pytest.approx([1 / 2, 1 / 2, 1 / 3]) and math.isnan(out["iou"][3])
    assert out["miou"] == pytest.approx((1 / 2 + 1 / 2 + 1 / 3) / 3)
    assert out["pixel_acc"] == pytest.approx(3 / 5) and out["pixels"] == [2, 1, 2, 0]
    assert out["acc"][:3] == pytest.approx([1 / 2, 1.0, 1 / 2]) and math.isnan(out["acc"][3])


def test_a_class_only_predicted_counts_with_iou_zero():
    out = _scores([[0, 1]], [[0, 0]], 2)  # class 1: FP 1, no ground truth -> IoU 0, in the mean
    assert out["iou"] == pytest.approx([1 / 2, 0.0]) and out["miou"] == pytest.approx(1 / 4)


def test_all_ignored_gives_zeros():
    out = _scores([[0, 1]], [[IGNORE, IGNORE]], 2)
    assert out["miou"] == 0.0 and out["pixel_acc"] == 0.0 and out["pixels"] == [0, 0]


class _Fixed(nn.Module):
    """predict(images) -> the given class maps as near-one-hot probabilities (0.9 on the class)."""

    def __init__(self, maps: torch.Tensor, nc: int):
        super().__init__()
        self.maps, self.num_classes, self.calls = maps, nc, 0

    def predict(self, images):
        b = images.shape[0]
        m = self.maps[self.calls:self.calls + b]
        self.calls += b
        probs = torch.full((b, self.num_classes, *m.shape[-2:]), 0.1 / (self.num_classes - 1))
        return probs.scatter_(1, m[:, None], 0.9)


def test_evaluate_segment_end_to_end_and_the_table():
    gt = torch.tensor([[[0, 0, 1], [2, IGNORE, 2]], [[1, 1, 1], [0, 0, 0]]])
    pred = torch.tensor([[[0, 2, 1], [2, 3, 1]], [[1, 1, 1], [0, 0, 0]]])
    model = _Fixed(pred, 4).train()
    batches = [SegBatch(torch.zeros(1, 3, 2, 3, dtype=torch.uint8), SegTargets(gt[i:i + 1].to(torch.uint8)))
               for i in range(2)]
    out = evaluate_segment(model, batches, "cpu", ignore_index=IGNORE, names=["a", "b", "c", "d"])
    assert model.training  # restored
    # Over both images: class 0 TP 4 FN 1 -> 4/5; class 1 TP 4 FP 1 -> 4/5; class 2 TP 1 FN 1 FP 1 -> 1/3.
    assert out["miou"] == pytest.approx((4 / 5 + 4 / 5 + 1 / 3) / 3)
    assert out["pixel_acc"] == pytest.approx(9 / 11) and out["num_images"] == 2
    assert out["loss"] == pytest.approx((9 * -math.log(0.9) + 2 * -math.log(0.1 / 3)) / 11)
    assert out["per_class"][3] == {"class": "d", "pixels": 0, "iou": None, "acc": None}
    head, rows = segment_table(out)
    assert head == ["class", "pixels", "IoU", "acc"]
    assert rows[0] == ["all", "11", f"{out['miou']:.3f}", f"{9 / 11:.3f}"] and rows[4] == ["d", "0", "-", "-"]
