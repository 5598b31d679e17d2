"""RF-DETR: published sizes, the windowed ViT's layout, the group queries and their loss, IA-BCE
by hand, the released ViT weights through the official weights' path (and the one line when they
are not there), names and recipe.

Parameters against the RF-DETR README's model table (github:roboflow/rf-detr README.md, COCO
checkpoints: N 30.5M, S 32.1M, M 33.7M, one decimal), counted as upstream's module holds them:
its 91-way class heads (num_classes 90 + 1) and DINOv2's 384-wide `mask_token`, which ours leaves
out (vit.py). The README and the benchmarks page publish params, latency and resolution but no
GFLOPs, and the paper's table could not be read from here; the GFLOPs pinned below are ours at the
size's resolution, 80 classes: FlopCounterMode (2 FLOPs per multiply-add; grid_sample not counted)
plus the ViT's attention matmuls, which it does not count on CPU (torch's fused CPU attention
kernel has no FLOP formula): 4 x tokens^2 x 384 per attended sequence, 9 windowed blocks of four
145-token sequences (nano) and 3 full blocks of one 580-token sequence.
"""

import argparse
import logging

import pytest
import torch
from testkit import random_targets
from torch.utils.flop_counter import FlopCounterMode

from libreyolo.engine.builder import build_model
from libreyolo.errors import CheckpointError
from libreyolo.families import REGISTRY, parse_arch, parse_official
from libreyolo.families.rfdetr.loss import RFDETRLoss
from libreyolo.families.rfdetr.net import build, reparam
from libreyolo.families.rfdetr.weights import BACKBONE_WEIGHTS, PREFIX, load_backbone
from libreyolo.resolve import ModelSource, fetch_weights

pytestmark = pytest.mark.usefixtures("one_thread")

PUBLISHED_M = {"n": 30.5, "s": 32.1, "m": 33.7}
MASK_TOKEN = 384
GFLOPS = {"n": 31.73, "s": 59.50, "m": 78.43}  # ours at 384 / 512 / 576 px, 80 classes


def _attention_flops(px: int) -> int:
    """QK^T and AV of the ViT's 12 blocks at a square input of `px`: 2 x 2 windows, a class token each."""
    t = (px // 16) ** 2 // 4 + 1
    return 9 * 4 * (4 * t * t * 384) + 3 * 4 * (4 * t) ** 2 * 384


@pytest.mark.parametrize("size", ["n", "s", "m"])
def test_size_matches_the_published_parameters(size):
    upstream = sum(p.numel() for p in build(size, 91).parameters()) + MASK_TOKEN
    assert round(upstream / 1e6, 1) == PUBLISHED_M[size]
    model = build(size, 80).eval()
    px = model.arch.imgsz
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        pred = model.predict(torch.rand(1, 3, px, px))
    assert pred.shape == (1, 300, 84)
    assert (counter.get_total_flops() + _attention_flops(px)) / 1e9 == pytest.approx(GFLOPS[size], rel=0.005)


def test_windowed_vit_attends_in_windows_and_globally_in_its_out_blocks():
    torch.manual_seed(0)
    vit = build("n", 3).net.backbone.eval()
    assert vit.full == {3, 6, 9}  # the blocks after the first three outputs (blocks 2, 5, 8)
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        base = vit(x)
        # a change in the top-left window reaches another window only through a global block:
        # after block 2 (the first output, before global block 3) the other windows are untouched
        y = x.clone()
        y[..., :16, :16] += 1.0
        moved = vit(y)
    assert [tuple(m.shape) for m in base] == [(1, 384, 4, 4)] * 4
    first = (moved[0] - base[0]).abs().amax(1)[0]  # [4, 4] patch grid, 2 x 2 windows of 2 x 2
    assert first[:2, :2].max() > 1e-3 and first[2:, :].max() == 0 and first[:, 2:].max() == 0
    assert (moved[1] - base[1]).abs().amax(1)[0][2:, 2:].max() > 1e-3  # block 5 comes after global block 3
    with pytest.raises(ValueError, match="multiples of 32"):
        vit(torch.rand(1, 3, 48, 48))


def test_groups_in_training_one_group_in_eval():
    torch.manual_seed(0)
    model = build("n", 3).train()
    tg = random_targets(torch.Generator().manual_seed(0), 2, 8, 64, 3, [3, 1], min_wh=6.0)
    x = torch.rand(2, 3, 64, 96)
    out = model.forward_train(model.capturable(x), tg)
    k = 4 * 6  # fewer cells than 300 queries: each group takes its own first 24
    assert out.logits.shape == (2, 2, 13 * k, 3) and out.enc_logits.shape == (2, 13, k, 3)
    assert out.dn_logits.shape[2] == 0 and out.extra["input_wh"].tolist() == [[96.0, 64.0]] * 2
    model.eval()
    with torch.no_grad():
        logits = model.capturable(x)[0]
        model.net.query_feat.weight[300:] += 5.0  # the other groups' queries: not used in eval
        model.net.enc_class[1].bias += 5.0
        assert logits.shape == (2, 2, k, 3) and torch.equal(model.capturable(x)[0], logits)


def test_self_attention_stays_inside_a_group():
    torch.manual_seed(0)
    model = build("n", 3).train()
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        before = model.capturable(x)[0]
        model.net.query_feat.weight[300:316] += 1.0  # group 1's 16 queries
        after = model.capturable(x)[0]
    k = 16
    assert torch.equal(after[:, :, :k], before[:, :, :k])           # group 0 unchanged
    assert not torch.allclose(after[:, :, k:2 * k], before[:, :, k:2 * k])


def test_reparam_and_zero_init_queries_start_on_their_proposals():
    ref = torch.tensor([[0.5, 0.4, 0.2, 0.1]])
    assert torch.allclose(reparam(ref, torch.tensor([[0.5, -1.0, 0.0, 0.6931472]])),
                          torch.tensor([[0.6, 0.3, 0.2, 0.2]]))
    torch.manual_seed(0)
    model = build("n", 3).eval()
    with torch.no_grad():
        logits, boxes, enc_logits, enc_boxes, _ = model.capturable(torch.rand(1, 3, 64, 64))
    # refpoint deltas and the box heads' last layers start at zero: every box is its proposal
    assert torch.allclose(boxes[:, -1], enc_boxes[:, 0]) and torch.allclose(enc_boxes[..., 2:], torch.tensor(0.05))


def test_ia_bce_by_hand():
    crit = RFDETRLoss(build("n", 2))
    logits = torch.tensor([[[[0.5, -1.0]]]])         # one query, two classes
    onehot = torch.tensor([[[[1.0, 0.0]]]])
    score = torch.tensor([[[[0.6, 0.0]]]])           # the pair's IoU
    p = logits.sigmoid()
    t = p[..., 0] ** 0.25 * 0.6 ** 0.75
    pos = -(t * torch.log(p[..., 0]) + (1 - t) * torch.log(1 - p[..., 0]))
    neg = p[..., 1] ** 2 * -torch.log(1 - p[..., 1])
    assert torch.allclose(crit.classification(logits, onehot, score).sum((1, 2, 3)), (pos + neg).flatten(), atol=1e-6)
    # a matched query whose box misses (IoU 0) still learns towards 0.01, not 0
    low = crit.classification(logits, onehot, torch.zeros_like(score))
    t = torch.tensor(0.01)
    pos = -(t * torch.log(p[..., 0]) + (1 - t) * torch.log(1 - p[..., 0]))
    assert torch.allclose(low.sum((1, 2, 3)), (pos + neg).flatten(), atol=1e-6)


def test_each_group_is_matched_and_the_loss_averages_the_groups():
    torch.manual_seed(0)
    model = build("n", 3).train()
    crit = REGISTRY["rfdetr"].criterion(model, None)
    assert crit.item_names == ("ia_bce", "l1", "giou")
    tg = random_targets(torch.Generator().manual_seed(1), 2, 8, 64, 3, [3, 2], min_wh=6.0)
    with torch.no_grad():
        out = model.forward_train(model.capturable(torch.rand(2, 3, 64, 64)), tg)
        sets = crit.output_sets(out)
        assert sets["dec"][0].shape == (2, 2 * 13, 16, 3) and sets["enc"][0].shape == (2, 13, 16, 3)
        # 13 identical groups -> the same loss as one group: the normaliser counts every group
        one = out._replace(logits=out.logits[:, :, :16].repeat(1, 1, 13, 1), boxes=out.boxes[:, :, :16].repeat(1, 1, 13, 1),
                           enc_logits=out.enc_logits[:, :1].repeat(1, 13, 1, 1),
                           enc_boxes=out.enc_boxes[:, :1].repeat(1, 13, 1, 1))
        single = out._replace(logits=out.logits[:, :, :16], boxes=out.boxes[:, :, :16],
                              enc_logits=out.enc_logits[:, :1], enc_boxes=out.enc_boxes[:, :1])
        assert torch.allclose(crit(one, tg)[1], crit(single, tg)[1], rtol=1e-5)


def _upstream_layout(vit) -> dict:
    """The ViT's weights keyed as a released RF-DETR checkpoint holds them (HF DINOv2 names)."""
    own, out = vit.state_dict(), {}
    out["embeddings.cls_token"] = own["cls_token"]
    out["embeddings.mask_token"] = torch.zeros(1, 384)
    out["embeddings.position_embeddings"] = own["pos_embed"]
    out["embeddings.patch_embeddings.projection.weight"] = own["patch_embed.weight"]
    out["embeddings.patch_embeddings.projection.bias"] = own["patch_embed.bias"]
    out["layernorm.weight"], out["layernorm.bias"] = own["norm.weight"], own["norm.bias"]
    for i in range(12):
        b, u = f"blocks.{i}.", f"encoder.layer.{i}."
        for kind in ("weight", "bias"):
            q, k, v = own[f"{b}attn.qkv.{kind}"].chunk(3)
            out[f"{u}attention.attention.query.{kind}"] = q
            out[f"{u}attention.attention.key.{kind}"] = k
            out[f"{u}attention.attention.value.{kind}"] = v
            out[f"{u}attention.output.dense.{kind}"] = own[f"{b}attn.proj.{kind}"]
            for part, ours in (("norm1", "norm1"), ("norm2", "norm2"), ("mlp.fc1", "fc1"), ("mlp.fc2", "fc2")):
                out[f"{u}{part}.{kind}"] = own[f"{b}{ours}.{kind}"]
        out[f"{u}layer_scale1.lambda1"], out[f"{u}layer_scale2.lambda1"] = own[f"{b}ls1"], own[f"{b}ls2"]
    state = {PREFIX + k: v.clone() for k, v in out.items()}
    state["class_embed.weight"] = torch.zeros(91, 256)  # the rest of the detector rides along
    return {"model": state, "args": argparse.Namespace(lr=1e-4, encoder="dinov2_windowed_small"), "epoch": 3}


def test_released_vit_weights_load_through_the_cache(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("LIBREYOLO_CACHE", str(tmp_path))
    torch.manual_seed(1)
    trained = build("n", 3)
    (tmp_path / "weights").mkdir()
    torch.save(_upstream_layout(trained.net.backbone), tmp_path / "weights" / BACKBONE_WEIGHTS["n"])
    torch.manual_seed(2)
    with caplog.at_level(logging.INFO, logger="libreyolo"):
        model = build_model(ModelSource(REGISTRY["rfdetr"], "n", None, None), 3, pretrained=fetch_weights)
    assert "released weights" in caplog.text
    got, want = model.net.backbone.state_dict(), trained.net.backbone.state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert not torch.equal(model.net.projector.c2f.cv1.conv.weight, trained.net.projector.c2f.cv1.conv.weight)
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        assert all(torch.equal(a, b) for a, b in zip(model.net.backbone(x), trained.net.backbone(x)))
    untouched = build_model(ModelSource(REGISTRY["rfdetr"], "n", None, None), 3)  # val/export never fetch
    assert not torch.equal(untouched.net.backbone.cls_token, trained.net.backbone.cls_token)


def test_offline_the_vit_trains_from_scratch_in_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("LIBREYOLO_CACHE", str(tmp_path))  # empty; the URL is a closed port (conftest.py)
    torch.manual_seed(0)
    model = build("s", 3)
    before = model.net.backbone.cls_token.clone()
    line = load_backbone(model, fetch_weights)
    assert "\n" not in line and "rf-detr-small.pth are not available" in line and line.endswith("random init")
    assert torch.equal(model.net.backbone.cls_token, before)
    assert not (tmp_path / "weights" / "rf-detr-small.pth").exists()


def test_weights_that_do_not_fit_are_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("LIBREYOLO_CACHE", str(tmp_path))
    (tmp_path / "weights").mkdir()
    path = tmp_path / "weights" / BACKBONE_WEIGHTS["n"]
    model = build("n", 3)
    # small's ViT has a 32 x 32 position grid: not nano's 24 x 24
    for state, said in ((_upstream_layout(build("s", 3).net.backbone), "does not fit RF-DETR-n"),
                        ({"model": {"a": 1}}, "no state dict of tensors")):
        torch.save(state, path)
        with pytest.raises(CheckpointError, match=said):
            load_backbone(model, fetch_weights)
    path.write_text("<html>not found</html>")
    with pytest.raises(CheckpointError, match="not a readable RF-DETR checkpoint"):
        load_backbone(model, fetch_weights)


def test_names_and_recipe():
    assert parse_official("LibreRFDETRn.pt") == (REGISTRY["rfdetr"], "n")
    assert parse_arch("rf-detr-small") == (REGISTRY["rfdetr"], "s") and parse_arch("RFDETR_nano") == (REGISTRY["rfdetr"], "n")
    sources = REGISTRY["rfdetr"].default_sources("m")
    assert sources["lr0"] == (1e-4, "rfdetr") and sources["backbone_lr"] == (1.5, "rfdetr")  # lr_encoder 1.5e-4
    assert sources["weight_decay"] == (1e-4, "rfdetr") and sources["epochs"] == (100, "rfdetr")
    assert sources["amp"] == (True, "rfdetr") and sources["imgsz"] == (576, "rfdetr-m")
    assert [REGISTRY["rfdetr"].defaults_for(s)["imgsz"] for s in ("n", "s")] == [384, 512]
    model = build("n", 3)
    assert model.arch.groups == 13 and REGISTRY["rfdetr"].backbone(model) is model.net.backbone
