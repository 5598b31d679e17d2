"""Semantic segmentation through the command's entry point, in this process: train 2 epochs on the
built-in shapes-seg set (cut to 8 + 2 images), validate the checkpoint, predict a class map; and bad
masks as one line, exit code 2, nothing written."""

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from testkit import run_in_process

from libreyolo.data import shapes_seg
from libreyolo.families import REGISTRY, arch_name

FAST = ["imgsz=64", "batch=8", "workers=0", "device=cpu"]


def _files(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*")}


@pytest.fixture
def small_shapes_seg(tmp_path, monkeypatch):
    monkeypatch.setenv("LIBREYOLO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(shapes_seg, "DEFAULTS", {"train": 8, "val": 2, "size": 64, "seed": 0})
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_train_two_epochs_then_val_then_predict(small_shapes_seg, capsys):
    tmp_path = small_shapes_seg
    code, out, err = run_in_process(["train", "model=segformer-b0", "data=shapes-seg", "epochs=2", *FAST, "--json"],
                                    capsys)
    assert code == 0, err[-2000:]
    result = json.loads(out)
    assert result["task"] == "segment" and 0.0 <= result["metrics"]["miou"] <= result["metrics"]["pixel_acc"] <= 1.0
    assert "on shapes-seg (8 train images, semantic segmentation)" in err and "mIoU " in err
    run = tmp_path / result["run_dir"]
    header = (run / "results.csv").read_text().splitlines()[0].split(",")
    assert header == ["epoch", "train/ce", "lr", "miou", "pixel_acc", "seconds", "skipped_steps"]
    page = (run / "results.html").read_text()
    assert "mIoU" in page and "hexagon" in page  # the per-class table of the last validation

    code, out, err = run_in_process(["val", f"model={tmp_path / result['best']}", "workers=0", "device=cpu"], capsys)
    assert code == 0, err[-2000:]
    assert out.startswith("mIoU ") and "pixel acc" in out and "(2 images)" in out
    assert "imgsz 64 (from the checkpoint's training arguments)" in err and "triangle_outline" in err

    image = next((tmp_path / "cache" / "datasets" / "shapes-seg" / "images" / "val").iterdir())
    code, out, err = run_in_process(["predict", f"model={tmp_path / result['best']}", f"source={image}",
                                     "device=cpu", "--json"], capsys)
    assert code == 0, err[-2000:]
    line = json.loads(out)
    assert line["task"] == "segment" and sum(c["pixels"] for c in line["classes"]) == 64 * 64
    saved = Image.open(line["mask_saved"])
    assert saved.mode == "P" and saved.size == (64, 64) and np.asarray(saved).max() <= 10


# Every other segmentation family (SegFormer runs above): its first size, two epochs on the 8 images.
OTHER_SEGMENTERS = [arch_name(spec, spec.sizes[0]) for name, spec in REGISTRY.items()
                    if "segment" in spec.tasks and name != "segformer"]


@pytest.mark.usefixtures("one_thread")  # intra-op threads on a busy 2-core runner (tests/conftest.py)
@pytest.mark.parametrize("model", OTHER_SEGMENTERS)
def test_other_families_train_two_epochs(small_shapes_seg, model, capsys):
    code, out, err = run_in_process(["train", f"model={model}", "data=shapes-seg", "epochs=2", *FAST, "--json"],
                                    capsys)
    assert code == 0, err[-2000:]
    result = json.loads(out)
    assert result["task"] == "segment" and 0.0 <= result["metrics"]["miou"] <= result["metrics"]["pixel_acc"] <= 1.0
    rows = [r.split(",") for r in (small_shapes_seg / result["run_dir"] / "results.csv").read_text().splitlines()[1:]]
    assert [r[0] for r in rows] == ["1", "2"] and all(float(r[1]) > 0 for r in rows)  # epoch, train/ce


def _dataset(root: Path, mask_mode: str = "L") -> Path:
    for split in ("train", "val"):
        for i in range(2):
            (root / "images" / split).mkdir(parents=True, exist_ok=True)
            (root / "masks" / split).mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.full((32, 32, 3), 90 + i, np.uint8)).save(root / "images" / split / f"{i}.png")
            Image.new(mask_mode, (32, 32)).save(root / "masks" / split / f"{i}.png")
    return root


@pytest.mark.parametrize("change, said", [
    (lambda r: Image.new("RGB", (32, 32)).save(r / "masks" / "val" / "1.png"), "masks/val/1.png is RGB (3 channels)"),
    (lambda r: Image.new("L", (32, 30)).save(r / "masks" / "train" / "0.png"), "masks/train/0.png is 32x30 but"),
])
def test_a_bad_mask_is_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys, change, said):
    monkeypatch.chdir(tmp_path)
    change(_dataset(tmp_path / "ds"))
    before = _files(tmp_path)
    code, out, err = run_in_process(["train", "model=segformer-b0", "data=ds", "epochs=1", *FAST], capsys)
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: ") and said in err, err
    assert out == "" and "Traceback" not in err and _files(tmp_path) == before
