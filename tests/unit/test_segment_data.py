"""Segmentation data: the built-in shapes-seg set, the folder / yaml / ADE20K / Cityscapes forms, every
bad mask as one DataError line naming the file, and the loaders (image and mask aligned through the
random resize-crop and flip, padding ignored, per-sample reproducible, the validation resize,
multi-process sharding, the batch's dtypes and bench's pack/unpack)."""

import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from PIL import Image

from libreyolo.data import shapes_seg
from libreyolo.data.dataset import SampleKey
from libreyolo.data.segment import (
    SegBatch,
    SegTargets,
    SegTrainDataset,
    build_segment_train_loader,
    build_segment_val_loader,
    load_segment_data,
    resize_nearest,
)
from libreyolo.data.shapes import COLORS
from libreyolo.errors import ConfigError, DataError
from libreyolo.tasks import get_task

COLOURS = np.array([(40, 40, 40), (230, 30, 30), (30, 30, 230), (30, 220, 30)], np.uint8)


def _save(path: Path, array: np.ndarray, mode: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    img = Image.fromarray(array)
    if mode == "P":
        img = Image.frombytes("P", img.size, array.tobytes())
        img.putpalette([v for c in range(256) for v in COLOURS[c % 4]])
    img.save(path)
    return path


def _scene(seed: int, h: int = 40, w: int = 48, nc: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """A mask of 12 x 14 rectangles, one per class, and the image painting each class in its colour.
    The rectangles sit in their own columns (w // (nc - 1) wide) at a random height, so none
    overlaps another: an overlap can leave a sliver a pixel wide that the mask's nearest-neighbour
    resize skips and the image's bilinear one blends in."""
    rng = np.random.default_rng(seed)
    mask = np.zeros((h, w), np.uint8)
    column = w // max(nc - 1, 1)
    for c in range(1, nc):
        y = rng.integers(0, h - 12)
        x = (c - 1) * column + rng.integers(0, max(column - 14, 0) + 1)
        mask[y:y + 12, x:x + 14] = c
    return COLOURS[mask], mask


def make_folder(root: Path, counts=(("train", 3), ("val", 2)), nc: int = 3, images="images", masks="masks",
                splits=None, image_suffix=".png", mask_mode=None) -> Path:
    for split, n in counts:
        folder = (splits or {}).get(split, split)
        for i in range(n):
            img, mask = _scene(1000 * (split == "val") + 100 * (split == "test") + i, nc=nc)  # not hash(): salted per process
            _save(root / images / folder / f"{i}{image_suffix}", img)
            _save(root / masks / folder / f"{i}.png", mask, mask_mode)
    return root


def cfg(**kw):
    base = dict(imgsz=32, batch=2, seed=0, workers=0, cache=False, multi_scale=False, fliplr=0.5, hsv_h=0.0,
                hsv_s=0.0, hsv_v=0.0, resize_min=0.5, resize_max=2.0, ignore_index=255)
    return SimpleNamespace(**{**base, **kw})


# --------------------------------------------------------------------------- forms
def test_shapes_seg_is_deterministic_and_its_masks_are_the_shapes(tmp_path, monkeypatch):
    shapes_seg.generate_shapes_seg(tmp_path / "a", train=3, val=1, size=64)
    shapes_seg.generate_shapes_seg(tmp_path / "b", train=3, val=1, size=64)
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.png"))
    assert len(files) == 8 and all((tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes() for f in files)
    mask = np.asarray(Image.open(tmp_path / "a" / "masks" / "train" / "0000.png"))
    img = np.asarray(Image.open(tmp_path / "a" / "images" / "train" / "0000.png")).astype(int)
    assert mask.shape == (64, 64) and 0 < (mask > 0).mean() < 1 and mask.max() <= 10
    for c in np.unique(mask[mask > 0]):  # a shape's pixels carry its class colour (+/-12 and anti-aliasing)
        inside = img[mask == c]
        assert (np.abs(inside - COLORS[c - 1]).max(1) < 40).mean() > 0.8
    monkeypatch.setenv("LIBREYOLO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(shapes_seg, "DEFAULTS", {"train": 4, "val": 2, "size": 48, "seed": 0})
    data = load_segment_data("shapes-seg")
    assert data.names == shapes_seg.SEG_NAMES and (len(data.train), len(data.val)) == (4, 2)


def test_folder_form_takes_its_classes_from_the_masks(tmp_path):
    data = load_segment_data(make_folder(tmp_path / "ds", nc=4))
    assert data.names == ["class0", "class1", "class2", "class3"] and (len(data.train), len(data.val)) == (3, 2)
    assert data.train[0][1] == tmp_path / "ds" / "masks" / "train" / "0.png"


def test_yaml_form_maps_its_ignore_value_and_reduces_zero(tmp_path):
    root = make_folder(tmp_path / "ds", mask_mode="P")  # palette masks: the indices are the ids
    raw = {"path": str(root), "train": "images/train", "val": "images/val", "names": ["a", "b"],
           "ignore_index": 0, "reduce_zero_label": True}
    (root / "d.yaml").write_text(yaml.safe_dump(raw))
    # 0 is this dataset's unlabelled value (and reduce_zero_label's); 1, 2 -> 0, 1.
    data = load_segment_data(root / "d.yaml")
    assert data.names == ["a", "b"] and data.mask_ignore == 0 and data.reduce_zero_label
    batch = next(iter(build_segment_val_loader(data, cfg(imgsz=48), batch=2)))
    raw_mask = np.asarray(Image.open(data.val[0][1]))
    want = resize_nearest(torch.from_numpy(np.where(raw_mask == 0, 255, raw_mask.astype(int) - 1)), 48, 48)
    assert torch.equal(batch.targets.masks[0].long(), want)


def test_ade20k_layout_ignores_other_and_names_its_150_classes(tmp_path):
    root = tmp_path / "ADEChallengeData2016"
    for split in ("training", "validation"):
        mask = np.zeros((20, 24), np.uint8)
        mask[:, 8:] = 1
        mask[:, 16:] = 150
        _save(root / "images" / split / "ADE_0.jpg", COLOURS[(mask > 0).astype(int) + (mask > 1)])
        _save(root / "annotations" / split / "ADE_0.png", mask)
    lines = ["Idx\tRatio\tTrain\tVal\tName"] + [f"{i}\t0.1\t1\t1\tthing{i};other{i}" for i in range(1, 151)]
    (root / "objectInfo150.txt").write_text("\n".join(lines))
    data = load_segment_data(root)
    assert data.nc == 150 and data.names[0] == "thing1" and data.names[-1] == "thing150" and data.reduce_zero_label
    masks = next(iter(build_segment_val_loader(data, cfg(imgsz=24), batch=1))).targets.masks[0]
    assert masks[0, 0] == 255 and masks[0, 8] == 0 and masks[0, 16] == 149


def test_cityscapes_layout_pairs_train_ids(tmp_path):
    root = tmp_path / "cityscapes"
    for split in ("train", "val"):
        img, mask = _scene(1)
        _save(root / "leftImg8bit" / split / "aachen" / "aachen_000000_000019_leftImg8bit.png", img)
        _save(root / "gtFine" / split / "aachen" / "aachen_000000_000019_gtFine_labelTrainIds.png", mask)
        _save(root / "gtFine" / split / "aachen" / "aachen_000000_000019_gtFine_labelIds.png", mask + 7)
    data = load_segment_data(root)
    assert data.nc == 19 and data.names[0] == "road" and data.names[-1] == "bicycle"
    assert data.train[0][1].name == "aachen_000000_000019_gtFine_labelTrainIds.png"
    next(root.glob("gtFine/val/aachen/*labelTrainIds.png")).unlink()
    with pytest.raises(DataError, match="val: 1 image.* have no mask: .*leftImg8bit.png .*createTrainIdLabelImgs"):
        load_segment_data(root)


# --------------------------------------------------------------------------- bad masks
def _bad(tmp_path, change) -> str:
    root = make_folder(tmp_path / "ds")
    change(root)
    with pytest.raises(DataError) as err:
        load_segment_data(root)
    message = str(err.value)
    assert "\n" not in message
    return message


def test_a_mask_of_another_size_names_both_files(tmp_path):
    said = _bad(tmp_path, lambda r: _save(r / "masks" / "train" / "1.png", np.zeros((20, 48), np.uint8)))
    assert said.startswith("train: mask ") and "masks/train/1.png is 48x20 but its image" in said and "48x40" in said


@pytest.mark.parametrize("more", [False, True])
def test_a_class_id_out_of_range_names_the_mask(tmp_path, more):
    def change(root):
        (root / "d.yaml").write_text(yaml.safe_dump({"path": str(root), "train": "images/train",
                                                    "val": "images/val", "names": ["a", "b", "c"]}))
        mask = np.zeros((40, 48), np.uint8)
        mask[3, 3] = 7
        _save(root / "masks" / "val" / "0.png", mask)
        if more:
            _save(root / "masks" / "val" / "1.png", mask)

    root = make_folder(tmp_path / "ds")
    change(root)
    with pytest.raises(DataError, match=r"^val: mask .*masks/val/0.png holds class id 7, but the dataset has 3 "
                                        r"classes \(0..2\) and marks unlabelled pixels 255"
                                        + (r" \(1 more mask\(s\) have problems too\)$" if more else "$")):
        load_segment_data(root / "d.yaml")


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "LA"])
def test_a_colour_mask_is_refused(tmp_path, mode):
    def change(root):
        Image.new(mode, (48, 40)).save(root / "masks" / "train" / "2.png")

    said = _bad(tmp_path, change)
    assert "masks/train/2.png is " + mode in said and "one channel of class ids" in said


def test_a_one_bit_mask_reads_as_classes_0_and_1(tmp_path):
    root = make_folder(tmp_path / "ds", counts=(("train", 1), ("val", 1)), nc=2)
    path = root / "masks" / "val" / "0.png"
    want = np.asarray(Image.open(path)).copy()
    _save(path, want > 0)  # PIL saves a bool array as a 1-bit ('1') PNG
    assert Image.open(path).mode == "1"
    data = load_segment_data(root)
    assert data.names == ["class0", "class1"]
    masks = next(iter(build_segment_val_loader(data, cfg(imgsz=48), batch=1))).targets.masks
    assert torch.equal(masks[0], resize_nearest(torch.from_numpy(want), 48, 48))


def test_a_missing_mask_names_the_image_and_the_expected_file(tmp_path):
    said = _bad(tmp_path, lambda r: (r / "masks" / "val" / "1.png").unlink())
    assert said.startswith("val: 1 image(s) have no mask: ") and "images/val/1.png (expected " in said
    assert "masks/val/1.png" in said


def test_an_undecodable_mask_is_named(tmp_path):
    def change(root):
        path = root / "masks" / "train" / "0.png"
        path.write_bytes(path.read_bytes()[:40])

    said = _bad(tmp_path, change)
    assert said.startswith("train: mask ") and "masks/train/0.png does not decode" in said


def test_ignore_index_may_not_be_a_class_id(tmp_path):
    data = load_segment_data(make_folder(tmp_path / "ds"))
    with pytest.raises(ConfigError, match=r"ignore_index=2 is a class id of ds \(3 classes, 0..2\)"):
        build_segment_train_loader(data, cfg(ignore_index=2))


# --------------------------------------------------------------------------- loaders
def test_training_keeps_image_and_mask_aligned_and_pads_with_ignore(tmp_path):
    data = load_segment_data(make_folder(tmp_path / "ds", counts=(("train", 2), ("val", 1))))
    ds = SegTrainDataset(data, cfg(imgsz=64, resize_min=0.3, resize_max=1.5))
    padded = 0
    for epoch in range(6):
        img, mask = ds[SampleKey(epoch % 2, epoch, 0.0, 0.0, 64)]
        assert img.shape == (3, 64, 64) and mask.shape == (64, 64) and mask.dtype == torch.uint8
        pad = mask == 255
        padded += int(pad.any())
        assert (img.permute(1, 2, 0)[pad] == 0).all()
        # Away from the edges (a 5x5 neighbourhood of one class), every pixel has its class's colour.
        m = mask[None, None].float()
        inner = (F.max_pool2d(m, 5, 1, 2) == -F.max_pool2d(-m, 5, 1, 2))[0, 0] & ~pad
        colours = torch.from_numpy(COLOURS.astype(np.int64))[mask[inner].long()]
        assert inner.sum() > 500 and (img.permute(1, 2, 0)[inner].long() - colours).abs().max() < 8
    assert padded  # a ratio below imgsz / 40 px pads some samples


def test_a_sample_is_reproducible_and_jitter_touches_the_image_only(tmp_path):
    data = load_segment_data(make_folder(tmp_path / "ds", counts=(("train", 2), ("val", 1))))
    plain = SegTrainDataset(data, cfg())
    jitter = SegTrainDataset(data, cfg(hsv_v=0.5, hsv_s=0.5))
    key = SampleKey(1, 3, 0.0, 0.0, 32)
    a, b = plain[key], plain[key]
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(plain[key][1], plain[SampleKey(1, 4, 0.0, 0.0, 32)][1])
    c = jitter[key]
    assert torch.equal(c[1], a[1]) and not torch.equal(c[0], a[0])


def test_validation_resizes_to_imgsz_and_batches_widen_on_the_device(tmp_path):
    data = load_segment_data(make_folder(tmp_path / "ds"))
    batch = next(iter(build_segment_val_loader(data, cfg(imgsz=32), batch=2)))
    assert isinstance(batch, SegBatch) and batch.images.shape == (2, 3, 32, 32) and batch.images.dtype == torch.uint8
    mask = torch.from_numpy(np.asarray(Image.open(data.val[0][1])).copy())
    assert torch.equal(batch.targets.masks[0], resize_nearest(mask, 32, 32)) and batch.targets.masks.dtype == torch.uint8
    assert batch.to("cpu").targets.masks.dtype == torch.int64
    task = get_task("segment")
    again = task.unpack_batch(task.pack_batch(batch), False)
    assert torch.equal(again.images, batch.images) and torch.equal(again.targets.masks, batch.targets.masks)


def test_resize_nearest_samples_pixel_centres():
    m = torch.arange(4).reshape(2, 2)
    assert resize_nearest(m, 4, 4).tolist() == [[0, 0, 1, 1], [0, 0, 1, 1], [2, 2, 3, 3], [2, 2, 3, 3]]
    assert resize_nearest(torch.arange(16).reshape(4, 4), 2, 2).tolist() == [[5, 7], [13, 15]]


def test_two_ranks_load_the_single_process_batches(tmp_path):
    data = load_segment_data(make_folder(tmp_path / "ds", counts=(("train", 5), ("val", 1))))
    c = cfg(batch=4)
    one = list(build_segment_train_loader(data, c))
    ranks = [list(build_segment_train_loader(data, c, rank, 2)) for rank in (0, 1)]
    assert len(one) == 2 and len(ranks[0]) == len(ranks[1]) == 1  # the 1-image tail is left out on 2 ranks
    for i, batch in enumerate(one[:1]):
        assert torch.equal(torch.cat([r[i].images for r in ranks]), batch.images)
        assert torch.equal(torch.cat([r[i].targets.masks for r in ranks]), batch.targets.masks)
    assert isinstance(one[0].targets, SegTargets)


def test_sixteen_bit_masks_carry_more_than_255_classes(tmp_path):
    root = make_folder(tmp_path / "ds", counts=(("train", 1), ("val", 1)))
    for split in ("train", "val"):
        mask = np.zeros((40, 48), np.uint16)
        mask[:, 24:] = 299
        _save(root / "masks" / split / "0.png", mask)
    data = load_segment_data(root)
    assert data.nc == 300
    with pytest.raises(ConfigError, match="ignore_index=255 is a class id"):
        build_segment_val_loader(data, cfg())
    masks = next(iter(build_segment_val_loader(data, cfg(imgsz=48, ignore_index=65535), batch=1))).targets.masks
    assert masks.dtype == torch.int64 and masks[0, 0, 0] == 0 and masks[0, 0, 47] == 299


def test_the_no_dataset_help_names_the_yaml_keys_the_loader_reads():
    keys = re.findall(r"\(([^()]*)\)", get_task("segment").data_help)[-1].split(", ")
    packaged = Path(shapes_seg.__file__).parent.parent / "configs" / "datasets" / "shapes-seg.yaml"
    assert "train_masks" in keys and set(keys) <= set(yaml.safe_load(packaged.read_text()))


def test_a_detection_set_is_refused_in_one_line():
    with pytest.raises(DataError, match="shapes is a detection dataset: .* pick a segmentation dataset \\(e.g. shapes-seg\\)"):
        load_segment_data("shapes")
