"""RT-DETR / RT-DETRv2 r18 (families/rtdetr): size against the published figures, the model
contract (capturable maps, DETROutput shapes with and without denoising, predict), the
ResNet-18-vd layout, RepVGG fusion, the v2 discrete sampling option and the specs."""

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from libreyolo.config import build_config
from libreyolo.families import REGISTRY, parse_arch, weights_name
from libreyolo.families.base import Targets
from libreyolo.families.rtdetr import build, build_v2
from libreyolo.families.rtdetr.net import BasicBlock, RepVGGBlock, RTDETRModel

pytestmark = pytest.mark.usefixtures("one_thread")

# Published (RT-DETR paper table 1 / the repos' READMEs, 640 px, COCO 80 classes): RT-DETR-R18
# 20M params, 60 GFLOPs; RT-DETRv2-S (r18) 20M, 60 GFLOPs. Measured here: 20.18M params; FLOPs
# (FlopCounterMode, 2 per multiply-add; grid_sample and norms not counted) 52.09G capturable +
# 9.40G decoder = 61.49G.
PUBLISHED = {"rtdetr": (20e6, 60.0), "rtdetrv2": (20e6, 60.0)}


@pytest.mark.parametrize("family", ["rtdetr", "rtdetrv2"])
def test_params_and_flops_match_published(family):
    with torch.device("meta"):  # shapes only: counts in a second, no weights allocated
        model = REGISTRY[family].build("r18", 80).eval()
        params = sum(p.numel() for p in model.parameters())
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model.forward_train(model.capturable(torch.zeros(1, 3, 640, 640)), None)
    want_params, want_gflops = PUBLISHED[family]
    assert abs(params / want_params - 1) < 0.05, params
    assert abs(counter.get_total_flops() / 1e9 / want_gflops - 1) < 0.05, counter.get_total_flops()


def _targets():
    boxes = torch.tensor([[[4.0, 4, 40, 30], [50, 10, 90, 60], [0, 0, 0, 0]],
                          [[10.0, 20, 30, 50], [0, 0, 0, 0], [0, 0, 0, 0]]])
    return Targets(boxes, torch.tensor([[1, 2, 0], [0, 0, 0]]), torch.tensor([[True, True, False], [True, False, False]]))


@pytest.mark.parametrize("builder", [build, build_v2])
def test_model_contract(builder):
    torch.manual_seed(0)
    model = builder("r18", 3).train()
    assert model.end_to_end and model.strides == (8, 16, 32) and model.num_classes == 3
    assert isinstance(model.backbone, nn.Module)
    x = torch.rand(2, 3, 64, 96)
    maps = model.capturable(x)
    assert [m.shape for m in maps] == [(2, 256, 64 // s, 96 // s) for s in (8, 16, 32)]
    q = sum((64 // s) * (96 // s) for s in (8, 16, 32))  # 126 tokens < 300 queries
    out = model.forward_train(maps, _targets())
    assert out.logits.shape == (2, 3, q, 3) and out.boxes.shape == (2, 3, q, 4)
    assert out.enc_logits.shape == (2, 1, q, 3) and out.enc_boxes.shape == (2, 1, q, 4)
    d = 2 * 2 * 50  # K = 2 boxes -> 50 groups of 2 positives + 2 negatives
    assert out.dn_logits.shape == (2, 3, d, 3) and out.dn_target.shape == (2, d)
    assert out.dn_groups.tolist() == [50.0, 50.0] and out.extra["input_wh"].tolist() == [[96.0, 64.0]] * 2
    assert ((out.boxes >= 0) & (out.boxes <= 1)).all()
    plain = model.forward_train(maps, None)
    assert plain.dn_logits.shape[2] == 0 and plain.dn_target.shape == (2, 0)
    model.eval()
    with torch.no_grad():
        pred = model.predict(x)
        assert torch.equal(model(x), pred)
    assert pred.shape == (2, q, 4 + 3) and pred.dtype == torch.float32 and torch.isfinite(pred).all()
    assert ((pred[..., 4:] >= 0) & (pred[..., 4:] <= 1)).all()
    assert (pred[..., 2] >= pred[..., 0]).all() and (pred[..., :4:2] <= 96 + 96).all()


def test_resnet18_vd_layout_and_trainable_norms():
    model = build("r18", 80)
    stem = model.backbone.stem
    assert [m.conv.out_channels for m in stem] == [32, 32, 64] and stem[0].conv.stride == (2, 2)
    blocks = [b for s in model.backbone.stages for b in s]
    assert all(isinstance(b, BasicBlock) for b in blocks) and len(blocks) == 8
    for stage in model.backbone.stages[1:]:  # downsampling blocks: avg-pool then 1x1 conv
        assert isinstance(stage[0].short[0], nn.AvgPool2d)
    norms = [m for m in model.backbone.modules() if isinstance(m, nn.BatchNorm2d)]
    assert norms and all(p.requires_grad for m in norms for p in m.parameters())  # not frozen


def test_repvgg_fuse_is_one_3x3_conv():
    torch.manual_seed(0)
    block = RepVGGBlock(8)
    for m in block.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.3, 0.3)
            m.running_var.uniform_(0.5, 1.5)
            nn.init.uniform_(m.weight, 0.5, 1.5)
    block.eval()
    x = torch.randn(2, 8, 9, 7)
    ref = block(x)
    block.fuse_()
    assert isinstance(block.conv, nn.Conv2d) and block.conv.kernel_size == (3, 3)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in block.modules())
    assert torch.allclose(block(x), ref, atol=1e-5)


def test_v2_discrete_sampling_runs_and_v1_differs_only_in_the_decoder():
    torch.manual_seed(0)
    model = type("RTDETRv2Discrete", (RTDETRModel,), {"version": "v2"})("r18", 3, cross_attn_method="discrete").train()
    out = model.forward_train(model.capturable(torch.rand(2, 3, 64, 64)), _targets())
    out.logits.sum().backward()
    assert all(not layer.cross_attn.sampling_offsets.weight.requires_grad for layer in model.decoder.layers)
    v1, v2 = build("r18", 3), build_v2("r18", 3)
    assert [k for k in v1.state_dict()] == [k for k in v2.state_dict()]
    assert v1.decoder.layers[0].clamp_fp16 and not v2.decoder.layers[0].clamp_fp16


def test_specs():
    v1, v2 = REGISTRY["rtdetr"], REGISTRY["rtdetrv2"]
    assert (v1.display, v2.display) == ("RT-DETR", "RT-DETRv2") and v1.sizes == v2.sizes == ("r18",)
    assert parse_arch("rtdetr-r18")[0] is v1 and parse_arch("rtdetrv2-r18")[0] is v2
    assert weights_name(v1, "r18") == "LibreRTDETRr18.pt" and weights_name(v2, "r18") == "LibreRTDETRv2r18.pt"
    assert v1.capture.region == v2.capture.region == "encoder"
    model = build("r18", 3)
    assert v1.backbone(model) is model.backbone
    for spec in (v1, v2):
        cfg = build_config({}, spec.defaults_for("r18"))
        assert (cfg.optimizer, cfg.lr0, cfg.clip_grad, cfg.nbs, cfg.multi_scale) == ("adamw", 1e-4, 0.1, 16, True)
    assert v1.defaults["backbone_lr"] == 0.1 and v2.defaults["backbone_lr"] == 1.0


def test_the_decoder_samples_the_unmasked_memory(monkeypatch):
    """Border cells whose anchor is invalid are zeroed for the proposals only (upstream's
    _get_decoder_input): the deformable cross-attention reads the encoder's own features."""
    torch.manual_seed(0)
    model = build("r18", 3).eval()
    seen = {}
    decode = type(model.decoder)._decode

    def spy(self, x, ref, memory, shapes, mask):
        seen["memory"] = memory
        return decode(self, x, ref, memory, shapes, mask)

    monkeypatch.setattr(type(model.decoder), "_decode", spy)
    with torch.no_grad():
        feats = model.net(torch.rand(1, 3, 512, 512))  # stride 8: 64 x 64 cells, the outer ring invalid
        model.forward_train(feats, None)
    whole = torch.cat([f.flatten(2).transpose(1, 2) for f in feats], 1)
    _, valid = model.decoder.anchors([tuple(f.shape[2:]) for f in feats], whole)
    assert not valid.all() and torch.equal(seen["memory"], whole)  # invalid cells exist, and are kept
