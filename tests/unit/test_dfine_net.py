"""D-FINE / DEIM network: published size, output layout, the FDR helpers, BN fusion.

Parameter counts are upstream's module for module (github:Peterande/D-FINE, built from
configs/dfine/dfine_hgnetv2_{n,s}_coco.yml with num_classes 80: 3,782,693 and 10,321,877, of
which 2 are its frozen `up`/`reg_scale` scalars, buffers here). The README rounds them to 4M and
10M; its GFLOPs (7 and 25 at 640) are FLOPs = 2 x multiply-adds, FlopCounterMode's unit.
"""

import pytest
import torch
from testkit import random_targets
from torch.utils.flop_counter import FlopCounterMode

from libreyolo.families.dfine.decoder import box_to_distance, distance_to_box, weighting_function
from libreyolo.families.dfine.net import DEIMModel, build, build_deim

pytestmark = pytest.mark.usefixtures("one_thread")

PARAMS = {"n": 3_782_691, "s": 10_321_875}
GFLOPS = {"n": 7.0, "s": 25.0}  # D-FINE README, 640 x 640


@pytest.mark.parametrize("size", ["n", "s"])
def test_size_matches_upstream(size):
    torch.manual_seed(0)
    model = build(size, 80).eval()
    assert sum(p.numel() for p in model.parameters()) == PARAMS[size]
    assert sum(p.numel() for p in build_deim(size, 80).parameters()) == PARAMS[size]  # same network
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model.predict(torch.rand(1, 3, 640, 640))
    assert counter.get_total_flops() / 1e9 == pytest.approx(GFLOPS[size], rel=0.05)


def test_weighting_function_and_box_distances():
    w = weighting_function(32, 0.5, 4.0)
    assert w.shape == (33,) and (w.diff() > 0).all()
    assert w[0] == -4.0 and w[16] == 0.0 and w[32] == 4.0 and w[31] == pytest.approx(2.0)
    ref = torch.tensor([[0.5, 0.4, 0.2, 0.3]])
    assert torch.allclose(distance_to_box(ref, torch.zeros(1, 4), 4.0), ref)  # d = 0: the reference
    box = torch.tensor([[0.3, 0.2, 0.7, 0.5]])
    d = box_to_distance(ref, box, 4.0)
    out = distance_to_box(ref, d, 4.0)
    assert torch.allclose(torch.cat((out[:, :2] - out[:, 2:] / 2, out[:, :2] + out[:, 2:] / 2), 1), box, atol=1e-6)


def test_forward_train_layout_and_predict():
    torch.manual_seed(0)
    model = build("n", 3).train()
    tg = random_targets(torch.Generator().manual_seed(0), 2, 8, 64, 3, [3, 0], min_wh=6.0)
    out = model.forward_train(model.capturable(torch.rand(2, 3, 64, 96)), tg)
    q = 4 * 6 + 2 * 3  # strides 16 and 32 on 64 x 96: fewer cells than 300 queries
    d = 2 * 3 * (100 // 3)
    assert out.logits.shape == (2, 3, q, 3) and out.boxes.shape == (2, 3, q, 4)
    assert out.enc_logits.shape == (2, 1, q, 3) and out.dn_logits.shape == (2, 3, d, 3)
    assert out.extra["corners"].shape == (2, 3, q, 132) and out.extra["dn_corners"].shape == (2, 3, d, 132)
    assert out.extra["pre_boxes"].shape == (2, q, 4) and out.extra["dn_pre_logits"].shape == (2, d, 3)
    assert (out.dn_target[1] == -1).all() and out.dn_groups.tolist() == [33.0, 33.0]
    one = out.slice(1)
    assert one.logits.shape[0] == 1 and one.extra["refs"].shape == (1, 3, q, 4)
    model.eval()
    with torch.no_grad():
        pred = model.predict(torch.rand(2, 3, 64, 96))
        assert torch.equal(model(torch.zeros(1, 3, 64, 64)), model.predict(torch.zeros(1, 3, 64, 64)))
    assert pred.shape == (2, q, 7) and ((pred[..., 4:] >= 0) & (pred[..., 4:] <= 1)).all()
    assert model.end_to_end and model.backbone is model.net.backbone and model.strides == (16, 32)
    assert isinstance(build_deim("s", 3), DEIMModel) and build("s", 3).strides == (8, 16, 32)


def test_query_anchors_and_topk_cells():
    from libreyolo.families.detr.queries import QueryAnchors, take, topk_cells

    anchors, valid = QueryAnchors()([(2, 2), (1, 60)], torch.zeros(1))
    assert anchors.shape == (1, 64, 4) and valid.shape == (1, 64, 1)
    assert torch.allclose(anchors[0, 0].sigmoid(), torch.tensor([0.25, 0.25, 0.05, 0.05]))
    assert not valid[0, 4] and torch.isinf(anchors[0, 4]).all()  # x centre 1/120 < eps 0.01
    assert valid[0, 5] and torch.isfinite(anchors[0, 5]).all()
    logits = torch.tensor([[[0.0, 3.0], [5.0, -1.0], [1.0, 1.0]]])
    assert topk_cells(logits, 300).tolist() == [[0, 1, 2]]  # every cell, in cell order
    idx = topk_cells(logits, 2)  # the two best (max logit 5 and 3), still in cell order
    assert idx.tolist() == [[0, 1]] and torch.equal(take(logits, idx[:, 1:]), logits[:, 1:2])
