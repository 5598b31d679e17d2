"""YOLOX network: published size figures, contract, predict, deploy fusion, spec, set_epoch."""

from types import SimpleNamespace

import pytest
import torch
from testkit import check_model_contract
from torch.utils.flop_counter import FlopCounterMode

from libreyolo.families import get_family, parse_arch
from libreyolo.families.yolox import ARCHS, build
from libreyolo.families.yolox.net import PRIOR_BIAS
from libreyolo.families.yolox.spec import SPEC

pytestmark = pytest.mark.usefixtures("one_thread")


# Published: YOLOX README model-zoo table (Megvii-BaseDetection/YOLOX; the report, arXiv 2107.08430,
# gives the same): params (M) and GFLOPs with 80 classes, nano and tiny at 416 px, s..x at 640.
# Their GFLOPs come from thop on the unfused training-form model (BN not folded), doubled
# (thop MACs x 2) and scaled from a 64 px input to the test size. FlopCounterMode also counts a
# convolution as 2 x MACs but ignores BatchNorm, which thop counts; that is why every measured
# figure is a little lower (nano most, -3.2 %, as its depthwise convs are cheap next to its BNs).
# Measured here: n 0.912M 1.045G@416, t 5.056M 6.413G@416, s 8.968M 26.69G, m 25.33M 73.53G,
# l 54.21M 155.29G, x 99.07M 281.41G (params equal the published ones to the last digit).
PUBLISHED = {"n": (0.91e6, 1.08, 416), "t": (5.06e6, 6.45, 416), "s": (9.0e6, 26.8, 640),
             "m": (25.3e6, 73.8, 640), "l": (54.2e6, 155.6, 640), "x": (99.1e6, 281.9, 640)}


def _gflops(model, px):
    """FLOPs of one image, counted on the meta device: shapes only, no arithmetic (fast)."""
    model = model.to("meta")
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model.capturable(torch.zeros(1, 3, px, px, device="meta"))
    return counter.get_total_flops() / 1e9


@pytest.mark.parametrize("size", SPEC.sizes)
def test_params_and_gflops_match_published(size):
    model = build(size, 80).eval()
    params = sum(p.numel() for p in model.parameters())
    want_params, want_gflops, px = PUBLISHED[size]
    assert abs(params / want_params - 1) < 0.01, params
    g = _gflops(model, px)
    assert -0.05 < g / want_gflops - 1 < 0, g  # below: thop also counts the BNs (see above)
    # The brief's 640 px figure: every feature map scales exactly with the input (416 and 640 are
    # both multiples of 32), so FLOPs scale with the area: nano 2.47G, tiny 15.18G at 640.
    if px != 640:
        assert _gflops(model, 640) == pytest.approx(g * (640 / 416) ** 2, rel=1e-9)


def test_sizes_and_widths():
    assert tuple(ARCHS) == SPEC.sizes == ("n", "t", "s", "m", "l", "x")
    assert ARCHS["n"].depthwise and not any(ARCHS[s].depthwise for s in "tsmlx")
    model = build("s", 3)
    assert model.net.backbone.stem.conv.conv.out_channels == 32  # int(64 * 0.5)
    assert len(model.net.backbone.dark3[1].m) == 3  # 3 * round(0.33 * 3)


@pytest.mark.parametrize("size", ["n", "t"])
def test_capturable_and_predict_shapes(size):
    torch.manual_seed(0)
    model = build(size, 5)
    assert model.num_classes == 5
    _, pred = check_model_contract(model, 4 + 1 + 5)  # box, objectness, classes
    boxes = pred[..., :4]
    assert (boxes[..., 2] > boxes[..., 0]).all() and (boxes[..., 3] > boxes[..., 1]).all()


def test_decode_by_hand():
    """Zero raw outputs: a box one stride wide centred on the cell's top-left corner; the score is
    the product of the objectness and class sigmoids."""
    model = build("n", 2)
    preds = tuple(torch.zeros(1, 7, 64 // s, 64 // s) for s in (8, 16, 32))
    preds[0][0, 4, 1, 2] = 2.0  # objectness at level 0, row 1, column 2
    preds[0][0, 6, 1, 2] = -1.0  # class 1 there
    preds[0][0, 2, 1, 2] = 1.0  # log width: e strides wide
    out = model.decode(preds)
    cell = 1 * 8 + 2
    assert out[0, 0, :4].tolist() == [-4.0, -4.0, 4.0, 4.0]
    assert out[0, cell, :4].tolist() == pytest.approx([16 - 4 * 2.718281828, 4, 16 + 4 * 2.718281828, 12])
    # Plain floats: pytest.approx() of a list of 0-d tensors stopped working in pytest 9.2.
    s = torch.sigmoid(torch.tensor(2.0)).item()
    assert out[0, cell, 4:].tolist() == pytest.approx([s * 0.5, s * torch.sigmoid(torch.tensor(-1.0)).item()])
    assert out[0, 64, :4].tolist() == [-8.0, -8.0, 8.0, 8.0]  # first cell of level 1 (stride 16)


def test_head_bias_init():
    model = build("t", 7)
    head = model.net.head
    for cls_out, reg_out in zip(head.cls_out, head.reg_out):
        assert torch.allclose(cls_out.bias, torch.full((7,), PRIOR_BIAS))
        assert reg_out.bias[4].item() == pytest.approx(PRIOR_BIAS)
    assert torch.sigmoid(torch.tensor(PRIOR_BIAS)).item() == pytest.approx(0.01)


def test_set_epoch_switches_l1_once_when_mosaic_closes():
    cfg = SimpleNamespace(epochs=20, no_aug_epochs=5)
    model = build("n", 2)
    got = [model.set_epoch(e, cfg) for e in range(20)]
    assert got[15] == "yolox l1 branch on"
    assert got[:15] == [None] * 15 and got[16:] == [None] * 4
    assert model.use_l1
    # Resuming past the switch: the first epoch seen says it, the next ones do not.
    resumed = build("n", 2)
    assert resumed.set_epoch(17, cfg) == "yolox l1 branch on" and resumed.set_epoch(18, cfg) is None
    # Reusing a model for a new run that starts before the switch turns it back off, and says so.
    assert resumed.set_epoch(0, cfg) == "yolox l1 branch off" and not resumed.use_l1
    # no_aug_epochs = 0: mosaic never closes, the L1 term never starts.
    never = build("n", 2)
    cfg0 = SimpleNamespace(epochs=3, no_aug_epochs=0)
    assert [never.set_epoch(e, cfg0) for e in range(3)] == [None] * 3 and not never.use_l1
    # no_aug_epochs >= epochs: closed from the first epoch.
    early = build("n", 2)
    assert early.set_epoch(0, SimpleNamespace(epochs=3, no_aug_epochs=5)) == "yolox l1 branch on"


def test_spec_parses_every_spelling():
    assert get_family("yolox") is SPEC
    assert SPEC.weights_prefix == "LibreYOLOX" and SPEC.capture.region == "network"
    assert parse_arch("YOLOX-nano") == (SPEC, "n")
    assert parse_arch("yolox_tiny") == (SPEC, "t")
    assert parse_arch("yoloxs") == (SPEC, "s") and parse_arch("YOLOX-x") == (SPEC, "x")
    assert parse_arch("yolo9-t")[0].name == "yolo9"  # the shorter family keeps its names
    assert parse_arch("yolox-c") is None
    crit = SPEC.criterion(SPEC.build("n", 2), None)
    assert crit.item_names == ("box", "obj", "cls", "l1")


def test_spec_defaults_are_valid_config():
    from libreyolo.config import build_config
    cfg = build_config({}, SPEC.defaults)
    assert cfg.box == 5.0 and cfg.no_aug_epochs == 15 and cfg.mixup == 1.0 and cfg.lrf == 0.05
