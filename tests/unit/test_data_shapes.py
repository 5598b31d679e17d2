"""The built-in shapes dataset: deterministic, atomic, and shaped like the brief says."""

from pathlib import Path

import numpy as np
import pytest
import yaml
from torchvision.io import decode_image

from libreyolo.data import load_data_config, shapes
from libreyolo.data.dataset_yaml import _packaged_folder

pytestmark = pytest.mark.filterwarnings("ignore:The image decoding:DeprecationWarning")


def _files(root):
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_two_generations_with_one_seed_are_byte_identical(tmp_path):
    small = {"train": 5, "val": 2}
    shapes.generate_shapes(tmp_path / "a", seed=0, splits=small)
    shapes.generate_shapes(tmp_path / "b", seed=0, splits=small)
    shapes.generate_shapes(tmp_path / "c", seed=1, splits=small)
    a, b, c = (_files(tmp_path / n) for n in "abc")
    assert len(a) == 2 * 7 + 1  # images + labels + marker
    assert a == b
    first = Path("images/train/train_0000.jpg")
    assert a[first] != c[first]  # the seed matters


def test_builtin_dataset_matches_the_brief():
    cfg = load_data_config("shapes")
    assert (len(cfg.train), len(cfg.val)) == (128, 32)
    assert cfg.names == shapes.NAMES and cfg.nc == 10
    assert (cfg.root / shapes.MARKER).is_file()
    counts, areas = [], []
    for f in cfg.train[:40]:
        img = decode_image(str(f))
        h, w = img.shape[-2:]
        assert 480 <= h <= 640 and 480 <= w <= 640
        rows = np.loadtxt(str(f).replace("images", "labels").replace(".jpg", ".txt"), ndmin=2)
        counts.append(len(rows))
        assert ((rows[:, 0] >= 0) & (rows[:, 0] < 10)).all()
        areas += list(rows[:, 3] * w * rows[:, 4] * h)
    areas = np.array(areas)
    assert min(counts) >= 1 and max(counts) <= 30 and np.std(counts) > 3
    small, large = (areas < 32**2).mean(), (areas > 96**2).mean()
    assert 0.25 < small < 0.65 and 0.08 < large < 0.35  # a COCO-like mix of sizes


def test_packaged_yaml_lists_the_generator_names():
    raw = yaml.safe_load(_packaged_folder().joinpath("shapes.yaml").read_text())
    assert raw["builtin"] == "shapes"
    assert [raw["names"][i] for i in range(10)] == shapes.NAMES


def test_ensure_is_atomic_and_regenerates_incomplete_folders(tmp_path, monkeypatch):
    monkeypatch.setattr(shapes, "SPLITS", {"train": 3, "val": 1})
    monkeypatch.setenv("LIBREYOLO_CACHE", str(tmp_path))  # a folder without the marker is replaced only there
    root = tmp_path / "shapes"
    root.mkdir()
    (root / "junk.txt").write_text("a half-written folder without the marker")
    shapes.ensure_shapes(root)
    assert not (root / "junk.txt").exists() and len(list(root.rglob("*.jpg"))) == 4
    stamp = (root / shapes.MARKER).stat().st_mtime_ns
    shapes.ensure_shapes(root)  # complete: left alone
    assert (root / shapes.MARKER).stat().st_mtime_ns == stamp

    calls = []

    def failing(rng):
        calls.append(1)
        if len(calls) > 2:
            raise OSError("disk full")
        return real(rng)

    real = shapes.render_image
    monkeypatch.setattr(shapes, "render_image", failing)
    other = tmp_path / "other"
    from libreyolo.errors import WriteError

    with pytest.raises(WriteError, match=f"cannot generate the shapes dataset at {other}: disk full"):
        shapes.ensure_shapes(other)
    assert not other.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["shapes"]  # no temp folder left behind
