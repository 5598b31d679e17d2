"""Split scanning (corrupt files skipped with one summary line) and the loaders: batch format,
no_aug_epochs closing through persistent workers, caches, reproducibility, multi-scale."""

import logging
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torchvision.io import decode_image, encode_jpeg

from libreyolo.data import Batch, build_train_loader, build_val_loader, load_data_config
from libreyolo.data.augment import letterbox
from libreyolo.data.cache import cache_root
from libreyolo.data.dataset import decode_resized
from libreyolo.data.labels import scan_split
from libreyolo.errors import DataError
from libreyolo.families.base import Targets

pytestmark = pytest.mark.filterwarnings("ignore:The image decoding:DeprecationWarning")

IMGSZ = 64


def make_dataset(root: Path, n: int = 7, seed: int = 0) -> Path:
    """n JPEGs (varied sizes) with 0-3 solid boxes each, under root/images/train + labels."""
    rng = np.random.default_rng(seed)
    (root / "images" / "train").mkdir(parents=True)
    (root / "labels" / "train").mkdir(parents=True)
    for i in range(n):
        h, w = int(rng.integers(40, 90)), int(rng.integers(40, 90))
        img = torch.full((3, h, w), 30, dtype=torch.uint8)
        rows = []
        for k in range(i % 4):
            bw, bh = int(rng.integers(8, w // 2)), int(rng.integers(8, h // 2))
            x, y = int(rng.integers(0, w - bw)), int(rng.integers(0, h - bh))
            img[:, y:y + bh, x:x + bw] = torch.tensor([200, 60 * k, 40], dtype=torch.uint8)[:, None, None]
            rows.append(f"{k} {(x + bw / 2) / w} {(y + bh / 2) / h} {bw / w} {bh / h}\n")
        (root / "images" / "train" / f"{i}.jpg").write_bytes(encode_jpeg(img).numpy().tobytes())
        (root / "labels" / "train" / f"{i}.txt").write_text("".join(rows))
    y = root / "data.yaml"
    y.write_text("train: images/train\nval: images/train\nnames: [a, b, c, d]\n")
    return y


def make_cfg(**kw):
    base = dict(batch=3, imgsz=IMGSZ, workers=0, cache=False, seed=0, multi_scale=False,
                epochs=10, no_aug_epochs=0, mosaic=1.0, mixup=0.0, hsv_h=0.015, hsv_s=0.7,
                hsv_v=0.4, fliplr=0.5, degrees=5.0, translate=0.1, scale=0.5, shear=2.0)
    base.update(kw)
    return SimpleNamespace(**base)


NO_AUG = dict(mosaic=0.0, mixup=0.0, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0, fliplr=0.0, degrees=0.0,
              translate=0.0, scale=0.0, shear=0.0)


@pytest.fixture
def data(tmp_path):
    return load_data_config(make_dataset(tmp_path / "ds"))


def epoch_batches(loader, epoch):
    loader.set_epoch(epoch)
    return list(loader)


def same(a: list[Batch], b: list[Batch]) -> bool:
    return len(a) == len(b) and all(
        torch.equal(x.images, y.images) and all(torch.equal(p, q) for p, q in zip(x.targets, y.targets))
        for x, y in zip(a, b))


def test_corrupt_files_are_skipped_with_one_summary_line(tmp_path, caplog):
    make_dataset(tmp_path, n=9)
    lab, img = tmp_path / "labels" / "train", tmp_path / "images" / "train"
    (lab / "1.txt").write_text("7 0.5 0.5 0.1 0.1\n")  # class out of range (nc=4)
    (lab / "2.txt").write_text("0 0.5 0.5 0.1\n")  # wrong column count
    (lab / "3.txt").write_text("0 0.5 zero 0.1 0.1\n")  # not a number
    (lab / "5.txt").write_text("0 1.3 0.5 0.1 0.1\n")  # outside [0, 1]
    (img / "6.jpg").write_bytes(b"not an image at all")  # unreadable
    (lab / "7.txt").unlink()  # no label file: a background image, kept
    (lab / "8.txt").write_text("0 1.004 0.5 0.1 0.1\n")  # within tolerance: clamped, kept
    files = sorted(img.glob("*.jpg"))
    with caplog.at_level(logging.INFO, logger="libreyolo"):
        split = scan_split("train", files, nc=4)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    # One line: the counts, then the first few files with what is wrong in each.
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert warnings[0].startswith("train: 5 of 9 images skipped (4 corrupt labels, 1 unreadable image; "
                                  "labels/train/1.txt: line 1: class id 7 out of range (the dataset has 4 "
                                  "classes: 0..3); labels/train/2.txt: line 1: 4 columns, expected 5 (class cx cy w h); "
                                  "labels/train/3.txt: line 1: 'zero' is not a number; and 2 more; in ")
    assert [p.name for p in split.files] == ["0.jpg", "4.jpg", "7.jpg", "8.jpg"]
    assert len(split.labels[2]) == 0 and split.labels[3][0, 1] == 1.0
    assert split.sizes[0] == tuple(decode_image(str(files[0])).shape[-2:])  # header == decode


def test_a_split_with_no_usable_image_is_an_error(tmp_path):
    make_dataset(tmp_path, n=2)
    for f in (tmp_path / "labels" / "train").glob("*.txt"):
        f.write_text("9 0.5 0.5 0.1 0.1\n")
    with pytest.raises(DataError, match="train: no usable images"):
        build_train_loader(load_data_config(tmp_path / "data.yaml"), make_cfg())


def test_train_batch_format(data):
    loader = build_train_loader(data, make_cfg())
    batches = list(loader)
    assert loader.num_images == 7 and len(loader) == 3 == len(batches)
    assert [b.images.shape[0] for b in batches] == [3, 3, 1]  # last partial batch kept
    for b in batches:
        assert isinstance(b, Batch) and isinstance(b.targets, Targets)
        assert b.images.dtype == torch.uint8 and b.images.shape[1:] == (3, IMGSZ, IMGSZ)
        t = b.targets
        m = t.boxes.shape[1]
        assert m >= 8 and m % 8 == 0 and m >= int(t.valid.sum(1).max())
        assert (t.boxes.dtype, t.labels.dtype, t.valid.dtype) == \
            (torch.float32, torch.int64, torch.bool)
        assert t.boxes.shape[:2] == t.labels.shape == t.valid.shape
        assert (t.boxes[~t.valid] == 0).all() and (t.labels[~t.valid] == 0).all()
        v = t.boxes[t.valid]
        assert (v[:, 2:] > v[:, :2]).all() and v.min() >= 0 and v.max() <= IMGSZ
        assert b.image_ids is None and b.orig_sizes is None and b.ratios is None and b.pads is None


def test_val_batches_map_back_to_original_pixels(data):
    loader = build_val_loader(data, make_cfg(), batch=4)
    gt = loader.ground_truth()
    seen = []
    for b in loader:
        assert b.images.dtype == torch.uint8 and b.images.shape[1:] == (3, IMGSZ, IMGSZ)
        assert b.image_ids.dtype == torch.int64 and b.orig_sizes.shape == (len(b.images), 2)
        assert b.ratios.shape == (len(b.images),) and b.pads.shape == (len(b.images), 2)
        for i, img_id in enumerate(b.image_ids.tolist()):
            v = b.targets.valid[i]
            boxes = b.targets.boxes[i][v]
            back = (boxes - b.pads[i].repeat(2)) / b.ratios[i]
            np.testing.assert_allclose(back.numpy(), gt[img_id][0], atol=1.0)
            assert b.targets.labels[i][v].tolist() == gt[img_id][1].tolist()
            h, w = b.orig_sizes[i].tolist()
            assert max(h, w) * b.ratios[i] == pytest.approx(IMGSZ)
            seen.append(img_id)
    assert seen == list(range(7)) and loader.num_images == 7  # fixed order


def test_no_aug_epochs_close_mosaic_in_persistent_workers(data, caplog):
    """With every other augmentation off, a closed-mosaic sample is exactly the letterboxed
    image; a mosaic sample is not. Workers persist across epochs, so this only passes if the
    closing reaches them."""
    cfg = make_cfg(workers=2, epochs=3, no_aug_epochs=1, **{**NO_AUG, "mosaic": 1.0, "mixup": 0.5})
    loader = build_train_loader(data, cfg)
    assert loader.loader.num_workers == min(2, os.cpu_count()) and loader.loader.persistent_workers
    plain = {letterbox(decode_resized(f, IMGSZ), np.zeros((0, 4)), IMGSZ)[0].numpy().tobytes()
             for f in data.train}

    def letterboxed(batches):
        return [img.numpy().tobytes() in plain for b in batches for img in b.images]

    first = epoch_batches(loader, 0)
    workers = loader.loader._iterator._workers
    assert not any(letterboxed(first))
    assert not any(letterboxed(epoch_batches(loader, 1)))
    with caplog.at_level(logging.INFO, logger="libreyolo"):
        assert all(letterboxed(epoch_batches(loader, 2)))  # the last epoch: mosaic and mixup closed
    # Said once, when it closes (building the loader set epoch 0 quietly).
    said = [r.getMessage() for r in caplog.records if "mosaic" in r.getMessage()]
    assert said == ["mosaic and mixup closed for the last 1 epoch (from epoch 3 of 3)"]
    assert loader.loader._iterator._workers is workers  # the same worker processes throughout


@pytest.mark.parametrize("aug", [NO_AUG, {}], ids=["aug-off", "aug-on"])
def test_ram_and_disk_cache_give_the_same_batches(data, aug):
    ref = epoch_batches(build_train_loader(data, make_cfg(seed=3, **aug)), 0)
    for mode in ("ram", "disk"):
        loader = build_train_loader(data, make_cfg(seed=3, cache=mode, **aug))
        assert loader.dataset.cache.mode == mode
        assert same(ref, epoch_batches(loader, 0)), mode
    npy = list((cache_root() / "images").rglob("*.npy"))
    assert len(npy) >= 7


def test_cache_auto_caches_in_ram_when_the_images_fit(data, monkeypatch, caplog):
    from libreyolo.data import cache as C

    ref = epoch_batches(build_train_loader(data, make_cfg(seed=3)), 0)
    monkeypatch.setattr(C, "available_memory", lambda: 10**12)
    with caplog.at_level(logging.INFO, logger="libreyolo"):
        loader = build_train_loader(data, make_cfg(seed=3, cache="auto"))
    assert loader.dataset.cache.mode == "ram" and same(ref, epoch_batches(loader, 0))
    assert any("cache=auto: ram (" in r.getMessage() and "25% of the 1000.0 GB available" in r.getMessage()
               for r in caplog.records)
    monkeypatch.setattr(C, "available_memory", lambda: 10**3)
    assert build_train_loader(data, make_cfg(seed=3, cache="auto")).dataset.cache.mode is None


def test_cache_auto_budget(monkeypatch, caplog):
    """At most a quarter of the available memory, shared by the training processes on the machine;
    unknown memory means no cache."""
    from libreyolo.data import cache as C

    need = 10 * 64 * 64 * 3  # 10 images at most 64 x 64 x 3 bytes each
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    for avail, expected in ((4 * need, "ram"), (4 * need - 4, None), (None, None)):
        monkeypatch.setattr(C, "available_memory", lambda avail=avail: avail)
        assert C.resolve_auto(10, 64, "train") == expected, avail
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    for avail, expected in ((4 * need, None), (8 * need, "ram")):
        monkeypatch.setattr(C, "available_memory", lambda avail=avail: avail)
        assert C.resolve_auto(10, 64, "train") == expected, avail
    with caplog.at_level(logging.INFO, logger="libreyolo"):
        C.resolve_auto(10, 64, "train")
    assert caplog.records[-1].getMessage() == (
        "train: cache=auto: ram (10 images need at most 0 MB, within 25% of the 0.0 GB available, over 2 processes)")


@pytest.mark.parametrize("files,expected", [
    ({}, 8 << 30),                                                             # no cgroup files
    ({"memory.max": "max\n", "memory.current": "123\n"}, 8 << 30),             # v2, no limit
    ({"memory.max": f"{4 << 30}\n", "memory.current": f"{1 << 30}\n"}, 3 << 30),  # v2 limit, below MemAvailable
    ({"memory.max": f"{64 << 30}\n", "memory.current": "0\n"}, 8 << 30),       # v2 limit above it
    ({"memory/memory.limit_in_bytes": "9223372036854771712\n", "memory/memory.usage_in_bytes": "5\n"}, 8 << 30),
    ({"memory/memory.limit_in_bytes": f"{2 << 30}\n", "memory/memory.usage_in_bytes": f"{3 << 30}\n"}, 0),
])
def test_available_memory_takes_the_tighter_of_the_machine_and_the_cgroup(tmp_path, files, expected):
    from libreyolo.data.cache import available_memory

    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal: {16 << 20} kB\nMemAvailable: {8 << 20} kB\n")
    for name, text in files.items():
        (tmp_path / "cg" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "cg" / name).write_text(text)
    assert available_memory(meminfo, tmp_path / "cg") == expected
    real = available_memory()  # this machine's, unpatched
    assert real is None or real > 0


def test_seeded_runs_are_reproducible_whatever_the_workers(data):
    a = epoch_batches(build_train_loader(data, make_cfg(seed=5, mixup=0.5)), 1)
    b = epoch_batches(build_train_loader(data, make_cfg(seed=5, mixup=0.5, workers=2)), 1)
    c = epoch_batches(build_train_loader(data, make_cfg(seed=6, mixup=0.5)), 1)
    assert same(a, b) and not same(a, c)
    loader = build_train_loader(data, make_cfg(seed=5))
    assert same(epoch_batches(loader, 1), epoch_batches(loader, 1))
    assert not same(epoch_batches(loader, 1), epoch_batches(loader, 2))  # reseeded per epoch


def test_multi_scale_picks_sizes_per_batch(tmp_path):
    data = load_data_config(make_dataset(tmp_path / "ds", n=24))
    loader = build_train_loader(data, make_cfg(imgsz=128, batch=2, multi_scale=True))
    sizes = set()
    for epoch in range(2):
        for b in epoch_batches(loader, epoch):
            s = b.images.shape[-1]
            assert b.images.shape[-2] == s and s % 32 == 0 and 64 <= s <= 192
            assert (b.targets.boxes <= s).all()
            sizes.add(s)
    assert len(sizes) >= 2


def test_workers_are_clamped_and_memory_pinned_only_with_cuda(data):
    loader = build_train_loader(data, make_cfg(workers=10_000))
    assert loader.loader.num_workers == os.cpu_count()
    assert loader.loader.pin_memory == torch.cuda.is_available()


def test_mosaic_and_mixup_partners_come_from_the_batch_pool(tmp_path):
    data = load_data_config(make_dataset(tmp_path / "ds", n=40))
    loader = build_train_loader(data, make_cfg(batch=4, mixup=1.0, epochs=10, no_aug_epochs=2))
    ds = loader.dataset
    loads = []
    real = ds.cache.get
    ds.cache.get = lambda i: loads.append(i) or real(i)
    for keys in list(loader.sampler)[:3]:
        loads.clear()
        pool = keys[0].pool
        assert len(pool) == 16 and pool[:4] == tuple(k.index for k in keys)
        for k in keys:
            ds[k]
        assert set(loads) <= set(pool) and len(loads) == len(set(loads))  # each decoded once
        assert len(loads) > len(keys)  # partners were drawn
    loader.set_epoch(8)  # mosaic and mixup closed: no partners, no pool
    assert all(k.pool == () and k.mosaic == 0 and k.mixup == 0 for k in next(iter(loader.sampler)))


def _break_pixels(path: Path) -> None:
    """Keep a JPEG's header (so its size reads fine) and cut the pixel data in half."""
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_a_split_none_of_whose_images_decodes_is_an_error(tmp_path):
    make_dataset(tmp_path, n=3)
    for f in (tmp_path / "images" / "train").glob("*.jpg"):
        _break_pixels(f)
    with pytest.raises(DataError) as err:
        build_train_loader(load_data_config(tmp_path / "data.yaml"), make_cfg())
    message = str(err.value)
    assert message.startswith("train: no usable images (3 found, all skipped: 3 unreadable images; "
                              "0.jpg: does not decode (corrupt image data); 1.jpg: ")
    assert "\n" not in message


def test_undecodable_images_ahead_of_the_first_good_one_are_skipped_with_a_count(tmp_path, caplog):
    make_dataset(tmp_path, n=4)
    _break_pixels(tmp_path / "images" / "train" / "0.jpg")
    with caplog.at_level(logging.INFO, logger="libreyolo"):
        split = scan_split("train", sorted((tmp_path / "images" / "train").glob("*.jpg")), nc=4)
    assert [p.name for p in split.files] == ["1.jpg", "2.jpg", "3.jpg"]
    assert "train: 1 of 4 images skipped (1 unreadable image; 0.jpg: does not decode" in caplog.text
