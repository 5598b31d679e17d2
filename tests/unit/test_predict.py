"""predict: the same pixels and boxes as val, results in original pixels, options checked in one line."""

import json
import logging

import numpy as np
import pytest
import torch

from libreyolo.config import build_config
from libreyolo.data import load_data_config
from libreyolo.errors import ConfigError
from libreyolo.eval.coco import _Collector
from libreyolo.eval.postprocess import postprocess
from libreyolo.families import REGISTRY
from libreyolo.model import LibreYOLO, resolve_model
from libreyolo.names import arch_name
from libreyolo.predict.core import Predictor
from libreyolo.predict.graph import InferenceGraph
from libreyolo.predict.options import check_options
from libreyolo.predict.post import PostOptions
from libreyolo.tasks import get_task

pytestmark = pytest.mark.usefixtures("one_thread")


def _predictor(arch: str, names: list[str], imgsz: int, batch: int) -> Predictor:
    """A Predictor whose model has `names` classes and seeded random weights."""
    torch.manual_seed(0)
    predictor = Predictor(resolve_model(arch), imgsz=imgsz, batch=batch, device="cpu")
    source = resolve_model(arch)
    predictor.model = source.spec.build(source.size, len(names)).eval()
    predictor.names = names
    return predictor


def _frames(files):
    from libreyolo.predict.sources import open_source

    return list(open_source([str(f) for f in files]))


def test_val_and_predict_give_the_same_boxes_for_the_same_images():
    """What val scores (its loader, post-process and unletterbox) is what predict returns."""
    data = load_data_config("shapes")
    task = get_task("detect")
    predictor = _predictor("yolo9-t", list(data.names), 128, 4)
    cfg = build_config({"imgsz": 128, "batch": 4, "workers": 0})
    loader = task.val_loader(data, cfg)
    collector = _Collector()
    with torch.inference_mode():
        for batch in loader:
            preds = predictor.model.predict(batch.images.float() / 255)
            collector.add(batch, postprocess(preds, conf=0.0, iou=0.7, max_det=300, multi_label=True))
            break  # the first 4 images
    val = np.concatenate(collector.dets)
    frames = _frames(data.val[:4])
    results = [r for _, r in predictor.run(frames, PostOptions(conf=0.0, iou=0.7, max_det=300, multi_label=True))]
    assert [r.path for r in results] == [str(p) for p in data.val[:4]]
    for k, r in enumerate(results):
        mine = val[val[:, 0] == k + 1]
        assert len(r) == len(mine) > 0
        np.testing.assert_allclose(r.boxes.numpy(), mine[:, 1:5], atol=1e-3)
        np.testing.assert_allclose(r.scores.numpy(), mine[:, 5], rtol=1e-4, atol=1e-7)
        np.testing.assert_array_equal(r.classes.numpy(), mine[:, 6].astype(np.int64))
        h, w = r.orig_shape
        assert (r.boxes[:, [0, 2]] <= w).all() and (r.boxes[:, [1, 3]] <= h).all() and (r.boxes >= 0).all()


def test_classifier_predict_sees_the_pixels_val_sees():
    from libreyolo.data.classify import ClassValDataset, load_classify_data

    data = load_classify_data("shapes-cls")
    predictor = _predictor("resnet18", list(data.names), 64, 3)
    dataset = ClassValDataset(data.val[:3], 64)
    images = torch.stack([dataset[i][0] for i in range(3)])
    with torch.inference_mode():
        expected = predictor.model.predict(images.float() / 255)
    results = [r for _, r in predictor.run(_frames([p for p, _ in data.val[:3]]), PostOptions())]
    torch.testing.assert_close(torch.stack([r.probs for r in results]), expected, rtol=1e-4, atol=1e-6)
    line = results[0].to_dict()
    assert line["task"] == "classify" and line["name"] == data.names[line["class"]]
    assert [t["prob"] for t in line["top"]] == sorted((t["prob"] for t in line["top"]), reverse=True)


@pytest.mark.parametrize("name", list(REGISTRY))
def test_every_family_predicts_in_order_across_a_partial_last_batch(name):
    spec = REGISTRY[name]
    arch = arch_name(spec, spec.sizes[0])
    predictor = _predictor(arch, ["a", "b"], 64, 2)
    gen = torch.Generator().manual_seed(0)
    frames = [_Frame(torch.randint(0, 256, (3, 40 + 9 * i, 70), generator=gen, dtype=torch.uint8), f"img{i}")
              for i in range(3)]
    pairs = list(predictor.run(frames, PostOptions(conf=0.0)))
    assert [f.name for f, _ in pairs] == [r.name for _, r in pairs] == ["img0", "img1", "img2"]
    for f, r in pairs:
        assert r.orig_shape == tuple(f.image.shape[-2:])
        json.dumps(r.to_dict())  # a JSON line, whatever the task
        if r.task == "detect":
            assert len(r) > 0 and r.boxes.shape[1] == 4 and r.scores.dtype == torch.float32
        elif r.task == "segment":  # a class map at the image's own size
            assert r.mask.shape == f.image.shape[-2:] and int(r.mask.max()) < 2
        else:
            assert r.probs.shape == (2,) and abs(float(r.probs.sum()) - 1) < 1e-5


class _Frame:
    def __init__(self, image, name):
        self.image, self.name, self.path, self.frame = image, name, None, None


def test_summary_names_the_classes():
    predictor = _predictor("yolo9-t", ["circle", "square"], 64, 1)
    (_, r), = predictor.run([_Frame(torch.zeros(3, 64, 64, dtype=torch.uint8), "x")], PostOptions(conf=0.0, max_det=3))
    assert r.summary().startswith("3 detections (") and all(n in ("circle", "square") for n in
                                                            [d["name"] for d in r.to_dict()["detections"]])


@pytest.mark.parametrize("options, said", [
    ({"conf": 1.5}, "bad value for 'conf'"),
    ({"batch": 0}, "bad value for 'batch'"),
    ({"imgsz": 100}, "a multiple of 32"),
    ({"vid_stride": 0}, "bad value for 'vid_stride'"),
    ({"colour": 1}, "colour"),
    ({"amp_dtype": "int8"}, "amp_dtype"),
])
def test_bad_options_are_one_line(options, said):
    with pytest.raises(ConfigError, match=said) as err:
        check_options(options)
    assert "\n" not in str(err.value)


def test_predict_takes_one_device():
    with pytest.raises(ConfigError, match="one device"):
        Predictor(resolve_model("yolo9-t"), imgsz=64, device="0,1")


def test_cuda_graph_on_cpu_is_said_and_predicts_eager(caplog):
    with caplog.at_level(logging.INFO, logger="libreyolo"):
        predictor = Predictor(resolve_model("yolo9-t"), imgsz=64, device="cpu", cuda_graph=True)
    assert predictor.graph is None and "needs a CUDA device" in caplog.text
    graph = InferenceGraph(lambda x: x.float() * 2)
    out = graph(torch.ones(1, 3, 4, 4, dtype=torch.uint8))
    assert graph.fallback_reason == "needs a CUDA device" and graph.eager_calls == 1 and float(out.mean()) == 2


def test_a_family_that_cannot_be_captured_predicts_eager_with_one_line(caplog, monkeypatch):
    import dataclasses

    from libreyolo.families.base import CapturePlan

    source = resolve_model("yolo9-t")
    source.spec = dataclasses.replace(source.spec, capture=CapturePlan("none", "dynamic query count"))
    with caplog.at_level(logging.INFO, logger="libreyolo"):
        predictor = Predictor(source, imgsz=64, device="cpu", cuda_graph=True)
    assert predictor.graph is None and "cuda_graph=true ignored: dynamic query count" in caplog.text


def test_api_keeps_one_model_per_setting(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    lib = LibreYOLO("yolo9-t")
    image = np.zeros((48, 64, 3), np.uint8)
    first = lib.predict(image, imgsz=64, device="cpu")
    again = lib.predict([image, image], imgsz=64, device="cpu")
    assert len(first) == 1 and len(again) == 2 and len(lib._predictors) == 1
    lib.predict(image, imgsz=96, device="cpu")
    assert len(lib._predictors) == 1 and next(iter(lib._predictors))[0] == 96
    assert not (tmp_path / "runs").exists()  # Python's save default is false


def test_a_broken_file_in_a_folder_is_skipped_and_counted(tmp_path, caplog, monkeypatch):
    from torchvision.io import write_png

    monkeypatch.chdir(tmp_path)
    (tmp_path / "imgs").mkdir()
    write_png(torch.zeros(3, 30, 40, dtype=torch.uint8), str(tmp_path / "imgs" / "a.png"))
    (tmp_path / "imgs" / "b.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    with caplog.at_level(logging.WARNING, logger="libreyolo"):
        results = LibreYOLO("yolo9-t").predict("imgs", imgsz=64, device="cpu")
    assert [r.name for r in results] == ["a.png"]
    assert "cannot decode" in caplog.text and "b.png" in caplog.text
    assert "1 file(s) of the source could not be decoded" in caplog.text


def test_results_are_ordinary_tensors_the_user_may_edit():
    predictor = _predictor("yolo9-t", ["a", "b"], 64, 1)
    (_, r), = predictor.run([_Frame(torch.zeros(3, 64, 64, dtype=torch.uint8), "x")], PostOptions(conf=0.0, max_det=3))
    r.boxes[:, 0] += 1  # an inference tensor would refuse this outside inference mode
    assert not r.boxes.is_inference()


def test_a_folder_where_nothing_decodes_is_one_line(tmp_path, monkeypatch):
    from libreyolo.errors import DataError

    monkeypatch.chdir(tmp_path)
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "b.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    with pytest.raises(DataError, match="none of the 1 image file"):
        LibreYOLO("yolo9-t").predict("imgs", imgsz=64, device="cpu", save=True)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("options", [{"conf": None}, {"save": "false"}, {"iou": True}])
def test_python_options_of_the_wrong_type_are_one_line(options):
    with pytest.raises(ConfigError, match="bad value"):
        check_options(options)
