"""YOLOv9 network: published size figures, contract, predict, deploy fusion, channels_last, spec."""

import math

import pytest
import torch
from testkit import check_model_contract
from torch.utils.flop_counter import FlopCounterMode

from libreyolo.families import get_family, parse_arch
from libreyolo.families.common import prior_prob_bias
from libreyolo.families.yolo9 import ARCHS, build
from libreyolo.families.yolo9.spec import SPEC

# Published (README of WongKinYiu/yolov9 and the paper, table 1): params, GFLOPs at 640, COCO
# (80 classes). They describe the converted inference model in deploy form: auxiliary branch
# removed, BatchNorm folded into the convs and RepConvN branches merged (the authors' val/export
# path calls fuse() before counting). GFLOPs there are thop MACs x 2; FlopCounterMode also counts a
# convolution as 2 x MACs and ignores BN/activations/pooling, like thop's conv count, so the two
# conventions agree. Those figures count the paper's DDetect box branch, whose middle 3x3 conv and
# final 1x1 have 4 groups; ours has groups=1 there, as the peer trainer's YOLOv9 does (it learned
# more per epoch: mAP50-95 0.764 against 0.724 after 5 epochs, docs/training-performance.md). The
# test removes exactly that difference (3/4 of those two convs' weights and MACs) and holds the
# rest to the published figures. Measured here, deploy form: t 2.094M 8.23G, s 7.198M 26.89G,
# m 20.06M 76.79G, c 25.38M 102.65G (the grouped head: t 2.002M 7.71G, s 7.106M 26.38G,
# m 19.97M 76.28G, c 25.29M 102.14G).
PUBLISHED = {"t": (2.0e6, 7.7), "s": (7.1e6, 26.4), "m": (20.0e6, 76.3), "c": (25.3e6, 102.1)}


def _grouping_difference(model, px):
    """(params, GFLOPs at px) that 4 groups in each box branch's middle 3x3 and final 1x1 save."""
    params = flops = 0.0
    for box, stride in zip(model.net.head.box, (8, 16, 32)):
        for conv in (box[1].conv, box[2]):
            saved = conv.weight.numel() * 3 / 4
            params += saved
            flops += 2 * saved * (px // stride) ** 2
    return params, flops / 1e9


def _gflops(model, px):
    """FLOPs of one image, counted on the meta device: shapes only, no arithmetic (a 640 px
    forward of the c size takes 1.5 s on a CPU; the count is the same to the last FLOP)."""
    model = model.to("meta")
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model.capturable(torch.zeros(1, 3, px, px, device="meta"))
    return counter.get_total_flops() / 1e9


@pytest.mark.parametrize("size", SPEC.sizes)
def test_params_and_gflops_match_published(size):
    torch.manual_seed(0)
    model = build(size, 80).eval()
    train_params = sum(p.numel() for p in model.parameters())
    model.fuse()  # deploy form: what the published figures count
    params = sum(p.numel() for p in model.parameters())
    gflops = _gflops(model, 640)
    saved_params, saved_gflops = _grouping_difference(model, 640)
    want_params, want_gflops = PUBLISHED[size]
    assert abs((params - saved_params) / want_params - 1) < 0.02, params
    assert abs((gflops - saved_gflops) / want_gflops - 1) < 0.02, gflops
    # Fusion removes BN affine params and the 1x1 RepConvN branches, never adds any.
    assert params < train_params < params * 1.03


def test_sizes_match_registry():
    assert tuple(ARCHS) == SPEC.sizes == ("t", "s", "m", "c")


@pytest.mark.parametrize("size", ["t", "c"])
def test_capturable_and_predict_shapes(size):
    torch.manual_seed(0)
    model = build(size, 5)
    assert model.num_classes == 5 and model.reg_max == 16
    _, pred = check_model_contract(model, 4 * 16 + 5)
    boxes = pred[..., :4]
    assert (boxes[..., 2] >= boxes[..., 0]).all() and (boxes[..., 3] >= boxes[..., 1]).all()
    # DFL distances lie in [0, reg_max - 1] grid cells around each anchor centre.
    cx = (boxes[..., 0] + boxes[..., 2]) / 2
    assert (boxes[..., 2] - boxes[..., 0]).max() <= 2 * 15 * 32 + 1e-3
    assert cx.min() > -15 * 32 and cx.max() < 96 + 15 * 32


def test_head_bias_init():
    model = build("s", 7)
    for box, cls, s in zip(model.net.head.box, model.net.head.cls, model.strides):
        assert torch.all(box[-1].bias == 1.0)
        want = math.log(5 / 7 / (640 / s) ** 2)
        assert torch.allclose(cls[-1].bias, torch.full_like(cls[-1].bias, want))
        assert prior_prob_bias(7, s) == pytest.approx(want)


def test_spec_is_registered():
    assert get_family("yolov9") is SPEC and get_family("yolo9") is SPEC
    assert SPEC.weights_prefix == "LibreYOLO9" and SPEC.capture.region == "network"
    assert parse_arch("YOLOv9-tiny") == (SPEC, "t")
    assert parse_arch("yolo9c") == (SPEC, "c")
    model = SPEC.build("t", 2)
    crit = SPEC.criterion(model, None)
    assert crit.item_names == ("box", "cls", "dfl")
