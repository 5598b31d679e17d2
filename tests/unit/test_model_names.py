"""Model-name resolution (model.py's four rules): architecture spellings, one-line errors, official
weights downloaded once from a local http.server into $LIBREYOLO_CACHE, the offline fallback, and
weight transfer from a checkpoint file into a model with another class count."""

import functools
import http.server
import logging
import socket
import threading
from pathlib import Path

import pytest
import torch

from libreyolo.engine.builder import build_model
from libreyolo.engine.checkpoint import save_checkpoint
from libreyolo.errors import ModelNameError
from libreyolo.families import REGISTRY, get_family, weights_name
from libreyolo.model import LibreYOLO, resolve_model

NAMES = ["circle", "square", "triangle"]
STEM = "net.stem.0.conv.weight"  # a backbone tensor whose shape does not depend on the class count



def _make_checkpoint(path: Path, size: str = "t", family: str = "yolo9", **extra) -> dict:
    """A real LibreYOLO checkpoint; the stem weight is set to a constant so a transfer is
    recognisable (a fresh random init never equals it)."""
    state = get_family("yolo9").build("t", len(NAMES)).state_dict()
    state[STEM] = torch.full_like(state[STEM], 0.125)
    save_checkpoint(path, {"family": family, "size": size, "names": NAMES, "model": state, **extra})
    return state


@pytest.fixture
def libreyolo_log(caplog, monkeypatch):
    # The CLI turns propagation off on its logger; caplog listens at the root.
    monkeypatch.setattr(logging.getLogger("libreyolo"), "propagate", True)
    with caplog.at_level(logging.INFO, logger="libreyolo"):
        yield caplog


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("LIBREYOLO_CACHE", str(folder))
    monkeypatch.chdir(tmp_path)  # relative names must not meet stray files of the caller's cwd
    return folder


class _CountingHandler(http.server.SimpleHTTPRequestHandler):
    requests: list[str]

    def do_GET(self):
        self.requests.append(self.path)
        super().do_GET()

    def log_message(self, *args):
        pass


@pytest.fixture
def weights_server(tmp_path):
    """Serve tmp_path/www on an ephemeral port; yields (folder, base_url, requested paths)."""
    www = tmp_path / "www"
    www.mkdir()
    requests: list[str] = []
    handler = functools.partial(type("Handler", (_CountingHandler,), {"requests": requests}),
                                directory=str(www))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield www, f"http://127.0.0.1:{httpd.server_address[1]}", requests
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=5)


def _closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


@pytest.mark.parametrize("name,size", [("yolo9-t", "t"), ("YOLOv9-t", "t"), ("yolo9t", "t"),
                                       ("yolov9_tiny", "t"), ("YOLO9-S", "s"), ("yolov9 small", "s"),
                                       ("Yolo9_c", "c")])
def test_arch_names_resolve_case_insensitively(cache, name, size):
    source = resolve_model(name)
    assert source.spec.name == "yolo9"
    assert source.size == size
    assert source.arch == f"yolo9-{size}"
    assert source.checkpoint is None and source.path is None


@pytest.mark.parametrize("name", ["yolo9-x", "foo"])
def test_unknown_names_are_one_line_errors(cache, name):
    with pytest.raises(ModelNameError) as err:
        resolve_model(name)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith(f"unknown model '{name}': not a file, an official weights name")
    assert "LibreYOLO9s.pt" in msg and "yolo9-t" in msg


@pytest.mark.parametrize("name", ["", "   "])
def test_empty_name(name):
    with pytest.raises(ModelNameError, match="model name is empty"):
        resolve_model(name)


@pytest.mark.parametrize("name", ["missing.pt", "yolo9t.pt", "LibreYOLO9x.pt", "sub/run.pth"])
def test_absent_weights_file_is_not_an_architecture(cache, name):
    # An architecture is never guessed from a file name, not even 'yolo9t.pt'.
    with pytest.raises(ModelNameError) as err:
        resolve_model(name)
    assert str(err.value) == f"weights file '{name}' does not exist"


def test_official_name_downloads_once(cache, weights_server, monkeypatch):
    www, base, requests = weights_server
    _make_checkpoint(www / "LibreYOLO9t.pt")
    monkeypatch.setenv("LIBREYOLO_WEIGHTS_URL", base)

    source = resolve_model("LibreYOLO9t.pt")
    cached = cache / "weights" / "LibreYOLO9t.pt"
    assert requests == ["/LibreYOLO9t.pt"]
    assert source.path == cached and cached.is_file()
    assert (source.spec.name, source.size) == ("yolo9", "t")
    assert source.checkpoint["names"] == NAMES
    assert torch.equal(source.checkpoint["model"][STEM], torch.full_like(source.checkpoint["model"][STEM], 0.125))
    assert _files(cache) == ["weights/LibreYOLO9t.pt"]  # no temp file left beside it

    again = resolve_model("LibreYOLO9t.pt")
    assert requests == ["/LibreYOLO9t.pt"]  # served from the cache
    assert again.path == cached and again.checkpoint["names"] == NAMES


@pytest.mark.parametrize("where", ["closed port", "absent on server"])
def test_offline_builds_from_scratch_with_one_warning(cache, weights_server, libreyolo_log, monkeypatch, where):
    _, base, requests = weights_server
    monkeypatch.setenv("LIBREYOLO_WEIGHTS_URL", _closed_port_url() if where == "closed port" else base)

    source = resolve_model("LibreYOLO9t.pt")
    assert (source.spec.name, source.size) == ("yolo9", "t")
    assert source.checkpoint is None and source.path is None
    assert requests == ([] if where == "closed port" else ["/LibreYOLO9t.pt"])
    warnings = [r.getMessage() for r in libreyolo_log.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "\n" not in warnings[0]
    assert "LibreYOLO9t.pt" in warnings[0] and "from scratch" in warnings[0]
    assert _files(cache) == []  # nothing half-written in the cache


@pytest.mark.parametrize("family", sorted(REGISTRY))
def test_every_familys_official_name_downloads_from_the_weights_url(cache, weights_server, monkeypatch, family):
    """`<weights_prefix><size>.pt` of every family comes from $LIBREYOLO_WEIGHTS_URL, once, and
    resolves to that family and size (the checkpoint's tensors are the next test's business)."""
    www, base, requests = weights_server
    spec = REGISTRY[family]
    size = spec.sizes[0]
    name = weights_name(spec, size)
    save_checkpoint(www / name, {"family": family, "size": size, "names": NAMES, "model": {}})
    monkeypatch.setenv("LIBREYOLO_WEIGHTS_URL", base)
    source = resolve_model(name)
    assert requests == [f"/{name}"] and (source.spec, source.size) == (spec, size)
    assert source.path == cache / "weights" / name and source.checkpoint["names"] == NAMES


def test_yolonas_weights_download_and_fill_the_model(cache, weights_server, monkeypatch):
    """LibreYOLONASs.pt (the name LibreYOLO's released code gives YOLO-NAS S) from the local server
    builds YOLO-NAS S with exactly the served tensors."""
    www, base, requests = weights_server
    torch.manual_seed(0)
    state = get_family("yolonas").build("s", len(NAMES)).state_dict()
    key = "net.stem.conv3.weight"
    state[key] = torch.full_like(state[key], 0.125)
    save_checkpoint(www / "LibreYOLONASs.pt", {"family": "yolonas", "size": "s", "names": NAMES, "model": state})
    monkeypatch.setenv("LIBREYOLO_WEIGHTS_URL", base)
    model = build_model(resolve_model("LibreYOLONASs.pt"), len(NAMES), exact=True)
    assert requests == ["/LibreYOLONASs.pt"] and model.size == "s"
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


def test_checkpoint_file_resolves_to_its_family_and_size(tmp_path, cache):
    # The file name says nothing; the family and size come from inside the checkpoint.
    path = tmp_path / "whatever.pt"
    _make_checkpoint(path, size="t")
    for name in (str(path), "whatever.pt"):
        source = resolve_model(name)
        assert (source.spec.name, source.size) == ("yolo9", "t")
        assert source.path == Path(name) and source.checkpoint["names"] == NAMES


@pytest.mark.parametrize("family,size,match", [("yolo9", "x", "names size 'x' unknown to YOLOv9"),
                                               ("nosuch", "t", "unknown family 'nosuch'")])
def test_checkpoint_naming_unknown_arch(tmp_path, cache, family, size, match):
    path = tmp_path / "odd.pt"
    _make_checkpoint(path, size=size, family=family)
    with pytest.raises(ModelNameError, match=match) as err:
        resolve_model(str(path))
    assert "\n" not in str(err.value)


def test_build_with_another_class_count_transfers_matching_tensors(tmp_path, cache, libreyolo_log):
    path = tmp_path / "three.pt"
    saved = _make_checkpoint(path)
    model = build_model(LibreYOLO(str(path)).source, 5)
    state = model.state_dict()
    assert model.num_classes == 5
    assert torch.equal(state[STEM], saved[STEM])
    # The class head has another shape, so it starts fresh; every same-shape tensor was copied.
    changed = [k for k in saved if state[k].shape != saved[k].shape]
    assert changed and all(".cls." in k for k in changed)
    assert all(torch.equal(state[k], saved[k]) for k in saved if k not in changed)
    assert any("transferred" in r.getMessage() and str(path) in r.getMessage() for r in libreyolo_log.records)


def test_build_prefers_ema_weights(tmp_path, cache):
    path = tmp_path / "ema.pt"
    ema = get_family("yolo9").build("t", len(NAMES)).state_dict()
    ema[STEM] = torch.full_like(ema[STEM], -0.5)
    _make_checkpoint(path, ema=ema)
    state = build_model(LibreYOLO(str(path)).source, len(NAMES)).state_dict()
    assert torch.equal(state[STEM], ema[STEM])


def test_inference_args_prefer_the_user_then_the_checkpoints_training_arguments():
    from libreyolo.model import ModelSource, inference_args

    spec = get_family("yolo9")
    trained = ModelSource(spec, "t", {"config": {"imgsz": 128, "data": "shapes"}}, None)
    assert inference_args(trained, {}) == ({"imgsz": 128, "data": "shapes"},
                                           {"imgsz": "checkpoint", "data": "checkpoint"})
    assert inference_args(trained, {"imgsz": 320}) == ({"data": "shapes"}, {"imgsz": "given", "data": "checkpoint"})
    scratch = ModelSource(spec, "t", None, None)  # an architecture name: nothing to take
    assert inference_args(scratch, {"data": "coco128"}) == ({}, {"imgsz": "default", "data": "given"})
    old = ModelSource(spec, "t", {"names": ["a"]}, None)  # a checkpoint without its config
    assert inference_args(old, {}) == ({}, {"imgsz": "default", "data": "default"})


def test_val_refuses_a_checkpoint_that_does_not_fill_the_model(tmp_path, cache):
    """Same classes but another layout (a YOLOv9 checkpoint from the grouped box branch): val
    would measure a partly random model; it is one line instead."""
    from libreyolo.errors import CheckpointError

    path = tmp_path / "grouped.pt"
    state = get_family("yolo9").build("t", len(NAMES)).state_dict()
    state["net.head.box.0.2.weight"] = state["net.head.box.0.2.weight"][:, :16].clone()  # groups=4 shape
    _make_checkpoint(path, ema=state)
    with pytest.raises(CheckpointError) as err:
        build_model(LibreYOLO(str(path)).source, len(NAMES), exact=True)
    assert "\n" not in str(err.value) and "net.head.box.0.2.weight" in str(err.value)
    build_model(LibreYOLO(str(path)).source, len(NAMES))  # a fine-tune keeps what fits
