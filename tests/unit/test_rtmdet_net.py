"""RTMDet network: published size figures, shared-conv/separate-BN head, contract, predict, spec."""

import pytest
import torch
from testkit import check_model_contract
from torch.utils.flop_counter import FlopCounterMode

from libreyolo.config import build_config
from libreyolo.families import get_family, parse_arch, weights_name
from libreyolo.families.rtmdet import ARCHS, build
from libreyolo.families.rtmdet.spec import SPEC

# Published: README of mmdetection configs/rtmdet (same in the paper, arXiv 2212.07784, table 2),
# 640 px, COCO 80 classes: params, "FLOPs". Those FLOPs come from mmengine's
# get_model_complexity_info (fvcore-style: one multiply-add = one flop, plus ~2 ops per BatchNorm
# element; mmyolo's complexity docs show RTMDet-s stem.0 at 47.5M = 44.2M conv MACs + BN), so
# they are MACs and we compare MACs = FlopCounterMode / 2 (which counts convs only).
# Measured here: t 4.896M 8.036G, s 8.887M 14.761G, m 24.709M 39.066G, l 52.316M 79.899G,
# x 94.856M 141.190G (MACs). tiny's "4.8M" is the README rounding 4.896M down.
PUBLISHED = {"t": (4.8e6, 8.1), "s": (8.89e6, 14.8), "m": (24.71e6, 39.27),
             "l": (52.3e6, 80.23), "x": (94.86e6, 141.67)}


@pytest.mark.parametrize("size", SPEC.sizes)
def test_params_and_macs_match_published(size):
    with torch.device("meta"):  # shapes only: counts in milliseconds, no weights allocated
        model = build(size, 80).eval()
        params = sum(p.numel() for p in model.parameters())
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model.capturable(torch.zeros(1, 3, 640, 640))
    gmacs = counter.get_total_flops() / 2e9
    want_params, want_gmacs = PUBLISHED[size]
    assert abs(params / want_params - 1) < (0.025 if size == "t" else 0.005), params
    assert abs(gmacs / want_gmacs - 1) < 0.02, gmacs
    assert gmacs < want_gmacs  # the published figure also counts BatchNorm ops, we do not


def test_sizes_match_registry():
    assert tuple(ARCHS) == SPEC.sizes == ("t", "s", "m", "l", "x")
    assert [ARCHS[s].exp_on_reg for s in SPEC.sizes] == [False, False, True, True, True]


def test_head_shares_conv_weights_but_not_batchnorm():
    model = build("t", 3)
    head = model.net.head
    convs = [m for m in head.modules() if isinstance(m, torch.nn.Conv2d)]
    # 2 cls + 2 reg shared 3x3 convs, and 3 levels x (cls + reg) 1x1 predictors.
    assert len(convs) == 4 + 6
    for shared in (*head.cls_convs, *head.reg_convs):
        assert len(shared.bns) == 3 and len({id(bn.weight) for bn in shared.bns}) == 3
    # The conv weight receives a gradient from every level (their sum).
    x = torch.rand(2, 3, 64, 64)
    outs = model.capturable(x)
    level_grads = []
    for i in range(3):
        g, = torch.autograd.grad(outs[i].sum(), head.cls_convs[0].conv.weight, retain_graph=True)
        level_grads.append(g)
    total, = torch.autograd.grad(sum(o.sum() for o in outs), head.cls_convs[0].conv.weight)
    assert all(g.abs().sum() > 0 for g in level_grads)
    assert torch.allclose(total, sum(level_grads), rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("exp_on_reg", [False, True])  # tiny/s: linear distances, m/l/x: exp
def test_capturable_and_predict_shapes(exp_on_reg):
    torch.manual_seed(0)
    model = build("t", 5)
    model.net.head.exp_on_reg = exp_on_reg  # the only head difference between the two groups
    assert model.num_classes == 5
    out, pred = check_model_contract(model, 5 + 4)  # classes, box distances
    scores = pred[..., 4:]
    # Fresh head: class prior 0.01, distances ~1 stride (exp(0)) or ~0 (linear), so boxes hug
    # their prior points (cell corners).
    assert torch.allclose(scores, torch.full_like(scores, 0.01), atol=0.01)
    points, strides = model.priors(out)
    span = (pred[..., 2:4] - pred[..., 0:2]) / strides
    if exp_on_reg:
        assert torch.allclose(span, torch.full_like(span, 2.0), atol=0.3)
    else:
        assert span.abs().max() < 0.3
    assert torch.allclose((pred[..., :2] + pred[..., 2:4]) / 2, points.expand(2, -1, -1),
                          atol=0.2 * 32)


def test_priors_are_cell_corners():
    model = build("t", 1)
    points, strides = model.priors([torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 1, 1)])
    assert points.tolist() == [[0, 0], [8, 0], [0, 8], [8, 8], [0, 0]]
    assert strides.flatten().tolist() == [8, 8, 8, 8, 16]


def test_spec_names_and_defaults():
    assert get_family("rtmdet") is SPEC and SPEC.display == "RTMDet"
    assert parse_arch("RTMDet-tiny") == (SPEC, "t") and parse_arch("rtmdet_x") == (SPEC, "x")
    assert weights_name(SPEC, "t") == "LibreRTMDett.pt"
    assert SPEC.capture.region == "network"
    cfg = build_config({}, SPEC.defaults)  # every default is a valid config value
    assert (cfg.optimizer, cfg.box, cfg.cls, cfg.no_aug_epochs) == ("adamw", 2.0, 1.0, 20)
    crit = SPEC.criterion(SPEC.build("t", 2), cfg)
    assert crit.item_names == ("box", "cls") and crit.gains == (2.0, 1.0)


def test_no_epoch_hook():
    # Nothing RTMDet's network or loss computes changes with the epoch (its stage 2 only swaps
    # the data pipeline, which no_aug_epochs drives), so the model has no set_epoch and the
    # trainer never invalidates its graphs for it.
    assert getattr(build("t", 2), "set_epoch", None) is None
