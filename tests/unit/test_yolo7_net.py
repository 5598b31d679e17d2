"""YOLOv7 network: published size figures, the row layout and decode, the contract, deploy fusion
(RepConv and implicit layers), the spec and its recipe, the official weights names."""

import functools
import http.server
import math
import threading

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from libreyolo.engine.checkpoint import save_checkpoint
from libreyolo.engine.optim import param_groups
from libreyolo.families import get_family, parse_arch, parse_official
from libreyolo.families.yolo7 import ARCHS, build
from libreyolo.families.yolo7.net import ImplicitConv, rows
from libreyolo.families.yolo7.spec import SPEC
from libreyolo.families.yolo9.net import RepConvN
from libreyolo.resolve import resolve_model

pytestmark = pytest.mark.usefixtures("one_thread")

# Published (paper, tables 1 and 2; 640 px, 80 classes): params, GFLOPs of YOLOv7-tiny(-SiLU) and
# YOLOv7. They count the deploy form; the authors' detect.py prints the parameters of the fused
# yolov7-tiny.pt and yolov7.pt as 6,219,709 and 36,905,341 ("Model Summary" after "Fusing
# layers"), which this network reproduces exactly. GFLOPs there are thop MACs x 2 of convs;
# FlopCounterMode counts 2 x MACs of convs too. Measured: t 13.70, b 104.51 (the authors' summary
# of yolov7.pt prints 104.5).
PUBLISHED = {"t": (6.2e6, 13.8), "b": (36.9e6, 104.7)}
AUTHORS_FUSED_PARAMS = {"t": 6_219_709, "b": 36_905_341}
TRAINING_PARAMS = {"t": 6_228_762, "b": 37_622_682}  # unfused: BN affine, RepConv 1x1s, implicit


def _gflops_at_640(model) -> float:
    # Counted at 64 px and scaled by (640 / 64)^2, as the authors' model_info counts at one size
    # and scales: every conv's output has (px / stride)^2 cells at both sizes, so the scale is exact.
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model.capturable(torch.zeros(1, 3, 64, 64))
    return counter.get_total_flops() * 100 / 1e9


@pytest.mark.parametrize("size", SPEC.sizes)
def test_params_and_gflops_match_published(size):
    torch.manual_seed(0)
    model = build(size, 80).eval()
    assert sum(p.numel() for p in model.parameters()) == TRAINING_PARAMS[size]
    model.fuse()
    params = sum(p.numel() for p in model.parameters())
    want_params, want_gflops = PUBLISHED[size]
    assert params == AUTHORS_FUSED_PARAMS[size]
    assert abs(params / want_params - 1) < 0.01
    assert abs(_gflops_at_640(model) / want_gflops - 1) < 0.01


def test_sizes_match_registry():
    assert tuple(ARCHS) == SPEC.sizes == ("t", "b")


def _maps(b=1, nc=2, shapes=((8, 8), (4, 4), (2, 2))):
    """Raw head maps whose every value names its place: 1000 level + 100 anchor + 10 channel + x."""
    a = torch.arange(3.0).view(1, 3, 1, 1, 1)
    c = torch.arange(5.0 + nc).view(1, 1, -1, 1, 1)
    out = []
    for lv, (h, w) in enumerate(shapes):
        value = 1000 * lv + 100 * a + 10 * c + torch.arange(w).view(1, 1, 1, 1, w)
        out.append(value.expand(b, 3, 5 + nc, h, w).flatten(1, 2))
    return tuple(out)


def test_rows_are_level_anchor_y_x_and_decode_as_idetect():
    model = build("t", 2)
    maps = _maps()
    x = rows(maps)
    assert x.shape == (1, 3 * (64 + 16 + 4), 7) and x.is_contiguous()
    layout = model.layouts(maps)
    # Row 64 + 8 * 5 + 3: level 0, anchor 1, y 5, x 3; the next level starts at 3 * 64.
    assert x[0, 64 + 8 * 5 + 3].tolist() == [100 + 10 * c + 3 for c in range(7)]
    assert x[0, 192 + 16 * 2 + 4 * 1 + 2, 0] == 1000 + 200 + 2
    assert layout.cells[64 + 8 * 5 + 3].tolist() == [3.0, 5.0] and layout.strides[192, 0] == 16
    assert layout.anchors[64].tolist() == [16.0, 30.0] and layout.anchors[-1].tolist() == [373.0, 326.0]
    assert [lv.start for lv in layout.levels] == [0, 192, 240]
    # Zero logits: centre of the cell (2 * 0.5 - 0.5 + cell), the anchor's own size.
    boxes = layout.decode(torch.zeros(1, x.shape[1], 4))
    assert boxes[0, 64 + 8 * 5 + 3].tolist() == [3.5 * 8 - 8, 5.5 * 8 - 15, 3.5 * 8 + 8, 5.5 * 8 + 15]
    # Saturated logits: the centre moves 1.5 cells at most, the size reaches 4 x the anchor.
    big = layout.decode(torch.full((1, x.shape[1], 4), 30.0))
    assert big[0, 0].tolist() == pytest.approx([1.5 * 8 - 20, 1.5 * 8 - 26, 1.5 * 8 + 20, 1.5 * 8 + 26])


@pytest.mark.parametrize("nc", [1, 3])
def test_contract_and_predict(nc):
    torch.manual_seed(0)
    model = build("t", nc)
    assert model.num_classes == nc and model.strides == (8, 16, 32) and model.rows_per_cell == 3
    x = torch.rand(2, 3, 64, 96)
    out = model.train().capturable(x)
    assert isinstance(out, tuple) and [o.shape for o in out] == [(2, 3 * (5 + nc), 64 // s, 96 // s) for s in (8, 16, 32)]
    assert model.forward_train(out, None) is out
    model.eval()
    with torch.no_grad():
        pred = model.predict(x)
        assert torch.equal(model(x), pred)
        raw = rows(model.capturable(x))
    assert pred.shape == (2, 3 * (8 * 12 + 4 * 6 + 2 * 3), 4 + nc) and torch.isfinite(pred).all()
    boxes, scores = pred[..., :4], pred[..., 4:]
    assert (boxes[..., 2:] > boxes[..., :2]).all() and (scores >= 0).all() and (scores <= 1).all()
    obj = raw[..., 4:5].sigmoid()
    # One class: scored by objectness alone (the authors' NMS); else objectness x class.
    assert torch.allclose(scores, obj if nc == 1 else obj * raw[..., 5:].sigmoid())


def test_head_bias_starts_at_the_authors_priors():
    model = build("b", 7)
    for level, s, c_in in zip(model.net.head.m, (8, 16, 32), (256, 512, 1024)):
        bias = level.conv.bias.view(3, 12)
        bound = 1 / math.sqrt(c_in)  # torch's default init, which the priors are added to
        assert (bias[:, 4] - math.log(8 / (640 / s) ** 2)).abs().max() <= bound
        assert (bias[:, 5:] - math.log(0.6 / (7 - 0.99))).abs().max() <= bound


def _perturb(model):
    """Non-trivial BN statistics and implicit layers, so the folds are exercised."""
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 1.5)
            torch.nn.init.uniform_(m.weight, 0.5, 1.5)
            torch.nn.init.uniform_(m.bias, -0.2, 0.2)
        if isinstance(m, ImplicitConv):
            m.add.data.uniform_(-0.5, 0.5)
            m.mul.data.uniform_(0.5, 1.5)


def test_fused_base_model_equals_the_trained_form():
    """RepConv (3x3 + 1x1 branches) merged, BatchNorm and ImplicitA/M folded: same outputs."""
    torch.manual_seed(0)
    model = build("b", 3)
    with torch.no_grad():
        _perturb(model)
    model.eval()
    x = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        ref_maps, ref = model.capturable(x), model.predict(x)
        model.fuse()
        got_maps, got = model.capturable(x), model.predict(x)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
    assert all(m.fused is not None for m in model.modules() if isinstance(m, RepConvN))
    assert all(m.add is None and m.mul is None for m in model.modules() if isinstance(m, ImplicitConv))
    for r, g in zip(ref_maps, got_maps):
        assert torch.allclose(r, g, atol=1e-4, rtol=1e-4)
    assert (got[..., :4] - ref[..., :4]).abs().max() < 1e-3  # pixels
    assert (got[..., 4:] - ref[..., 4:]).abs().max() < 1e-5


def test_implicit_layers_train_without_weight_decay():
    # The authors' optimizer puts every implicit into its no-decay group.
    model = build("t", 3)
    groups = {name: {id(p) for p in params} for name, params in param_groups(model).items()}
    for m in model.modules():
        if isinstance(m, ImplicitConv):
            assert id(m.add) in groups["norm"] and id(m.mul) in groups["norm"]
            assert id(m.conv.weight) in groups["weights"] and id(m.conv.bias) in groups["bias"]


def test_spec_names_and_recipe():
    assert get_family("yolov7") is SPEC and get_family("yolo7") is SPEC
    assert SPEC.weights_prefix == "LibreYOLO7" and SPEC.capture.region == "network"
    assert parse_arch("YOLOv7-tiny") == (SPEC, "t") and parse_arch("yolov7_base") == (SPEC, "b")
    assert parse_arch("yolo7b") == (SPEC, "b")
    assert parse_official("LibreYOLO7b.pt") == (SPEC, "b") and parse_official("LibreYOLO7t.pt") == (SPEC, "t")
    base, tiny = SPEC.defaults_for("b"), SPEC.defaults_for("t")
    # hyp.scratch.p5.yaml and hyp.scratch.tiny.yaml where they differ from each other.
    assert (base["cls"], base["lrf"], base["translate"], base["scale"], base["mixup"]) == (0.3, 0.1, 0.2, 0.9, 0.15)
    assert (tiny["cls"], tiny["mixup"], tiny["box"], tiny["optimizer"]) == (0.5, 0.05, 0.05, "sgd")
    assert set(SPEC.long_run).isdisjoint({"box", "cls"})  # the loss's own gains apply in every run
    assert SPEC.criterion(build("t", 2), None).item_names == ("box", "obj", "cls")


class _Handler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def weights_server(tmp_path, monkeypatch):
    """tmp_path/www served on 127.0.0.1 as $LIBREYOLO_WEIGHTS_URL, an empty cache."""
    www = tmp_path / "www"
    www.mkdir()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Handler, directory=str(www)))
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    monkeypatch.setenv("LIBREYOLO_WEIGHTS_URL", f"http://127.0.0.1:{httpd.server_address[1]}")
    monkeypatch.setenv("LIBREYOLO_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    yield www
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=5)


@pytest.mark.parametrize("size", SPEC.sizes)
def test_official_weights_names_download_through_the_weights_url(weights_server, tmp_path, size):
    # The download code checks that the file is a LibreYOLO checkpoint; the tiny network's weights
    # stand in for both sizes (writing the base one's 150 MB would be the test's whole cost).
    state = build("t", 3).state_dict()
    save_checkpoint(weights_server / f"LibreYOLO7{size}.pt",
                    {"family": "yolo7", "size": size, "names": ["a", "b", "c"], "model": state})
    source = resolve_model(f"LibreYOLO7{size}.pt")
    assert (source.spec, source.size) == (SPEC, size) and source.arch == f"yolo7-{size}"
    assert source.path == tmp_path / "cache" / "weights" / f"LibreYOLO7{size}.pt" and source.path.is_file()
    assert source.checkpoint["names"] == ["a", "b", "c"]
