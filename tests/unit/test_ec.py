"""EdgeCrafter's ECDet: published sizes, the captured region's layout, the ECViT weights through
the official weights' path (and the one line when they are not there), names and recipe.

Parameter counts are upstream's module for module (github:Intellindust-AI-Lab/EdgeCrafter, built
from ecdetseg/configs/ecdet/ecdet_{s,m}.yml with 80 classes: 9,884,102 and 19,431,502, of which
2 are its frozen `up`/`reg_scale` scalars, buffers here). The README rounds them to 10M and 18M
(the M figure is below its module's 19.4M); its GFLOPs, 26 and 53 at 640, are FlopCounterMode's
unit (2 per multiply-add).
"""

import logging

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from libreyolo.engine.builder import build_model
from libreyolo.errors import CheckpointError
from libreyolo.families import REGISTRY, parse_arch, parse_official
from libreyolo.families.ec.net import build
from libreyolo.families.ec.weights import BACKBONE_WEIGHTS, load_backbone
from libreyolo.resolve import ModelSource, fetch_weights

pytestmark = pytest.mark.usefixtures("one_thread")

PARAMS = {"s": 9_884_100, "m": 19_431_500}
GFLOPS = {"s": 26.0, "m": 53.0}  # EdgeCrafter README, 640 x 640


@pytest.mark.parametrize("size", ["s", "m"])
def test_size_matches_upstream(size):
    model = build(size, 80).eval()
    assert sum(p.numel() for p in model.parameters()) == PARAMS[size]
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model.predict(torch.rand(1, 3, 640, 640))
    assert counter.get_total_flops() / 1e9 == pytest.approx(GFLOPS[size], rel=0.05)


def test_captured_region_normalises_and_makes_three_levels():
    torch.manual_seed(0)
    model = build("s", 3).eval()
    assert model.strides == (8, 16, 32) and model.backbone is model.net.backbone
    x = torch.rand(2, 3, 64, 96)
    with torch.no_grad():
        maps = model.capturable(x)
        levels = model.net.backbone((x - model.net.mean) / model.net.std)
    assert [tuple(m.shape) for m in maps] == [(2, 192, 8, 12), (2, 192, 4, 6), (2, 192, 2, 3)]
    assert [tuple(m.shape) for m in levels] == [(2, 192, 8, 12), (2, 192, 4, 6), (2, 192, 2, 3)]
    assert model.decoder.static_query_pos and len(model.decoder.layers) == 4


def _upstream_layout(vit) -> dict:
    """The ViT's weights keyed as EdgeCrafter's release is (its VisionTransformer state dict)."""
    state = {k.replace(".bn.", ".norm.") if k.startswith("patch_embed.convs.") else k: v.clone()
             for k, v in vit.state_dict().items()}
    state["rope_embed.periods"] = 100.0 ** (torch.arange(16) / 16)  # base 100, head dim 64
    state["patch_embed.convs.0.norm.num_batches_tracked"] = torch.tensor(5)
    return state


def test_published_vit_weights_load_through_the_cache(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("LIBREYOLO_CACHE", str(tmp_path))
    torch.manual_seed(1)
    trained = build("s", 3)
    (tmp_path / "weights").mkdir()
    torch.save(_upstream_layout(trained.net.backbone.vit), tmp_path / "weights" / BACKBONE_WEIGHTS["s"])
    torch.manual_seed(2)
    with caplog.at_level(logging.INFO, logger="libreyolo"):
        model = build_model(ModelSource(REGISTRY["ec"], "s", None, None), 3, pretrained=fetch_weights)
    assert "distilled ECViT weights" in caplog.text
    got, want = model.net.backbone.vit.state_dict(), trained.net.backbone.vit.state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert not torch.equal(model.net.encoder.aifi.linear1.weight, trained.net.encoder.aifi.linear1.weight)
    # validation and export never fetch them: a checkpoint or a random model is what they measure
    untouched = build_model(ModelSource(REGISTRY["ec"], "s", None, None), 3)
    assert not torch.equal(untouched.net.backbone.vit.register_token, trained.net.backbone.vit.register_token)


def test_without_the_weights_the_vit_trains_from_scratch_in_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("LIBREYOLO_CACHE", str(tmp_path))  # empty; the URL is a closed port (conftest.py)
    torch.manual_seed(0)
    model = build("m", 3)
    before = model.net.backbone.vit.register_token.clone()
    line = load_backbone(model, fetch_weights)
    assert "\n" not in line and "ecvittplus.pth are not available" in line and line.endswith("random init")
    assert torch.equal(model.net.backbone.vit.register_token, before)
    assert not (tmp_path / "weights" / "ecvittplus.pth").exists()  # nothing half-written left


def test_weights_that_do_not_fit_are_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("LIBREYOLO_CACHE", str(tmp_path))
    (tmp_path / "weights").mkdir()
    path = tmp_path / "weights" / BACKBONE_WEIGHTS["s"]
    model = build("s", 3)
    m_state = _upstream_layout(build("m", 3).net.backbone.vit)
    for state, said in ((m_state, "does not fit ECDet-s"), ({**_upstream_layout(model.net.backbone.vit),
                        "rope_embed.periods": torch.ones(16)}, "RoPE periods"), ({"a": 1}, "state dict of tensors")):
        torch.save(state, path)
        with pytest.raises(CheckpointError, match=said):
            load_backbone(model, fetch_weights)
    path.write_text("<html>not found</html>")
    with pytest.raises(CheckpointError, match="not a readable state dict"):
        load_backbone(model, fetch_weights)


def test_names_and_recipe():
    assert parse_official("LibreECs.pt") == (REGISTRY["ec"], "s")
    assert parse_arch("ecdet-m") == (REGISTRY["ec"], "m") and parse_arch("EdgeCrafter_small") == (REGISTRY["ec"], "s")
    sources = REGISTRY["ec"].default_sources("s")
    assert sources["lr_schedule"] == ("flat_cosine", "deim") and sources["lr_flat"] == (0.485, "deim")
    assert sources["backbone_lr"] == (0.05, "ec") and sources["amp"] == (True, "ec")
    assert REGISTRY["ec"].criterion(build("s", 3), None).item_names == ("mal", "l1", "giou", "fgl", "ddf")
