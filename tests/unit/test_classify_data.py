"""Classification data: class-folder datasets in their three forms, the one-line errors (nothing
written on failure), the built-in shapes-cls set, and the loaders (batch format, per-sample
reproducible augmentation, validation crop geometry, multi-process sharding)."""

import dataclasses
import logging
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torchvision.io import decode_image, encode_jpeg, encode_png
from torchvision.transforms.v2 import functional as TF

from libreyolo.data import (
    ClassBatch,
    ClassifyData,
    ClassTargets,
    build_classify_train_loader,
    build_classify_val_loader,
    builtin_names,
    load_classify_data,
    load_data_config,
    shapes,
    shapes_cls,
)
from libreyolo.data.classify import image_ok
from libreyolo.data.dataset import SampleKey
from libreyolo.errors import DataError

pytestmark = pytest.mark.filterwarnings("ignore:The image decoding:DeprecationWarning")

IMGSZ = 32


def _png(img: torch.Tensor) -> bytes:
    return encode_png(img).numpy().tobytes()


def _noise(seed: int, h: int = 40, w: int = 48) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 256, (3, h, w), dtype=np.uint8))


def make_folder(root: Path, splits: dict[str, dict[str, int]] | None = None) -> Path:
    """root/<split>/<class>/<i>.png of distinct noise; default: train a=3 b=2 c=2, val a=1 b=1."""
    splits = splits or {"train": {"a": 3, "b": 2, "c": 2}, "val": {"a": 1, "b": 1}}
    seed = 0
    for split, classes in splits.items():
        for cls, n in classes.items():
            (root / split / cls).mkdir(parents=True, exist_ok=True)
            for i in range(n):
                seed += 1
                (root / split / cls / f"{i}.png").write_bytes(_png(_noise(seed)))
    return root


def make_cfg(**kw):
    base = dict(imgsz=IMGSZ, batch=3, seed=0, workers=0, cache=False, fliplr=0.5, hsv_h=0.015,
                hsv_s=0.7, hsv_v=0.4, crop_scale=0.08)
    base.update(kw)
    return SimpleNamespace(**base)


def snapshot(*folders: Path) -> dict:
    """Every path under the folders with its size and mtime: equal before and after = nothing written."""
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for f in folders if f.exists()
            for p in [f, *f.rglob("*")]}


def batches(loader, epoch: int | None = None) -> list[ClassBatch]:
    if epoch is not None:
        loader.set_epoch(epoch)
    return list(loader)


def same(a: list[ClassBatch], b: list[ClassBatch]) -> bool:
    return len(a) == len(b) and all(torch.equal(x.images, y.images) and
                                    torch.equal(x.targets.labels, y.targets.labels) for x, y in zip(a, b))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("LIBREYOLO_CACHE", str(folder))
    return folder


@pytest.fixture
def small_builtin(monkeypatch):
    monkeypatch.setattr(shapes_cls, "DEFAULTS", {"per_class_train": 2, "per_class_val": 1, "size": 32, "seed": 0})


# --- the three forms -------------------------------------------------------------------------


def test_folder_layout_sorted_classes_and_skipped_entries(tmp_path):
    root = make_folder(tmp_path / "ds", {"train": {"b": 1, "a": 2, "C": 1}, "val": {"a": 1}})
    (root / "train" / "a" / "notes.txt").write_text("not an image")
    (root / "train" / "a" / "._0.png").write_bytes(b"macOS resource fork")  # hidden: skipped
    (root / "train" / ".ipynb_checkpoints").mkdir()  # hidden folder: not a class
    (root / "train" / "b" / "deep").mkdir()
    (root / "train" / "b" / "deep" / "X.PNG").write_bytes(_png(_noise(9)))  # nested, upper-case suffix
    data = load_classify_data(root)
    assert isinstance(data, ClassifyData) and data.name == "ds" and data.yaml_path is None
    assert data.root == root.resolve() and data.names == ["C", "a", "b"] and data.nc == 3  # str order
    assert [(p.relative_to(root / "train").as_posix(), c) for p, c in data.train] == \
        [("C/0.png", 0), ("a/0.png", 1), ("a/1.png", 1), ("b/0.png", 2), ("b/deep/X.PNG", 2)]
    assert [(p.name, c) for p, c in data.val] == [("0.png", 1)]  # val uses train's ids


@pytest.mark.parametrize("present,used", [(["valid", "test"], "valid"), (["test"], "test")])
def test_val_falls_back_to_valid_then_test(tmp_path, caplog, present, used):
    root = make_folder(tmp_path / "ds", {"train": {"a": 1}, **{p: {"a": 1} for p in present}})
    with caplog.at_level(logging.INFO, logger="libreyolo"):
        data = load_classify_data(str(root))
    assert data.val[0][0].parent.parent.name == used
    assert any(r.getMessage() == f"val: no val/ folder in {root.resolve()}, validating on {used}/"
               for r in caplog.records)


def test_yaml_form_with_relative_path_and_without_names(tmp_path):
    make_folder(tmp_path / "data", {"images/tr": {"x": 2, "y": 1}, "images/va": {"y": 1}})
    y = tmp_path / "cfg" / "d.yaml"
    y.parent.mkdir()
    y.write_text("path: ../data\ntrain: images/tr\nval: images/va\n")
    data = load_classify_data(y)
    assert data.name == "d" and data.yaml_path == y and data.root == (tmp_path / "data").resolve()
    assert data.names == ["x", "y"] and [c for _, c in data.train] == [0, 0, 1] and data.val[0][1] == 1


@pytest.mark.parametrize("names", ["[a, b, c]", "{2: c, 0: a, 1: b}"])
def test_yaml_names_equal_to_the_class_folders(tmp_path, names):
    make_folder(tmp_path)
    y = tmp_path / "d.yaml"
    y.write_text(f"train: train\nval: val\nnames: {names}\ntask: classify\n")
    assert load_classify_data(y).names == ["a", "b", "c"]


@pytest.mark.parametrize("names,message", [
    ("[a, c, b]", "names[1] is 'c' but class folder 1 of train is 'b'"),
    ("[a, b, c, d]", "names[3] 'd' has no class folder in train"),
    ("[a, b]", "class folder 'c' of train is not in names"),
])
def test_yaml_names_that_differ_name_the_first_difference(tmp_path, names, message):
    make_folder(tmp_path)
    y = tmp_path / "d.yaml"
    y.write_text(f"train: train\nval: val\nnames: {names}\n")
    with pytest.raises(DataError) as e:
        load_classify_data(y)
    assert str(e.value) == (f"dataset yaml {y}: {message} (names must be the sorted class folders "
                            f"of {tmp_path.resolve() / 'train'})")


# --- bad input: one line, raised before anything is written ------------------------------------


def _images_straight_in_train(root):
    for f in list((root / "train").rglob("*.png")):
        f.rename(root / "train" / f"{f.parent.name}{f.name}")
    for d in (root / "train").iterdir():
        if d.is_dir():
            d.rmdir()


def _empty_class_folder(root):
    (root / "val" / "b" / "0.png").unlink()
    (root / "val" / "b" / "notes.txt").write_text("no images here")


def _garbage(root):
    (root / "train" / "b" / "1.png").write_bytes(b"this is not an image" * 10)


def _truncated_png(root):
    p = root / "val" / "a" / "0.png"
    p.write_bytes(p.read_bytes()[:-40])


def _truncated_jpeg(root):
    jpg = encode_jpeg(_noise(3), quality=90).numpy().tobytes()
    (root / "train" / "c" / "2.jpg").write_bytes(jpg[: len(jpg) // 2])


def _val_class_not_in_train(root):
    (root / "val" / "b").rename(root / "val" / "dog")


def _no_val(root):
    shutil.rmtree(root / "val")


def _no_train(root):
    shutil.rmtree(root / "train")


BAD = {
    "no class folders": (_images_straight_in_train,
                         r"train: no class folders in {root}/train \(expected {root}/train/<class>/<image>; "
                         r"a detection dataset's images/ folder has none\)"),
    "empty class folder": (_empty_class_folder,
                           r"val: class folder {root}/val/b has no images \(\.jpg, \.jpeg, \.png, \.webp\); "
                           r"add some or remove the folder"),
    "garbage file": (_garbage, r"train: 1 image does not decode \(truncated or not an image\): b/1.png "
                               r"\(in {root}/train\); replace or delete them"),
    "truncated png": (_truncated_png, r"val: 1 image does not decode .*: a/0.png \(in {root}/val\).*"),
    "truncated jpeg": (_truncated_jpeg, r"train: 1 image does not decode .*: c/2.jpg \(in {root}/train\).*"),
    "val class not in train": (_val_class_not_in_train,
                               r"val: class folder 'dog' in {root}/val is not a class of train "
                               r"\({root}/train\): rename or remove it, or add it to train"),
    "no val": (_no_val, r"no val/, valid/ or test/ folder in {root}: a classification dataset folder holds "
                        r"train/<class>/<image> and val/<class>/<image>"),
    "no train": (_no_train, r"no train/ folder in {root}: a classification dataset folder holds "
                            r"train/<class>/<image> and val/<class>/<image>"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_folder_input_is_one_line_and_writes_nothing(tmp_path, cache, case):
    root = make_folder(tmp_path / "ds").resolve()
    make, pattern = BAD[case]
    make(root)
    before = snapshot(tmp_path)
    with pytest.raises(DataError) as e:
        load_classify_data(root)
    msg = str(e.value)
    assert "\n" not in msg and re.fullmatch(pattern.format(root=root), msg), msg
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("text,pattern", [
    ("train: train\nval: nope\n", r"val: {root}/nope not found \(expected a folder of class folders\)"),
    ("train: train/a/0.png\nval: val\n", r"train: {root}/train/a/0.png is not a folder .*"),
    ("train: [train]\nval: val\n", r"dataset yaml {yaml}: 'train' must be one folder of class folders .*"),
    ("val: val\n", r"dataset yaml {yaml}: 'train' is missing"),
    ("train: images/train\nval: images/val\ntask: detect\n",
     r"dataset {yaml} is a detection dataset: train a detection model on it, or pick a classification "
     r"dataset \(e.g. shapes-cls\)"),
])
def test_bad_yaml_input_is_one_line_and_writes_nothing(tmp_path, cache, text, pattern):
    root = make_folder(tmp_path).resolve()
    y = tmp_path / "d.yaml"
    y.write_text(text)
    before = snapshot(tmp_path)
    with pytest.raises(DataError) as e:
        load_classify_data(y)
    msg = str(e.value)
    assert "\n" not in msg and re.fullmatch(pattern.format(root=root, yaml=y), msg), msg
    assert snapshot(tmp_path) == before


def test_image_check_passes_oddities_and_catches_breakage(tmp_path):
    jpg = encode_jpeg(_noise(1), quality=90).numpy().tobytes()
    cases = {"ok.jpg": jpg, "trailer.jpg": jpg + b"camera trailer bytes", "ok.png": _png(_noise(2)),
             "cut.jpg": jpg[:-200], "cut.png": _png(_noise(2))[:-40], "empty.png": b"",
             "no_iend.png": _png(_noise(2))[:-12],  # pixels whole, end chunk gone: decoded in full
             "text.jpg": b"\xff\xd8 not really a jpeg \xff\xd9"}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
    assert {n: image_ok(tmp_path / n) for n in cases} == {
        "ok.jpg": True, "trailer.jpg": True, "ok.png": True, "cut.jpg": False, "cut.png": False,
        "empty.png": False, "no_iend.png": True, "text.jpg": True}  # text.jpg: signature and end marker only (cheap)


# --- the built-in set --------------------------------------------------------------------------


def test_builtin_shapes_cls_is_generated_once_into_the_cache(cache, small_builtin):
    data = load_classify_data("shapes-cls")
    assert data.name == "shapes-cls" and data.yaml_path.name == "shapes-cls.yaml"
    assert data.root == (cache / "datasets" / "shapes-cls").resolve()
    assert data.names == sorted(shapes.NAMES) and (len(data.train), len(data.val)) == (20, 10)
    assert decode_image(str(data.train[0][0])).shape == (3, 32, 32)
    marker = data.root / shapes.MARKER
    stamp = marker.stat().st_mtime_ns
    assert load_classify_data("shapes-cls").train == data.train and marker.stat().st_mtime_ns == stamp
    assert not [p for p in (cache / "datasets").iterdir() if p.name != "shapes-cls"]  # no temp left
    assert "shapes-cls" in builtin_names()


def test_builtin_defaults_are_10_classes_of_100_train_20_val_at_96_px():
    assert shapes_cls.DEFAULTS == {"per_class_train": 100, "per_class_val": 20, "size": 96, "seed": 0}
    assert len(shapes.NAMES) == 10


def test_two_generations_with_one_seed_are_byte_identical(tmp_path):
    files = {}
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        shapes_cls.generate_shapes_cls(tmp_path / name, 2, 1, 32, seed)
        files[name] = {p.relative_to(tmp_path / name): p.read_bytes()
                       for p in sorted((tmp_path / name).rglob("*")) if p.is_file()}
    assert len(files["a"]) == 10 * 3 + 1 and files["a"] == files["b"]
    first = Path("train/circle/circle_0000.png")
    assert files["a"][first] != files["c"][first]
    # One shape on a distinct background: every class differs from every other.
    assert len({files["a"][Path(f"val/{n}/{n}_0000.png")] for n in shapes.NAMES}) == 10


def test_detection_and_classification_refuse_each_others_builtins(cache):
    with pytest.raises(DataError) as e:
        load_data_config("shapes-cls")
    assert str(e.value) == ("dataset shapes-cls is a classification dataset: train a classification "
                            "model on it, or pick a detection dataset (e.g. shapes)")
    with pytest.raises(DataError) as e:
        load_classify_data("shapes")
    assert str(e.value) == ("dataset shapes is a detection dataset: train a detection model on it, "
                            "or pick a classification dataset (e.g. shapes-cls)")
    with pytest.raises(DataError) as e:
        load_classify_data("shapez")
    assert str(e.value) == ("dataset 'shapez' not found: no such folder, and the built-in "
                            "classification datasets are shapes-cls")
    assert not cache.exists()  # nothing generated


# --- loaders -----------------------------------------------------------------------------------


@pytest.fixture
def data(tmp_path):
    return load_classify_data(make_folder(tmp_path / "ds"))


def test_batch_format_and_loader_interface(data):
    loader = build_classify_train_loader(data, make_cfg())
    assert loader.num_images == len(loader.dataset) == 7 and len(loader) == 3
    assert loader.sampler.sizes == [IMGSZ] and [loader.sampler.global_size(s) for s in range(3)] == [3, 3, 1]
    got = batches(loader)
    assert [len(b.images) for b in got] == [3, 3, 1]
    val = build_classify_val_loader(data, make_cfg(), batch=4)
    vb = batches(val)
    assert val.num_images == 2 and len(val) == 1 and val.files == [p for p, _ in data.val]
    for b in got + vb:
        assert isinstance(b, ClassBatch) and isinstance(b.targets, ClassTargets)
        assert b.images.dtype == torch.uint8 and b.images.shape[1:] == (3, IMGSZ, IMGSZ)
        assert b.targets.labels.dtype == torch.int64 and b.targets.labels.shape == (len(b.images),)
        moved = b.to("cpu", non_blocking=True)
        assert isinstance(moved, ClassBatch) and isinstance(moved.targets, ClassTargets)
    assert sorted(torch.cat([b.targets.labels for b in got]).tolist()) == sorted(c for _, c in data.train)
    assert vb[0].targets.labels.dtype == torch.int64 and vb[0].targets.labels.tolist() == [0, 1]


def test_augmentation_is_per_sample_reproducible_and_leaves_the_callers_rng_alone(data):
    cfg = make_cfg(seed=5)
    state = torch.get_rng_state()
    a = batches(build_classify_train_loader(data, cfg), 1)
    assert torch.equal(torch.get_rng_state(), state)  # workers=0 ran in this process
    b = batches(build_classify_train_loader(data, make_cfg(seed=5, workers=2)), 1)
    assert same(a, b)
    loader = build_classify_train_loader(data, cfg)
    assert same(batches(loader, 1), a)
    assert not same(batches(loader, 2), a)  # another epoch: another order and augmentation
    assert not same(batches(build_classify_train_loader(data, make_cfg(seed=6)), 1), a)
    # Iterating again without set_epoch moves on to the next epoch.
    loader.set_epoch(3)
    list(loader)
    list(loader)
    assert loader.epoch == 4


def test_one_sample_gets_one_augmentation_whatever_batch_it_lands_in(data):
    """Keyed by (seed, epoch, index): batch size changes the order's grouping, not a sample."""
    def by_image(cfg, epoch=1):
        ds = build_classify_train_loader(data, cfg).dataset
        return [ds[SampleKey(i, epoch, 0.0, 0.0, IMGSZ)][0] for i in range(len(ds))]

    x, y = by_image(make_cfg(batch=2)), by_image(make_cfg(batch=5))
    assert all(torch.equal(p, q) for p, q in zip(x, y))
    assert not torch.equal(x[0], by_image(make_cfg(batch=2, seed=1))[0])
    assert not torch.equal(x[0], by_image(make_cfg(batch=2), epoch=2)[0])  # same image, next epoch


def test_crop_scale_and_the_augmentations_come_from_the_config(data):
    """crop_scale=1 on a 40x48 image with every other augmentation off keeps the whole image
    (RandomResizedCrop falls back to the central crop of the allowed aspect range)."""
    off = dict(fliplr=0.0, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0)
    ds = build_classify_train_loader(data, make_cfg(crop_scale=1.0, **off)).dataset
    img = decode_image(str(data.train[0][0]))
    out = ds[SampleKey(0, 0, 0.0, 0.0, IMGSZ)][0]
    h, w = img.shape[-2:]
    cw = round(h * 4 / 3)  # the widest crop allowed: ratio 4/3 of the full height
    expected = TF.resize(TF.center_crop(img, [h, min(w, cw)]), [IMGSZ, IMGSZ], antialias=True)
    assert torch.equal(out, expected)
    default = build_classify_train_loader(data, make_cfg(**off)).dataset  # crop_scale 0.08
    assert any(not torch.equal(default[SampleKey(i, 0, 0.0, 0.0, IMGSZ)][0],
                               ds[SampleKey(i, 0, 0.0, 0.0, IMGSZ)][0]) for i in range(7))
    no_key = SimpleNamespace(**{k: v for k, v in vars(make_cfg(**off)).items() if k != "crop_scale"})
    alt = build_classify_train_loader(data, no_key).dataset  # the key absent: 0.08, as torchvision
    assert torch.equal(alt[SampleKey(2, 0, 0.0, 0.0, IMGSZ)][0], default[SampleKey(2, 0, 0.0, 0.0, IMGSZ)][0])


def test_val_resizes_the_short_side_to_imgsz_over_0_875_then_centre_crops(tmp_path):
    """A 100 x 200 image whose pixel value is its column: the short side 100 -> round(32 / 0.875)
    = 37 scales by 0.37 to 74 columns, of which the central 32 (21..52) stay; their centres are
    original columns (21.5 / 0.37 - 0.5) = 57.6 .. (52.5 / 0.37 - 0.5) = 141.4. Resizing to 32
    without the crop would keep 0..199; cropping 0.875 of the long side, other columns."""
    cols = torch.arange(200, dtype=torch.uint8).repeat(3, 100, 1)
    for split in ("train", "val"):
        (tmp_path / split / "a").mkdir(parents=True)
        (tmp_path / split / "a" / "0.png").write_bytes(_png(cols))
    loader = build_classify_val_loader(load_classify_data(tmp_path), make_cfg())
    img = batches(loader)[0].images[0]
    assert img.shape == (3, 32, 32) and (img == img[:, :1, :]).all()  # every row alike
    row = img[0, 0].float()
    assert abs(row[0] - 57.6) < 1 and abs(row[-1] - 141.4) < 1 and abs(row.mean() - 99.5) < 1
    assert same(batches(loader), batches(loader))  # deterministic


def test_two_ranks_together_load_the_single_process_batches(data):
    cfg = make_cfg(batch=4, seed=2)
    single = batches(build_classify_train_loader(data, cfg), 1)
    ranks = [batches(build_classify_train_loader(data, cfg, rank=r, world_size=2), 1) for r in (0, 1)]
    assert len(single) == len(ranks[0]) == len(ranks[1]) == 2
    for s, r0, r1, sizes in zip(single, *ranks, [(2, 2), (2, 1)]):  # 7 images: global batches 4, 3
        assert (len(r0.images), len(r1.images)) == sizes
        assert torch.equal(torch.cat([r0.images, r1.images]), s.images)
        assert torch.equal(torch.cat([r0.targets.labels, r1.targets.labels]), s.targets.labels)


@pytest.mark.parametrize("workers", [0, 2])
def test_an_image_broken_after_the_scan_is_one_line_when_loaded(data, workers):
    broken = data.train[3][0]
    broken.write_bytes(b"overwritten")
    val_on_train = dataclasses.replace(data, val=data.train)
    for loader in (build_classify_train_loader(data, make_cfg(workers=workers, batch=7)),
                   build_classify_val_loader(val_on_train, make_cfg(workers=workers))):
        with pytest.raises(DataError) as e:
            list(loader)
        assert str(e.value) == (f"cannot decode {broken}: it changed since the dataset was scanned; "
                                f"replace or delete it and start again")


def test_cache_is_not_used_and_says_so_once(data, caplog, cache):
    with caplog.at_level(logging.INFO, logger="libreyolo"):
        loader = build_classify_train_loader(data, make_cfg(cache="ram"))
        build_classify_val_loader(data, make_cfg(cache="ram"))
    lines = [r.getMessage() for r in caplog.records if "cache" in r.getMessage()]
    assert lines == ["cache=ram is not used for classification: images are read from their files"]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="libreyolo"):
        build_classify_train_loader(data, make_cfg(cache="auto"))  # the default: nothing to say
    assert not [r for r in caplog.records if "cache" in r.getMessage()]
    assert same(batches(loader, 0), batches(build_classify_train_loader(data, make_cfg()), 0))
    assert not cache.exists()
