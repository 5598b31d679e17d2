"""SegFormer-B0 as published (NVlabs/SegFormer mit_b0 + SegFormerHead, paper Table 6): the encoder's
constants, the stochastic-depth rule, the stage strides, the decoder, the recipe's two learning
rates through the backbone hook, and the graph note."""

import pytest
import torch
from torch import nn
from torchvision.ops import StochasticDepth

from libreyolo.config import build_config
from libreyolo.engine.optim import build_optimizer
from libreyolo.engine.schedule import LRSchedule
from libreyolo.families import REGISTRY
from libreyolo.families.segformer.net import Block, EfficientAttention, OverlapPatchEmbed

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return REGISTRY["segformer"].build("b0", 150)


def test_encoder_constants_are_mit_b0s(model):
    stages = model.backbone.stages
    assert [s.embed.proj.out_channels for s in stages] == [32, 64, 160, 256]
    assert [len(s.blocks) for s in stages] == [2, 2, 2, 2]
    assert [(s.embed.proj.kernel_size, s.embed.proj.stride, s.embed.proj.padding) for s in stages] == [
        ((7, 7), (4, 4), (3, 3)), ((3, 3), (2, 2), (1, 1)), ((3, 3), (2, 2), (1, 1)), ((3, 3), (2, 2), (1, 1))]
    attn = [s.blocks[0].attn for s in stages]
    assert [a.heads for a in attn] == [1, 2, 5, 8] and [a.sr_ratio for a in attn] == [8, 4, 2, 1]
    assert [a.sr.kernel_size for a in attn[:3]] == [(8, 8), (4, 4), (2, 2)] and not hasattr(attn[3], "sr")
    assert all(a.q.bias is not None and a.kv.bias is not None for a in attn)  # qkv_bias=True
    mlp = stages[2].blocks[0].mlp
    assert (mlp.fc1.out_features, mlp.dwconv.kernel_size, mlp.dwconv.groups) == (640, (3, 3), 640)
    assert isinstance(mlp.act, nn.GELU)
    blocks = [m for m in model.modules() if isinstance(m, Block)]
    assert all(b.norm1.eps == b.norm2.eps == 1e-6 for b in blocks) and all(s.norm.eps == 1e-6 for s in stages)
    embeds = [m for m in model.modules() if isinstance(m, OverlapPatchEmbed)]
    reduced = [m for m in model.modules() if isinstance(m, EfficientAttention) and m.sr_ratio > 1]
    assert all(m.norm.eps == 1e-5 for m in embeds + reduced)  # torch's default there, as the authors'


def test_drop_path_rises_linearly_to_0_1_per_image(model):
    paths = [m for m in model.modules() if isinstance(m, StochasticDepth)]
    assert len(paths) == 8 and all(p.mode == "row" for p in paths)
    assert [p.p for p in paths] == pytest.approx(torch.linspace(0, 0.1, 8).tolist())


def test_stage_strides_and_the_decoder(model):
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        feats = model.backbone(x)
    assert [tuple(f.shape[1:]) for f in feats] == [(32, 16, 16), (64, 8, 8), (160, 4, 4), (256, 2, 2)]
    dec = model.net.net.decoder
    assert [lin.out_features for lin in dec.linears] == [256] * 4 and dec.fuse.in_channels == 1024
    assert isinstance(dec.dropout, nn.Dropout2d) and dec.dropout.p == 0.1
    assert dec.pred.out_channels == 150


def test_drop_path_and_dropout_are_off_in_eval_mode(model):
    x = torch.rand(2, 3, 64, 64)
    model.eval()
    with torch.no_grad():
        assert torch.equal(model.predict(x), model.predict(x))
    model.train()
    torch.manual_seed(1)
    with torch.no_grad():
        a, b = model.capturable(x)[0], model.capturable(x)[0]
    assert not torch.equal(a, b)  # training draws drop-path and dropout masks


def test_the_recipes_head_lr_x10_is_the_backbone_hook():
    """mmseg's `head: lr_mult 10` on lr 6e-5 == lr0 6e-4 with the encoder at backbone_lr 0.1."""
    spec = REGISTRY["segformer"]
    cfg = build_config({}, spec.defaults_for("b0"))
    assert (cfg.lr0, cfg.backbone_lr, cfg.optimizer, cfg.weight_decay) == (6e-4, 0.1, "adamw", 0.01)
    assert (cfg.lr_schedule, cfg.lr_power, cfg.lrf, cfg.warmup_iters, cfg.nbs, cfg.batch) == ("poly", 1.0, 0.0, 1500,
                                                                                            16, 16)
    model = spec.build("b0", 150)
    opt = build_optimizer(model, cfg, device_type="cpu", backbone=spec.backbone(model))
    sched = LRSchedule(opt, cfg, steps_per_epoch=2000)
    sched.step(1500)  # warmup done: epoch 0's target
    lrs = {g["name"]: g["lr"] for g in opt.param_groups}
    assert lrs["backbone.weights"] == pytest.approx(6e-5) and lrs["weights"] == pytest.approx(6e-4)
    assert spec.backbone(model) is model.net.net.encoder
    encoder = {id(p) for p in model.net.net.encoder.parameters()}
    decoder = [p for p in model.parameters() if id(p) not in encoder]
    assert decoder and all(id(p) not in encoder for p in model.net.net.decoder.parameters())
    assert opt.param_groups[0]["weight_decay"] == pytest.approx(0.01)  # batch 16 = nbs 16: unscaled


def test_the_graph_note_names_the_random_stream(model):
    note = model.graph_note
    assert "drop-path" in note and "statistically, not bitwise" in note
