"""DEIMv2: published sizes, the LiteEncoder sizes' layout, the late IoU-order matching, the
ultra-light loss, the names and the recipe.

Parameter counts are upstream's module for module (github:Intellindust-AI-Lab/DEIMv2, built from
configs/deimv2/deimv2_hgnetv2_{atto,femto,pico,n}_coco.yml with 80 classes: 508,985, 983,945,
1,539,539 and 3,600,421, of which 2 are its frozen `up`/`reg_scale` scalars, buffers here). The
README rounds them to 0.5M, 1.0M, 1.5M and 3.6M; its GFLOPs (0.8, 1.7, 5.2, 6.8) are at each
size's input (320, 416, 640, 640) and rounded to one decimal.
"""

from types import SimpleNamespace

import pytest
import torch
from testkit import random_targets
from torch.utils.flop_counter import FlopCounterMode

from libreyolo.families import REGISTRY, parse_arch, parse_official
from libreyolo.families.deimv2.loss import DEIMv2Loss, DEIMv2OwnSetLoss, iou_order_cost
from libreyolo.families.deimv2.net import build
from libreyolo.families.detr.matcher import match_cost

pytestmark = pytest.mark.usefixtures("one_thread")

PARAMS = {"atto": 508_983, "femto": 983_943, "pico": 1_539_537, "n": 3_600_419}
GFLOPS = {"atto": (320, 0.8), "femto": (416, 1.7), "pico": (640, 5.2), "n": (640, 6.8)}


@pytest.mark.parametrize("size", ["atto", "femto", "pico", "n"])
def test_size_matches_upstream(size):
    model = build(size, 80).eval()
    assert sum(p.numel() for p in model.parameters()) == PARAMS[size]
    px, published = GFLOPS[size]
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model.predict(torch.rand(1, 3, px, px))
    # Within the published figure's rounding (0.05) or 5 %, whichever is wider (grid_sample and
    # the softmaxes are not counted here).
    assert abs(counter.get_total_flops() / 1e9 - published) <= max(0.05, 0.05 * published)


def test_lite_encoder_sizes_layout_and_predict():
    torch.manual_seed(0)
    model = build("atto", 3).train()
    assert model.strides == (16, 32) and len(model.decoder.corners) == 1  # one shared corner head
    assert model.num_queries == 100 and isinstance(model.enc_output, torch.nn.Identity)
    tg = random_targets(torch.Generator().manual_seed(0), 2, 8, 64, 3, [3, 0], min_wh=6.0)
    maps = model.capturable(torch.rand(2, 3, 64, 96))
    assert [tuple(m.shape) for m in maps] == [(2, 64, 4, 6), (2, 64, 2, 3)]  # one backbone map, two levels
    out = model.forward_train(maps, tg)
    q, d = 4 * 6 + 2 * 3, 2 * 3 * (100 // 3)  # fewer cells than 100 queries; dn: 33 groups of 3 + 3
    assert out.logits.shape == (2, 3, q, 3) and out.dn_logits.shape == (2, 3, d, 3)
    assert out.extra["corners"].shape == (2, 3, q, 132)
    model.eval()
    with torch.no_grad():
        pred = model.predict(torch.rand(2, 3, 320, 320))
    assert pred.shape == (2, 100, 7) and ((pred[..., 4:] >= 0) & (pred[..., 4:] <= 1)).all()
    n = build("n", 3)
    assert n.strides == (16, 32) and len(n.decoder.corners) == 3 and n.num_queries == 300
    assert n.net.encoder.fuse_sum and n.decoder.layers[0].gateway and not model.decoder.layers[0].gateway


def test_iou_order_cost_by_hand():
    # one query, two targets: p 0.5 / 0.25 at their classes, IoU 1 / 0.5 -> -(0.5 x 1), -(0.25 x 0.5^4)
    logits = torch.tensor([[[0.0, -1.0986123]]])       # sigmoid: 0.5, 0.25
    boxes = torch.tensor([[[0.5, 0.5, 0.2, 0.2]]])
    labels = torch.tensor([[0, 1]])
    tgt = torch.tensor([[[0.5, 0.5, 0.2, 0.2], [0.45, 0.5, 0.1, 0.2]]])  # half the box: IoU 0.5
    cost = iou_order_cost(logits, boxes, labels, tgt)
    assert cost.shape == (1, 2, 1)
    assert torch.allclose(cost[0, :, 0], torch.tensor([-0.5, -0.25 * 0.5 ** 4]), atol=1e-6)


def test_matching_cost_turns_late_in_training():
    model = build("femto", 3)
    crit = REGISTRY["deimv2"].criterion(model, None)
    gen = torch.Generator().manual_seed(1)
    args = (torch.randn(2, 5, 3, generator=gen), torch.rand(2, 5, 4, generator=gen) * 0.5 + 0.2,
            torch.randint(0, 3, (2, 4), generator=gen), torch.rand(2, 4, 4, generator=gen) * 0.5 + 0.2)
    cfg = SimpleNamespace(epochs=20)
    assert model.set_epoch(17, cfg) is None  # nothing changed: nothing to re-capture
    assert not model.iou_matching
    assert torch.equal(crit.match_cost(*args), match_cost(*args))
    # 0.9 x 20: the switch's reason, which the trainer logs and which re-arms the graphs (a whole
    # step captured the matching with the old cost)
    assert "class score x IoU^4" in model.set_epoch(18, cfg)
    assert model.iou_matching and model.set_epoch(19, cfg) is None
    assert torch.equal(crit.match_cost(*args), iou_order_cost(*args))
    assert "focal/L1/GIoU" in model.set_epoch(0, cfg)  # a new run on the same model (or a resume before the switch)
    assert not model.iou_matching
    n = build("n", 3)
    n.set_epoch(135, SimpleNamespace(epochs=160))
    assert not n.iou_matching  # n: from epoch 136 of 160 (matcher_change_epoch)
    n.set_epoch(136, SimpleNamespace(epochs=160))
    assert n.iou_matching


def test_loss_forms_per_size():
    """atto/femto/pico: MAL, L1, GIoU on each set's own matching; n: DEIM's union-set loss with
    FGL and DDF. The class term is on each set's own matching in both, so it agrees."""
    torch.manual_seed(0)
    model = build("pico", 3).train()
    own = REGISTRY["deimv2"].criterion(model, None)
    union = DEIMv2Loss(model, None)
    assert isinstance(own, DEIMv2OwnSetLoss) and own.item_names == ("mal", "l1", "giou")
    assert union.item_names == ("mal", "l1", "giou", "fgl", "ddf")
    assert type(REGISTRY["deimv2"].criterion(build("n", 3), None)) is DEIMv2Loss
    tg = random_targets(torch.Generator().manual_seed(2), 3, 8, 64, 3, [4, 1, 6], min_wh=6.0)
    with torch.no_grad():
        out = model.forward_train(model.capturable(torch.rand(3, 3, 64, 64)), tg)
        _, a = own(out, tg)
        _, b = union(out, tg)
    assert torch.allclose(a[0], b[0]) and not torch.allclose(a[1:3], b[1:3])


def test_names_resolve_to_deimv2_not_deim():
    assert parse_official("LibreDEIMv2atto.pt") == (REGISTRY["deimv2"], "atto")
    assert parse_official("LibreDEIMv2n.pt") == (REGISTRY["deimv2"], "n")
    assert parse_official("LibreDEIMn.pt") == (REGISTRY["deim"], "n")
    assert parse_arch("deimv2-a") == (REGISTRY["deimv2"], "atto")
    assert parse_arch("DEIMv2_femto") == (REGISTRY["deimv2"], "femto")
    assert parse_arch("deim-n") == (REGISTRY["deim"], "n")


def test_recipe_inherits_deim_and_sets_its_own():
    sources = REGISTRY["deimv2"].default_sources("atto")
    assert sources["lr_schedule"] == ("flat_cosine", "deim") and sources["backbone_lr"] == (0.5, "deim")
    assert sources["amp"] == (True, "deimv2") and sources["lr0"] == (0.002, "deimv2-atto")
    assert sources["imgsz"] == (320, "deimv2-atto") and sources["mosaic"] == (0.3, "deimv2-atto")
    n = REGISTRY["deimv2"].defaults_for("n")
    assert (n["lr0"], n["nbs"], n["lrf"], n["no_aug_epochs"], n["mixup"]) == (0.0008, 32, 1.0, 12, 0.5)
    assert REGISTRY["deimv2"].defaults_for("femto")["imgsz"] == 416
