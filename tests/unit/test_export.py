"""Export (libreyolo/export.py): every registered family to ONNX, run in onnxruntime at another batch
than the export's and compared with the PyTorch model; pt2 round trips; the metadata; one-line
refusals before any work; a failed check writes nothing.

Sizes are the smallest (64 px, the smallest size of each family): the cost is the exporter's
graph conversion, about 2-12 s a family on a 2-core machine, whatever the image size.
"""

import json

import onnxruntime as ort
import pytest
import torch

from libreyolo import export
from libreyolo.errors import ConfigError
from libreyolo.export import TOLERANCE, ExportCheckError, export_model, read_metadata, sample_images
from libreyolo.families import REGISTRY
from libreyolo.names import arch_name
from libreyolo.tasks import task_for

pytestmark = pytest.mark.usefixtures("one_thread")

SEED = 7


def _export(arch: str, **kw):
    """export_model with seeded random weights: `_reference(arch)` rebuilds the same model."""
    torch.manual_seed(SEED)
    return export_model(arch, imgsz=64, **kw)


def _reference(arch: str, images: torch.Tensor) -> torch.Tensor:
    from libreyolo.model import resolve_model

    source = resolve_model(arch)
    torch.manual_seed(SEED)
    model = source.spec.build(source.size, task_for(source.spec, None).default_classes).eval()
    with torch.no_grad():
        return model.predict(images)


def _assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape
    if got.ndim == 3:
        assert (got[..., :4] - want[..., :4]).abs().max() <= TOLERANCE["boxes"]
        assert (got[..., 4:] - want[..., 4:]).abs().max() <= TOLERANCE["scores"]
    else:
        assert (got - want).abs().max() <= TOLERANCE["probs"]


# The batch axis is the exporter's, not the family's: one detector and one classifier export it
# dynamic (15-40 % more export time each), the others static (CPU suite time).
DYNAMIC = {"yolox", "resnet"}


# One family per network module: the families a module builds (RT-DETR and RT-DETRv2; D-FINE, DEIM
# and RT-DETRv4) export the same operators, so the first registered stands for them.
NETWORKS = list({spec.build.__module__: name for name, spec in reversed(list(REGISTRY.items()))}.values())[::-1]


@pytest.mark.parametrize("family", NETWORKS)
def test_every_family_exports_to_onnx(family, tmp_path, capfd):
    spec = REGISTRY[family]
    arch = arch_name(spec, spec.sizes[0])
    task = task_for(spec, None)
    dynamic = family in DYNAMIC
    result = _export(arch, dynamic=dynamic, output=tmp_path)
    assert capfd.readouterr().out == ""  # the exporters print nothing on stdout: it is the CLI's result
    assert result.path == tmp_path / f"{arch}.onnx"
    # One file: the weights inside it (no .onnx.data), no temporary file left.
    assert [p.name for p in tmp_path.iterdir()] == [f"{arch}.onnx"]
    assert result.size_bytes == result.path.stat().st_size
    assert (result.format, result.task, result.imgsz, result.opset) == ("onnx", task.name, 64, 20)
    assert result.input_shape == ["batch" if dynamic else 1, 3, 64, 64]
    assert result.checked_batches == ([1, 2] if dynamic else [1])
    assert set(result.max_abs_diff) == ({"boxes", "scores"} if task.name == "detect" else {"probs"})
    assert all(0 <= d <= TOLERANCE[k] for k, d in result.max_abs_diff.items())
    json.dumps(result.to_dict())  # --json prints it

    session = ort.InferenceSession(str(result.path), providers=["CPUExecutionProvider"])
    [given] = session.get_inputs()
    assert given.name == "images" and given.shape[1:] == [3, 64, 64]
    assert isinstance(given.shape[0], str) if dynamic else given.shape[0] == 1
    meta = session.get_modelmeta().custom_metadata_map
    nc = task.default_classes
    assert meta["task"] == task.name and meta["family"] == family and meta["arch"] == arch
    model = spec.build(spec.sizes[0], 1)
    stride = max(getattr(model, "strides", (32,)))  # a classifier: the multiple its imgsz must be
    assert (meta["imgsz"], meta["stride"]) == ("64", str(stride)) and json.loads(meta["names"]) == [f"class{i}" for i in range(nc)]
    assert "[0, 1]" in meta["input"] and meta["libreyolo"] and meta["postprocess"]
    n = 3 if dynamic else 1  # dynamic: a batch size the export did not check
    images = sample_images(task, 64, n)
    out = torch.from_numpy(session.run(None, {"images": images.numpy()})[0])
    want = _reference(arch, images)
    cells = sum((64 // s) ** 2 for s in getattr(model, "strides", ())) * getattr(model, "rows_per_cell", 1)
    rows = min(300, cells) if getattr(model, "end_to_end", False) else cells  # a DETR: one row per query
    assert ("no NMS needed" in meta["postprocess"]) == getattr(model, "end_to_end", False)
    shapes = {"detect": (n, rows, 4 + nc), "classify": (n, nc), "points": (n, 1 + nc, 64 // stride, 64 // stride),
              "segment": (n, nc, 64, 64)}
    assert want.shape == shapes[task.name]
    _assert_close(out, want)


@pytest.mark.parametrize("arch, dynamic", [("rtmdet-t", False), ("resnet18", True)])
def test_pt2_round_trip(arch, dynamic, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = _export(arch, format="pt2", batch=2, dynamic=dynamic)
    assert result.path.resolve() == tmp_path / f"{arch}.pt2" and result.path.is_file() and result.opset is None
    assert result.checked_batches == ([2, 1] if dynamic else [2])
    assert [p.name for p in tmp_path.iterdir()] == [f"{arch}.pt2"]
    meta = read_metadata(result.path)
    assert meta["arch"] == arch and meta["imgsz"] == "64"
    program = torch.export.load(str(result.path))
    [given] = [n.meta["val"] for n in program.graph.nodes if n.op == "placeholder" and n.name == "images"]
    assert isinstance(given.shape[0], torch.SymInt) == dynamic and tuple(given.shape[1:]) == (3, 64, 64)
    images = sample_images(task_for(REGISTRY[meta["family"]], None), 64, 3 if dynamic else 2)
    with torch.no_grad():
        _assert_close(program.module()(images), _reference(arch, images))


def test_a_failed_check_writes_nothing(tmp_path, monkeypatch):
    """The check runs on the temporary file: refused, it is removed, and so is the folder made for it."""
    monkeypatch.setitem(export.TOLERANCE, "probs", -1.0)  # any difference fails, even none
    with pytest.raises(ExportCheckError) as err:
        _export("resnet18", output=tmp_path / "new" / "r.onnx")
    line = str(err.value)
    assert "\n" not in line and line.startswith("export check failed") and "nothing was written" in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kw, said", [
    ({"format": "tflite"}, "unknown export format 'tflite' (formats: onnx, pt2)"),
    ({"imgsz": 100}, "imgsz=100 is not a multiple of 32, the largest stride of yolo9-t: use 96 or 128"),
    ({"imgsz": 16}, "imgsz=16 is not a multiple of 32, the largest stride of yolo9-t: use 32"),
    ({"imgsz": 0}, "bad value for 'imgsz': 0"),
    ({"batch": 0}, "bad value for 'batch': 0 (allowed: an int >= 1)"),
    ({"dynamic": "yes"}, "bad value for 'dynamic'"),
    ({"opset": 12}, "bad value for 'opset': 12 (allowed: an int >= 18"),
    ({"opset": 18, "format": "pt2"}, "opset applies to format=onnx only"),
    ({"device": "cuda"}, "an ONNX file holds no device"),
    ({"format": "pt2", "device": "0,1"}, "export runs on one device"),
    ({"imgz": 64}, "unknown key 'imgz' (did you mean 'imgsz'?)"),
    ({"output": "ckpt.pt"}, "is the checkpoint itself"),
    ({"output": "m.pt2"}, "output=m.pt2 names a .pt2 file but format=onnx writes .onnx: name it m.onnx, or pass "
                          "format=pt2"),
])
def test_bad_requests_are_one_line_and_write_nothing(kw, said, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = "yolo9-t"
    if kw.get("output") == "ckpt.pt":
        from libreyolo.engine.checkpoint import save_checkpoint

        save_checkpoint("ckpt.pt", {"family": "resnet", "size": "18", "names": ["a", "b"],
                                    "model": REGISTRY["resnet"].build("18", 2).state_dict()})
        model = "ckpt.pt"
    before = sorted(tmp_path.iterdir())
    with pytest.raises(ConfigError) as err:
        export_model(model, **kw)
    assert said in str(err.value) and "\n" not in str(err.value)
    assert sorted(tmp_path.iterdir()) == before


def test_missing_packages_are_named_before_torch_work(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxscript" else real(name, *a))
    with pytest.raises(ConfigError) as err:
        export_model("yolo9-t")
    assert str(err.value) == ("export format=onnx needs onnx, onnxscript and onnxruntime (missing: onnxscript): "
                              "pip install 'libreyolo[export]'")
