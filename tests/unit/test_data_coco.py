"""COCO-json datasets: both ways in, ids kept, iscrowd, backgrounds, errors, the same mAP as the
YOLO form, COCO results files read by faster-coco-eval (and pycocotools where installed), convert."""

import json
import shutil

import numpy as np
import pytest
import torch
from coco_kit import CATEGORY_IDS, NAMES, SLOTS, H, W, spec, write_coco, write_yolo
from torch import nn

from libreyolo.config import build_config
from libreyolo.data import build_train_loader, build_val_loader, load_data_config
from libreyolo.data.convert import convert
from libreyolo.errors import DataError
from libreyolo.eval import evaluate

IMGSZ = 64


class SlotModel(nn.Module):
    """Predicts every slot with a score per class that depends on the image's mean pixel: fixed,
    deterministic, and right only some of the time."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(()))
        r = IMGSZ / max(H, W)
        top = (IMGSZ - round(H * r)) / 2
        self.boxes = torch.tensor([[x1 * r, y1 * r + top, x2 * r, y2 * r + top] for x1, y1, x2, y2 in SLOTS])

    def predict(self, images):
        m = images.float().mean(dim=(1, 2, 3))  # [B]
        slot = torch.arange(len(SLOTS)).float()[None, :, None]
        cls = torch.arange(len(NAMES)).float()[None, None, :]
        scores = torch.frac(m[:, None, None] * 7.3 + slot * 0.37 + cls * 0.61) * 0.9 + 0.05
        return torch.cat([self.boxes.expand(len(images), -1, -1), scores], -1)


def _cfg():
    return build_config({"model": "yolo9-t", "imgsz": IMGSZ, "batch": 4, "workers": 0, "cache": False})


def _map(data, **kw):
    loader = build_val_loader(load_data_config(data), _cfg())
    return evaluate(SlotModel(), loader, "cpu", progress=False, **kw), loader


@pytest.fixture
def both(tmp_path):
    return write_yolo(tmp_path / "yolo"), write_coco(tmp_path / "coco")


def test_both_ways_in_read_the_same_dataset_with_the_json_ids(tmp_path, both):
    _, val_json = both
    root = tmp_path / "coco"
    (tmp_path / "c.yaml").write_text(f"path: {root}\ntrain: {{images: train, annotations: annotations/instances_train.json}}\n"
                                     "val: {images: val, annotations: annotations/instances_val.json}\n")
    by_json, by_yaml = load_data_config(str(val_json)), load_data_config(str(tmp_path / "c.yaml"))
    for cfg in (by_json, by_yaml):
        assert cfg.names == NAMES and cfg.category_ids == CATEGORY_IDS  # sorted by id, whatever the json's order
        assert [p.name for p in cfg.train] == [f"train{i}.jpg" for i in range(6)]
        assert cfg.annotations["val"].image_ids == [1000 + 10 * i for i in range(6)]
    loader = build_val_loader(by_json, _cfg())
    assert loader.image_ids == [1000 + 10 * i for i in range(6)] and loader.category_ids == CATEGORY_IDS
    labels = loader.dataset.split.labels
    assert len(labels[-1]) == 0  # an image without annotations is a background
    truth = spec()["val"]
    assert [len(lab) for lab in labels] == [len(objs) for objs in truth]
    assert [lab[:, 0].astype(int).tolist() for lab in labels] == [[c for _, c in objs] for objs in truth]


def test_iscrowd_is_not_trained_on_and_is_scored_as_coco_does(tmp_path):
    objects = spec()
    # a crowd region where the model predicts but no object is: without it, that detection is a
    # false positive; with it, COCO ignores the detection
    free = next((i, s) for i, objs in enumerate(objects["val"]) for s in range(4) if s not in [o[0] for o in objs])
    crowd = {"train": [(0, 3, 1)], "val": [(free[0], free[1], 0)]}
    plain = write_coco(tmp_path / "plain", objects)
    crowded = write_coco(tmp_path / "crowded", objects, crowd)
    train = build_train_loader(load_data_config(str(crowded)), _cfg()).dataset.split
    assert len(train.labels[0]) == len(objects["train"][0]) and len(train.crowd[0]) == 1
    with_crowd, loader = _map(crowded)
    without, _ = _map(plain)
    assert len(loader.crowd()[free[0]][0]) == 1
    assert with_crowd["map50"] > without["map50"] > 0


def test_the_same_data_in_both_forms_gives_the_same_map(both):
    yolo_yaml, coco_json = both
    yolo, _ = _map(str(yolo_yaml))
    coco, _ = _map(str(coco_json))
    assert 0.05 < yolo["map50_95"] < 0.95
    for key in ("map50_95", "map50", "precision", "recall", "num_dets"):
        assert coco[key] == pytest.approx(yolo[key], abs=1e-9), key
    assert [r["category_id"] for r in coco["per_class"]] == CATEGORY_IDS  # the json's own ids come back
    assert "category_id" not in yolo["per_class"][0]


def _external_map(gt_json, results_json, library):
    if library == "faster_coco_eval":
        from faster_coco_eval import COCO
        from faster_coco_eval import COCOeval_faster as Eval
    else:
        pytest.importorskip("pycocotools", reason="pycocotools is not installed")
        from pycocotools.coco import COCO
        from pycocotools.cocoeval import COCOeval as Eval
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(str(gt_json))
        dt = gt.loadRes(str(results_json))
        ev = Eval(gt, dt, "bbox")
        ev.evaluate(), ev.accumulate(), ev.summarize()
    return ev.stats[0], ev.stats[1]


@pytest.mark.parametrize("library", ["faster_coco_eval", "pycocotools"])
def test_saved_results_carry_the_original_ids_and_score_the_same_outside(tmp_path, library):
    objects = spec()
    free = next((i, s) for i, objs in enumerate(objects["val"]) for s in range(4) if s not in [o[0] for o in objs])
    gt_json = write_coco(tmp_path / "coco", objects, {"val": [(free[0], free[1], 2)]})
    out = tmp_path / "out" / "predictions.json"
    ours, _ = _map(str(gt_json), save_json=out)
    assert ours["saved_json"] == str(out)
    rows = json.loads(out.read_text())
    assert len(rows) == ours["num_dets"] > 0
    assert {r["image_id"] for r in rows} <= {1000 + 10 * i for i in range(6)}
    assert {r["category_id"] for r in rows} == set(CATEGORY_IDS)
    theirs = _external_map(gt_json, out, library)
    assert theirs == pytest.approx((ours["map50_95"], ours["map50"]), abs=1e-6)


def test_a_yolo_dataset_saves_class_plus_one_and_numbered_images(tmp_path, both):
    yolo_yaml, _ = both
    out = tmp_path / "p.json"
    _map(str(yolo_yaml), save_json=out)
    rows = json.loads(out.read_text())
    assert {r["category_id"] for r in rows} == {1, 2, 3} and {r["image_id"] for r in rows} == set(range(1, 7))


def test_convert_round_trip_keeps_boxes_and_map(tmp_path, both):
    yolo_yaml, coco_json = both
    to_coco = convert(str(yolo_yaml), "coco", tmp_path / "as_coco")
    back = convert(to_coco["data_yaml"], "yolo", tmp_path / "back")
    from_coco = convert(str(coco_json), "yolo", tmp_path / "from_coco")
    assert to_coco["splits"]["val"] == {"images": 6, "boxes": sum(map(len, spec()["val"])), "crowd": 0}
    reference, _ = _map(str(yolo_yaml))
    for data in (to_coco["data_yaml"], back["data_yaml"], from_coco["data_yaml"]):
        assert _map(data)[0]["map50_95"] == pytest.approx(reference["map50_95"], abs=1e-6), data
    doc = json.loads((tmp_path / "as_coco" / "annotations" / "instances_val.json").read_text())
    assert [c["id"] for c in doc["categories"]] == [1, 2, 3] and doc["images"][0]["width"] == W
    with pytest.raises(DataError, match="already exists"):
        convert(str(yolo_yaml), "coco", tmp_path / "as_coco")
    with pytest.raises(DataError, match="already COCO json"):
        convert(str(coco_json), "coco", tmp_path / "again")
    assert not (tmp_path / "again").exists()


def _mutate(path, fn):
    doc = json.loads(path.read_text())
    fn(doc)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("change, needle", [
    (lambda p: p.write_text('{"images": [1, 2'), r"not valid json \(line 1"),
    (lambda p: p.write_text("[]"), "expected a COCO object"),
    (lambda p: _mutate(p, lambda d: d.update(categories=[])), "'categories' must be a non-empty list"),
    (lambda p: _mutate(p, lambda d: d["annotations"][0].update(category_id=99)), "names category 99"),
    (lambda p: _mutate(p, lambda d: d["annotations"][0].update(image_id=5)), "names image 5"),
    (lambda p: _mutate(p, lambda d: d["annotations"][0].update(bbox=[1, 2, "x", 4])), "needs a bbox"),
    (lambda p: _mutate(p, lambda d: d["images"].append(dict(d["images"][0]))), "image id 1000 appears twice"),
    (lambda p: (p.parent.parent / "val" / "val2.jpg").unlink(), "1 of 6 images listed in instances_val.json are missing"),
    (lambda p: shutil.rmtree(p.parent.parent / "val"), "the images of instances_val.json not found"),
])
def test_bad_json_and_missing_images_are_one_line_errors(tmp_path, change, needle):
    val_json = write_coco(tmp_path / "coco")
    change(val_json)
    with pytest.raises(DataError, match=needle) as err:
        load_data_config(str(val_json))
    assert "\n" not in str(err.value)


def test_a_lone_val_json_validates_and_training_says_what_is_missing(tmp_path):
    val_json = write_coco(tmp_path / "coco")
    (val_json.parent / "instances_train.json").unlink()
    cfg = load_data_config(str(val_json))
    assert len(build_val_loader(cfg, _cfg())) > 0
    with pytest.raises(DataError, match="train: no train split for instances_val.json .expected instances_train.json"):
        build_train_loader(cfg, _cfg())


def test_zero_size_boxes_are_dropped_and_border_boxes_clipped(tmp_path, caplog):
    val_json = write_coco(tmp_path / "coco")
    _mutate(val_json, lambda d: (d["annotations"][0].update(bbox=[10, 10, 0, 5]),
                                 d["annotations"][1].update(bbox=[-10, -4, W + 30, H + 9])))
    cfg = load_data_config(str(val_json))
    assert "1 boxes of no width or height left out (annotation 1" in caplog.text
    assert cfg.annotations["val"].empty == 1
    labels = build_val_loader(cfg, _cfg()).dataset.split.labels
    rows = np.concatenate(labels)
    assert rows[:, 1:].min() >= 0 and (rows[:, 1:3] + rows[:, 3:5] / 2).max() <= 1 + 1e-6


@pytest.mark.usefixtures("one_thread")
def test_a_detr_trains_and_validates_on_coco_json(tmp_path):
    """The DETRs (end-to-end, no NMS) read the same loaders; one epoch of one step, crowd included."""
    from libreyolo import LibreYOLO

    val_json = write_coco(tmp_path / "coco", crowd={"train": [(0, 3, 1)], "val": [(0, 3, 1)]})
    result = LibreYOLO("dfine-n").train(data=str(val_json), epochs=1, imgsz=IMGSZ, batch=6, workers=0, device="cpu",
                                        project=str(tmp_path / "runs"), tensorboard=False, cache=False)
    assert result.epochs_run == 1 and result.metrics["num_images"] == 6 and result.best.is_file()
    assert "coco" in (result.run_dir / "results.html").read_text()  # the dataset is named after its folder
