"""The generated data regimes: each is the regime its row promises, reproducibly, and each is a
dataset name `data=` accepts (registry-driven: a regime added to REGIMES is checked here)."""

from __future__ import annotations

from importlib import resources

import numpy as np
import pytest
import yaml

from libreyolo.data import regimes
from libreyolo.data.dataset_yaml import load_data_config
from libreyolo.errors import DataError


def _images(name: str, count: int = 4):
    """`count` rendered images of regime `name`: (image, [(class, cx, cy, w, h) in px])."""
    regime = regimes.REGIMES[name]
    out = []
    for i in range(count):
        img, rows = regimes.render(np.random.default_rng([7, i]), regime)
        h, w = img.shape[:2]
        boxes = [(int(c), float(x) * w, float(y) * h, float(bw) * w, float(bh) * h)
                 for c, x, y, bw, bh in (r.split() for r in rows)]
        out.append((img, boxes))
    return out


@pytest.mark.parametrize("name", regimes.regime_names())
def test_every_regime_has_a_packaged_yaml(name):
    raw = yaml.safe_load(resources.files("libreyolo.configs.datasets").joinpath(f"{name}.yaml").read_text())
    assert raw["builtin"] == name
    assert list(raw["names"].values()) == list(regimes.REGIMES[name].classes)


@pytest.mark.parametrize("name", regimes.regime_names())
def test_render_is_reproducible_and_labels_lie_inside(name):
    regime = regimes.REGIMES[name]
    a, rows_a = regimes.render(np.random.default_rng([0, 1]), regime)
    b, rows_b = regimes.render(np.random.default_rng([0, 1]), regime)
    assert np.array_equal(a, b) and rows_a == rows_b
    h, w = a.shape[:2]
    assert regime.height[0] <= h <= regime.height[1] and regime.width[0] <= w <= regime.width[1]
    for img, boxes in _images(name, 2):
        for c, cx, cy, bw, bh in boxes:
            assert 0 <= c < len(regime.classes)
            assert bw > 0 and bh > 0
            assert cx - bw / 2 >= -0.5 and cx + bw / 2 <= img.shape[1] + 0.5
            assert cy - bh / 2 >= -0.5 and cy + bh / 2 <= img.shape[0] + 0.5


def test_dense_is_crowded_and_small():
    images = _images("shapes-dense")
    counts = [len(b) for _, b in images]
    sides = np.array([max(bw, bh) for _, b in images for *_, bw, bh in b])
    assert min(counts) >= 50  # 60-150 drawn; a few may find no room
    assert (sides < 24).mean() > 0.6  # "most under 24 px"


def test_single_wide_and_clutter_are_their_regimes():
    assert {c for _, b in _images("shapes-single") for c, *_ in b} == {0}
    for img, _ in _images("shapes-wide", 2):
        assert img.shape[1] >= 1280 and img.shape[1] > img.shape[0]
    # Clutter: the background varies far more than shapes' smooth gradients.
    plain = regimes.Regime(("circle",), 1, 1, (480, 480), (480, 480), (0, 0), ((1.0, 16, 17),))
    cluttered = regimes.Regime(("circle",), 1, 1, (480, 480), (480, 480), (0, 0), ((1.0, 16, 17),), clutter=True)
    assert _blotchiness(cluttered) > 1.5 * _blotchiness(plain)


def test_large_fills_the_image_and_sparse_leaves_images_empty():
    large = [b for _, b in _images("shapes-large", 6)]
    assert all(1 <= len(b) <= 3 for b in large) and min(max(bw, bh) for b in large for *_, bw, bh in b) >= 100
    counts = [len(b) for _, b in _images("shapes-sparse", 12)]
    assert max(counts) <= 2 and 0 in counts and any(counts)


def _blotchiness(regime) -> float:
    """How much 24-px block means differ from their neighbours (pixel noise averages out), over
    four backgrounds."""
    out = []
    for seed in range(4):
        img = regimes.render(np.random.default_rng(seed), regime)[0].astype(float).mean(2)
        out.append(np.abs(np.diff(img.reshape(20, 24, 20, 24).mean((1, 3)), axis=1)).mean())
    return float(np.mean(out))


def test_decoys_are_drawn_but_not_labelled():
    regime = regimes.REGIMES["shapes-clutter"]
    no_decoys = regimes.Regime(**{**regime.__dict__, "decoys": (0, 0)})
    rng = lambda: np.random.default_rng([5, 5])
    img, rows = regimes.render(rng(), regime)
    assert len(rows) >= regime.objects[0]
    assert not np.array_equal(img, regimes.render(rng(), no_decoys)[0])


def test_a_regime_is_a_dataset_name(tmp_path, monkeypatch):
    """`data=shapes-single` generates the set on first use (a small stand-in of the regime here)."""
    monkeypatch.setenv("LIBREYOLO_CACHE", str(tmp_path))
    small = regimes.Regime(("ellipse",), 3, 2, (96, 96), (96, 96), (2, 4), ((1.0, 15, 30),))
    monkeypatch.setitem(regimes.REGIMES, "shapes-single", small)
    cfg = load_data_config("shapes-single")
    assert cfg.names == ["ellipse"] and (len(cfg.train), len(cfg.val)) == (3, 2)
    first = sorted(p.read_bytes() for p in (tmp_path / "datasets" / "shapes-single").rglob("*.jpg"))
    regimes.generate_regime(tmp_path / "again", "shapes-single")
    assert first == sorted(p.read_bytes() for p in (tmp_path / "again").rglob("*.jpg"))


def test_unknown_builtin_lists_the_regimes(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("builtin: shapes-tiny\npath: x\ntrain: images/train\nval: images/val\nnames: [a]\n")
    with pytest.raises(DataError, match="shapes-dense.*shapes-clutter"):
        load_data_config(str(bad))


@pytest.mark.parametrize("name", regimes.regime_names())
def test_every_val_split_holds_enough_objects_of_each_class(name):
    # One box must not move a class's AP far: the val split expects VAL_PER_CLASS objects of each
    # class, and draws at least half that many of every one (the rendered labels, not the promise).
    regime = regimes.REGIMES[name]
    assert regime.val * sum(regime.objects) / 2 / len(regime.classes) >= regimes.VAL_PER_CLASS
    counts = np.zeros(len(regime.classes), int)
    for i in range(regime.val):
        _, rows = regimes.render(regimes.image_rng(name, 0, "val", i), regime)
        for row in rows:
            counts[int(row.split()[0])] += 1
    assert counts.min() >= regimes.VAL_PER_CLASS // 2, counts
