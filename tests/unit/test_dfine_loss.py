"""D-FINE / DEIM loss and specs: per-image sums, empty images, the union set, FGL bins, DDF, MAL,
float32, and the recipes (RT-DETRv4 inherits DEIM's)."""

import pytest
import torch
from testkit import live_corners, random_targets

from libreyolo.families import REGISTRY
from libreyolo.families.base import Targets
from libreyolo.families.detr.criterion import SetPairs
from libreyolo.families.dfine.loss import DEIMLoss, union_pairs

pytestmark = pytest.mark.usefixtures("one_thread")


def _empty(b):
    return Targets(torch.zeros(b, 8, 4), torch.zeros(b, 8, dtype=torch.long), torch.zeros(b, 8, dtype=torch.bool))


@pytest.fixture(scope="module", params=["dfine", "deim"])
def step(request):
    spec = REGISTRY[request.param]
    torch.manual_seed(0)
    model = spec.build("n", 3).train()
    live_corners(model)
    tg = random_targets(torch.Generator().manual_seed(2), 4, 8, 64, 3, [2, 0, 5, 8], min_wh=6.0)
    out = model.forward_train(model.capturable(torch.rand(4, 3, 64, 96)), tg)
    return spec, model, spec.criterion(model, None), out, tg


def test_batch_loss_is_per_image_sums_and_empty_terms_vanish(step):
    spec, _, crit, out, tg = step
    assert crit.item_names == ({"dfine": "vfl", "deim": "mal"}[spec.name], "l1", "giou", "fgl", "ddf")
    with torch.no_grad():
        loss, items = crit(out, tg)
        raw, norm = crit.per_image(out, tg)
        rows = [crit.per_image(out.slice(i), Targets(*(t[i:i + 1] for t in tg))) for i in range(4)]
    assert torch.allclose(raw, torch.cat([r for r, _ in rows]), rtol=1e-5, atol=1e-5)
    assert torch.equal(norm, torch.cat([n for _, n in rows])) and norm.tolist() == [2, 0, 5, 8]
    assert torch.allclose(items, raw.sum(0) / 15) and torch.allclose(loss, items.sum() * 4)
    assert (items > 0).all() and torch.isfinite(loss)
    assert raw[1, 1:].abs().sum() == 0 and raw[1, 0] > 0  # the empty image: only the class term
    with torch.no_grad():
        _, empty = crit(out, _empty(4))
    assert empty[0] > 0 and empty[1:].abs().sum() == 0


def test_loss_is_float32_for_bfloat16_outputs_and_under_autocast(step):
    _, _, crit, out, tg = step
    with torch.no_grad():
        _, items = crit(out, tg)
        loss16, items16 = crit(out.to(torch.bfloat16), tg)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, items_ac = crit(out, tg)
    assert loss16.dtype == torch.float32 and torch.isfinite(items16).all()
    assert items_ac.dtype == torch.float32 and torch.allclose(items_ac, items, rtol=1e-6)


def test_gradients_reach_every_head(step):
    _, model, crit, out, tg = step
    model.zero_grad(set_to_none=True)
    crit(out, tg)[0].backward(retain_graph=True)
    for head in (model.enc_score, model.decoder.pre_bbox.layers[-1], model.decoder.corners[0].layers[-1],
                 model.decoder.lqe[1].mlp.layers[-1], model.dn_embed):
        assert head.weight.grad is not None and head.weight.grad.abs().sum() > 0
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_ddf_is_zero_for_the_last_layer_alone_and_at_init():
    spec = REGISTRY["dfine"]
    torch.manual_seed(0)
    model = spec.build("n", 3).train()
    tg = random_targets(torch.Generator().manual_seed(2), 2, 8, 64, 3, [3, 1], min_wh=6.0)
    with torch.no_grad():
        out = model.forward_train(model.capturable(torch.rand(2, 3, 64, 64)), tg)
        _, items = spec.criterion(model, None)(out, tg)
    assert items[4] == 0 and (items[:4] > 0).all()  # zero-init corner heads: all layers agree


def test_union_set_takes_each_querys_most_frequent_target():
    # 1 image, 3 sets, 2 targets, 4 queries: target 0 -> queries 1, 1, 2; target 1 -> 3, 3, 1 (masked)
    q = torch.tensor([[[1, 3], [1, 3], [2, 1]]])
    mask = torch.tensor([[[True, True], [True, True], [True, False]]])
    pairs = {n: SetPairs(q[:, i:i + 1], torch.arange(2).expand(1, 1, 2), mask[:, i:i + 1])
             for i, n in enumerate(("dec", "pre", "enc"))}
    u = union_pairs(pairs, 4)
    assert u.mask[0, 0].tolist() == [False, True, True, True]
    assert u.target[0, 0, 1:].tolist() == [0, 0, 1]


def test_fgl_bins_interpolate_the_distance(step):
    _, _, crit, _, _ = step
    w = crit.project(torch.device("cpu"))
    d = torch.tensor([-9.0, -4.0, -0.3, 0.0, 0.05, 1.7, 3.99, 4.0, 7.0])
    left, wl, wr = crit.bin_targets(d)
    assert ((left >= 0) & (left < 32)).all() and torch.allclose(wl + wr, torch.ones_like(d))
    assert torch.allclose(wl * w[left] + wr * w[left + 1], d.clamp(-4.0, 4.0), atol=1e-6)


def test_mal_formula():
    logits = torch.tensor([[[[0.3, -1.0]]]])
    onehot = torch.tensor([[[[1.0, 0.0]]]])
    score = torch.tensor([[[[0.6, 0.0]]]])
    got = DEIMLoss.classification(None, logits, onehot, score).sum((1, 2, 3))
    p = logits.sigmoid()
    want = -(0.6 ** 1.5 * torch.log(p[..., 0]) + (1 - 0.6 ** 1.5) * torch.log(1 - p[..., 0])) \
        - p[..., 1] ** 1.5 * torch.log(1 - p[..., 1])
    assert torch.allclose(got, want.reshape(1))


def test_recipes():
    from libreyolo.config import build_config

    dfine, deim, v4 = REGISTRY["dfine"], REGISTRY["deim"], REGISTRY["rtdetrv4"]
    assert v4.inherits == "deim" and not v4.defaults and v4.defaults_for("s") == deim.defaults_for("s")
    assert v4.default_sources("s")["lr0"] == (0.0004, "deim")
    assert dfine.defaults_for("n")["lr0"] == 0.0008 and dfine.defaults_for("s")["lr0"] == 0.0002
    assert deim.defaults_for("s")["lr_schedule"] == "flat_cosine" and deim.defaults_for("n")["lr_flat"] == 1.0
    for spec in (dfine, deim, v4):
        assert spec.capture.region == "encoder" and spec.defaults_for(spec.sizes[0])["amp"] is False
        for size in spec.sizes:
            cfg = build_config({}, spec.defaults_for(size))
            assert cfg.backbone_lr == 0.5 and cfg.clip_grad == 0.1 and cfg.optimizer == "adamw"
    model = dfine.build("n", 2)
    assert dfine.backbone(model) is model.net.backbone
    assert [s.weights_prefix for s in (dfine, deim, v4)] == ["LibreDFINE", "LibreDEIM", "LibreRTDETRv4"]
