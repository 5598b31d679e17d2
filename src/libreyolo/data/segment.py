"""Semantic segmentation data: images with single-channel class masks, their checks, loaders and
batches.

A mask is a PNG whose pixel values are class ids: 8-bit grey ('L') or palette ('P', whose indices
are the ids, whatever colours the palette shows), 16-bit grey for more than 255 classes, or 1-bit
('1', classes 0 and 1: what PIL saves a bool array as). The dataset's unlabelled pixels hold its
ignore value (255 unless a yaml says `ignore_index`); the loader maps them to the run's
`ignore_index` key (default 255), which is also the padding of crops, what the loss skips and what
the evaluator does not count. Forms of `data=`:

- a built-in name: `shapes-seg` (generated on first use, shapes_seg.py);
- a folder with images/{train,val}/ and masks/{train,val}/: each image's mask has the same path
  relative to its split with a .png suffix; the classes are 0..max id found in the masks;
- an ADE20K folder (ADEChallengeData2016: images/{training,validation}/*.jpg +
  annotations/{training,validation}/*.png): 150 classes, mask value 0 ("other") ignored and the
  rest shifted down by one (`reduce_zero_label`, as mmsegmentation's ADE20K config), class names
  from its objectInfo150.txt;
- a Cityscapes folder (leftImg8bit/{train,val}/<city>/*_leftImg8bit.png +
  gtFine/{train,val}/<city>/*_gtFine_labelTrainIds.png, the 19 training classes, 255 ignored);
- a yaml: `path`, `train`, `val` (image folders relative to path), `train_masks`, `val_masks`
  (default: the image folder with its `images` component renamed `masks`), optional `names`,
  `ignore_index` (the masks' unlabelled value), `reduce_zero_label`, `task: segment`.

Every mistake is one DataError line raised while scanning, before any training starts, naming the
first bad file (and how many more): an image without its mask, a file that does not decode, a
mask that is not single-channel (RGB, RGBA, grey + alpha), a mask whose size differs from its
image's, a class id the dataset does not have (and not the ignore value). The scan decodes every
mask once (a thread pool; PIL releases the GIL while decoding), which also gives the class count
of the folder form. A file that breaks after the scan is one DataError line when it is loaded.

Training (per sample, seeded from (seed, epoch, index) as classify.py does, so any worker count or
rank gives the same sample): the short side is resized to imgsz x r, r uniform in [resize_min,
resize_max] (image bilinear, mask nearest), padded to at least imgsz (image 0, mask ignore_index)
and cropped to a random imgsz x imgsz window, then flipped (fliplr) and colour-jittered (hsv_*,
the image only): mmsegmentation's RandomResize + RandomCrop + RandomFlip + PhotoMetricDistortion,
without the crop's category-ratio retry. Validation and predict resize image (bilinear) and mask
(nearest) to imgsz x imgsz, so mIoU is measured at imgsz x imgsz.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF

from ..errors import ConfigError, DataError
from ..families.segment import IGNORE_INDEX
from .classify import VAL_FOLDERS, ClassTrainLoader, ClassValLoader, _Unreadable, image_ok, sample_seed
from .dataset import SampleKey, decode_rgb
from .dataset_yaml import (
    IMAGE_SUFFIXES,
    _materialise,
    _parse_names,
    _resolve_root,
    read_task_yaml,
)

log = logging.getLogger("libreyolo")

# Single-channel integer PNGs; "1" is a 1-bit mask (PIL's mode for a saved bool array), read as 0/1.
MASK_MODES = ("1", "L", "P", "I;16", "I;16L", "I;16B", "I")
ADE20K_CLASSES = 150  # the SceneParsing benchmark's classes (CSAILVision/sceneparsing)
# Cityscapes' 19 training classes, in trainId order (cityscapesscripts helpers/labels.py).
CITYSCAPES_NAMES = ["road", "sidewalk", "building", "wall", "fence", "pole", "traffic light", "traffic sign",
                    "vegetation", "terrain", "sky", "person", "rider", "car", "truck", "bus", "train", "motorcycle",
                    "bicycle"]
CITYSCAPES_IMAGE, CITYSCAPES_MASK = "_leftImg8bit.png", "_gtFine_labelTrainIds.png"


class SegTargets(NamedTuple):
    masks: torch.Tensor  # [B, S, S] class ids, ignore_index where ignored or padded

    def to(self, device: torch.device | str, non_blocking: bool = False) -> SegTargets:
        """On `device`, as int64 (a uint8 mask crosses the bus as one byte a pixel, then widens there)."""
        return SegTargets(self.masks.to(device, non_blocking=non_blocking).long())


class SegBatch(NamedTuple):
    images: torch.Tensor  # uint8 [B, 3, S, S]; the step does .float() / 255 on the device
    targets: SegTargets   # masks uint8 when every id and the ignore index fit a byte, else int64

    def to(self, device: torch.device | str, non_blocking: bool = False) -> SegBatch:
        return SegBatch(self.images.to(device, non_blocking=non_blocking), self.targets.to(device, non_blocking))


@dataclass
class SegmentData:
    """A scanned segmentation dataset: (image, mask) pairs of each split, in file order."""

    name: str
    root: Path
    names: list[str]  # index = class id
    train: list[tuple[Path, Path]]
    val: list[tuple[Path, Path]]
    yaml_path: Path | None = None
    mask_ignore: int = IGNORE_INDEX     # the masks' unlabelled value (mapped to the run's ignore_index)
    reduce_zero_label: bool = False     # mask 0 is unlabelled, the rest shift down by one

    @property
    def nc(self) -> int:
        return len(self.names)


class _Layout(NamedTuple):
    """Where a dataset's splits are and how its files read: what each form resolves to."""

    name: str
    root: Path
    splits: tuple[tuple[Path, Path], tuple[Path, Path]]  # (images, masks) of train, val
    names: list[str] | None
    mask_ignore: int = IGNORE_INDEX
    reduce_zero_label: bool = False
    cityscapes: bool = False
    yaml_path: Path | None = None


def load_segment_data(data: str | os.PathLike) -> SegmentData:
    """Resolve and scan `data`: a dataset folder (plain, ADE20K or Cityscapes), a yaml or a built-in."""
    return _scan(_resolve(str(data)))


def _resolve(text: str) -> _Layout:
    path = Path(text).expanduser()
    if path.is_dir():
        return _folder_layout(path.resolve())
    yaml_path, raw, packaged = read_task_yaml(text, "segment", "a folder with images/ and masks/")
    names = _parse_names(raw, yaml_path) if "names" in raw else None
    root = _resolve_root(raw, yaml_path, packaged)
    splits = tuple(_yaml_split(raw, s, root, yaml_path) for s in ("train", "val"))
    ignore = raw.get("ignore_index", IGNORE_INDEX)
    if not isinstance(ignore, int) or isinstance(ignore, bool) or not 0 <= ignore <= 65535:
        raise DataError(f"dataset yaml {yaml_path}: ignore_index must be an integer in 0..65535, not {ignore!r}")
    reduce = raw.get("reduce_zero_label", False)
    if not isinstance(reduce, bool):
        raise DataError(f"dataset yaml {yaml_path}: reduce_zero_label must be true or false, not {reduce!r}")
    _materialise(raw, root, text)
    return _Layout(text if packaged else yaml_path.stem, root, splits, names, ignore, reduce, yaml_path=yaml_path)


def _folder_layout(root: Path) -> _Layout:
    if (root / "images" / "training").is_dir() and (root / "annotations" / "training").is_dir():
        splits = ((root / "images" / "training", root / "annotations" / "training"),
                  (root / "images" / "validation", root / "annotations" / "validation"))
        return _Layout(root.name, root, splits, _ade20k_names(root), reduce_zero_label=True)
    if (root / "leftImg8bit").is_dir() and (root / "gtFine").is_dir():
        splits = tuple((root / "leftImg8bit" / s, root / "gtFine" / s) for s in ("train", "val"))
        return _Layout(root.name, root, splits, list(CITYSCAPES_NAMES), cityscapes=True)
    if (root / "images").is_dir() and (root / "masks").is_dir():
        val = next((v for v in VAL_FOLDERS if (root / "images" / v).is_dir()), VAL_FOLDERS[0])
        return _Layout(root.name, root, tuple((root / "images" / s, root / "masks" / s) for s in ("train", val)), None)
    raise DataError(f"{root} is not a segmentation dataset folder: expected images/{{train,val}}/ with "
                    f"masks/{{train,val}}/, ADE20K's images/training/ with annotations/training/, or Cityscapes' "
                    f"leftImg8bit/ with gtFine/")


def _ade20k_names(root: Path) -> list[str]:
    """ADE20K's class names from its objectInfo150.txt (Idx, Ratio, Train, Val, Name; tab-separated,
    the first of a name's synonyms), or class0..class149 without that file."""
    info = root / "objectInfo150.txt"
    names: list[str] = []
    if info.is_file():
        lines = info.read_text(encoding="utf-8", errors="replace").splitlines()[1:]
        names = [ln.split("\t")[-1].split(";")[0].split(",")[0].strip() for ln in lines if ln.strip()]
    return names if len(names) == ADE20K_CLASSES else [f"class{i}" for i in range(ADE20K_CLASSES)]


def _yaml_split(raw: dict, split: str, root: Path, where: Path) -> tuple[Path, Path]:
    entry = raw.get(split)
    if entry is None or entry == "" or entry == []:
        raise DataError(f"dataset yaml {where}: '{split}' is missing")
    if not isinstance(entry, str):
        raise DataError(f"dataset yaml {where}: '{split}' must be one image folder (relative to path), "
                        f"not {type(entry).__name__} {entry!r}")
    masks = raw.get(f"{split}_masks")
    if masks is None:
        parts = Path(entry).parts
        if "images" not in parts:
            raise DataError(f"dataset yaml {where}: '{split}_masks' is missing (the mask folder of {entry}; it "
                            f"defaults to the image folder with 'images' renamed 'masks')")
        i = parts.index("images")
        masks = str(Path(*parts[:i], "masks", *parts[i + 1:]))
    if not isinstance(masks, str):
        raise DataError(f"dataset yaml {where}: '{split}_masks' must be one folder, not {masks!r}")
    return root / entry, root / masks


# --------------------------------------------------------------------------- the scan
def _scan(layout: _Layout) -> SegmentData:
    """List both splits' pairs, then check every file; all cheap checks run before any decode."""
    pairs = [_pairs(split, images, masks, layout.cityscapes)
             for split, (images, masks) in zip(("train", "val"), layout.splits)]
    known = layout.names
    found = [_check_files(split, layout, p, known) for split, p in zip(("train", "val"), pairs)]
    if known is None and max(found) < 0:
        raise DataError(f"{layout.root}: every mask pixel is unlabelled ({layout.mask_ignore}): no classes to learn")
    # The folder form's classes are what its masks hold: 0 .. the highest id found.
    names = known if known is not None else [f"class{i}" for i in range(max(found) + 1)]
    log.info("%s: train %d images, val %d images, %d classes", layout.name, len(pairs[0]), len(pairs[1]), len(names))
    return SegmentData(layout.name, layout.root, names, pairs[0], pairs[1], layout.yaml_path, layout.mask_ignore,
                       layout.reduce_zero_label)


def _pairs(split: str, images: Path, masks: Path, cityscapes: bool) -> list[tuple[Path, Path]]:
    """(image, mask) for every image under `images`, in path order; a missing mask is an error."""
    for what, folder in (("images", images), ("masks", masks)):
        if not folder.is_dir():
            raise DataError(f"{split}: {what} folder {folder} not found")
    suffixes = (CITYSCAPES_IMAGE,) if cityscapes else IMAGE_SUFFIXES
    files = sorted(p for p in images.rglob("*") if p.name.lower().endswith(tuple(s.lower() for s in suffixes))
                   and not any(part.startswith(".") for part in p.relative_to(images).parts) and p.is_file())
    if not files:
        raise DataError(f"{split}: no images ({', '.join(suffixes)}) in {images}")
    out, missing = [], []
    for p in files:
        rel = p.relative_to(images)
        mask = masks / (str(rel)[: -len(CITYSCAPES_IMAGE)] + CITYSCAPES_MASK if cityscapes
                        else rel.with_suffix(".png"))
        (out if mask.is_file() else missing).append((p, mask))
    if missing:
        img, mask = missing[0]
        hint = " (Cityscapes' trainId masks are made by cityscapesscripts' createTrainIdLabelImgs)" if cityscapes else ""
        raise DataError(f"{split}: {len(missing)} image(s) have no mask: {img} (expected {mask}){_more(missing)}; "
                        f"add the masks or remove the images{hint}")
    return out


def _more(items: list) -> str:
    return f" and {len(items) - 1} more" if len(items) > 1 else ""


def _check_files(split: str, layout: _Layout, pairs: list[tuple[Path, Path]], names: list[str] | None) -> int:
    """Every pair checked (see `check_pair`), on a thread pool; the highest class id found (-1: none)."""
    nc = len(names) if names is not None else None
    threads = min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(threads) as pool:
        results = list(pool.map(lambda p: check_pair(*p, layout.mask_ignore, layout.reduce_zero_label, nc), pairs))
    bad = [(pair, problem) for pair, (problem, _) in zip(pairs, results) if problem is not None]
    if bad:
        also = f" ({len(bad) - 1} more mask(s) have problems too)" if len(bad) > 1 else ""
        raise DataError(f"{split}: {bad[0][1]}{also}")
    return max((top for _, top in results), default=-1)


def check_pair(image: Path, mask: Path, mask_ignore: int, reduce_zero_label: bool,
               nc: int | None) -> tuple[str | None, int]:
    """(what is wrong with this pair, or None; the highest class id its mask holds, -1 for none)."""
    from PIL import Image

    if not image_ok(image):
        return f"image {image} does not decode (truncated or not an image); replace or delete it", -1
    if not image_ok(mask):
        return f"mask {mask} does not decode (truncated or not an image); replace or delete it", -1
    try:
        with Image.open(image) as im:
            size = im.size
        with Image.open(mask) as m:
            if m.mode not in MASK_MODES:
                return (f"mask {mask} is {m.mode} ({len(m.getbands())} channels): a class mask is one channel of "
                        f"class ids (8-bit grey, palette or 1-bit PNG; 16-bit grey for more classes)"), -1
            if m.size != size:
                return (f"mask {mask} is {m.size[0]}x{m.size[1]} but its image {image} is {size[0]}x{size[1]}; "
                        f"a mask labels its image pixel for pixel"), -1
            raw = np.asarray(m)
    except Exception:  # PIL raises many types for a bad file
        return f"{mask} does not decode (truncated or not an image); replace or delete it", -1
    ids, ignored = _ids(raw, mask_ignore, reduce_zero_label)
    labelled = ids[~ignored]
    top = int(labelled.max()) if labelled.size else -1
    if nc is not None and top >= nc:
        shift = " after reduce_zero_label's shift" if reduce_zero_label else ""
        return (f"mask {mask} holds class id {top}{shift}, but the dataset has {nc} classes (0..{nc - 1}) and marks "
                f"unlabelled pixels {mask_ignore}"), top
    return None, top


def _ids(raw: np.ndarray, mask_ignore: int, reduce_zero_label: bool) -> tuple[np.ndarray, np.ndarray]:
    """(class ids int32, unlabelled bool) of a decoded mask: the dataset's ignore value, and with
    reduce_zero_label 0, are unlabelled; reduce_zero_label shifts the rest down by one."""
    ids = raw.astype(np.int32)
    ignored = ids == mask_ignore
    if reduce_zero_label:
        ignored |= ids == 0
        ids = ids - 1
    return ids, ignored


# --------------------------------------------------------------------------- samples
@dataclass(frozen=True)
class _Encoding:
    """How a decoded mask becomes a training mask: the dataset's conventions and the run's ignore."""

    mask_ignore: int
    reduce_zero_label: bool
    nc: int
    ignore_index: int

    @property
    def dtype(self) -> torch.dtype:
        return torch.uint8 if max(self.nc - 1, self.ignore_index) <= 255 else torch.int64


def _encoding(data: SegmentData, cfg) -> _Encoding:
    ignore = int(cfg.ignore_index)
    if ignore < data.nc:
        raise ConfigError(f"ignore_index={ignore} is a class id of {data.name} ({data.nc} classes, 0..{data.nc - 1}): "
                          f"pick a value >= {data.nc} ({IGNORE_INDEX} is the convention)")
    return _Encoding(data.mask_ignore, data.reduce_zero_label, data.nc, ignore)


def load_pair(image: Path, mask: Path, enc: _Encoding) -> tuple[torch.Tensor, torch.Tensor] | _Unreadable:
    """(RGB uint8 [3, h, w], mask [h, w] in the run's encoding), or _Unreadable when a file no longer
    reads as the scan found it."""
    from PIL import Image

    img = decode_rgb(image)
    if img is None:
        return _Unreadable(str(image))
    try:
        with Image.open(mask) as m:
            raw = np.asarray(m) if m.mode in MASK_MODES else None
    except Exception:  # as check_pair
        raw = None
    if raw is None or raw.shape != tuple(img.shape[-2:]):
        return _Unreadable(str(mask))
    ids, ignored = _ids(raw, enc.mask_ignore, enc.reduce_zero_label)
    if (ids[~ignored] >= enc.nc).any():
        return _Unreadable(str(mask))
    out = np.where(ignored, enc.ignore_index, ids)
    return img, torch.from_numpy(out.astype(np.uint8 if enc.dtype == torch.uint8 else np.int64))


def resize_nearest(mask: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """`mask` [H, W] resized to [h, w] by nearest neighbour at pixel centres (any integer dtype)."""
    H, W = mask.shape[-2:]
    if (H, W) == (h, w):
        return mask
    rows = ((torch.arange(h, dtype=torch.float64) + 0.5) * (H / h)).long().clamp_(max=H - 1)
    cols = ((torch.arange(w, dtype=torch.float64) + 0.5) * (W / w)).long().clamp_(max=W - 1)
    return mask[..., rows, :][..., cols]


def resize_for_inference(img: torch.Tensor, imgsz: int) -> torch.Tensor:
    """An RGB uint8 image as validation and predict feed a segmentation network: imgsz x imgsz, bilinear."""
    return TF.resize(img, [imgsz, imgsz], antialias=True)


class SegTrainDataset(torch.utils.data.Dataset):
    """Random resize (short side imgsz x U(resize_min, resize_max)) -> pad -> random imgsz crop ->
    flip -> colour jitter (image only), keyed by SampleKey (see the module doc)."""

    def __init__(self, data: SegmentData, cfg):
        self.pairs, self.enc = data.train, _encoding(data, cfg)
        self.imgsz, self.seed, self.flip = int(cfg.imgsz), int(cfg.seed), float(cfg.fliplr)
        self.ratio = (float(cfg.resize_min), float(cfg.resize_max))
        if self.ratio[0] > self.ratio[1]:
            raise ConfigError(f"resize_min={self.ratio[0]:g} is above resize_max={self.ratio[1]:g}")
        jitter = dict(brightness=float(cfg.hsv_v), saturation=float(cfg.hsv_s), hue=min(float(cfg.hsv_h), 0.5))
        self.jitter = v2.ColorJitter(**jitter) if any(jitter.values()) else None

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, key: SampleKey):
        loaded = load_pair(*self.pairs[key.index], self.enc)
        if isinstance(loaded, _Unreadable):
            return loaded
        img, mask = loaded
        seed = sample_seed(self.seed, key.epoch, key.index)
        rng = np.random.default_rng(seed)
        s = self.imgsz
        h, w = mask.shape
        scale = s * rng.uniform(*self.ratio) / min(h, w)
        nh, nw = max(1, round(h * scale)), max(1, round(w * scale))
        img = TF.resize(img, [nh, nw], antialias=True)
        mask = resize_nearest(mask, nh, nw)
        ph, pw = max(s - nh, 0), max(s - nw, 0)
        if ph or pw:  # right and bottom, as mmsegmentation's Pad
            img = torch.nn.functional.pad(img, (0, pw, 0, ph), value=0)
            mask = torch.nn.functional.pad(mask, (0, pw, 0, ph), value=self.enc.ignore_index)
        y0, x0 = int(rng.integers(0, mask.shape[0] - s + 1)), int(rng.integers(0, mask.shape[1] - s + 1))
        img, mask = img[:, y0:y0 + s, x0:x0 + s], mask[y0:y0 + s, x0:x0 + s]
        if rng.random() < self.flip:
            img, mask = img.flip(-1), mask.flip(-1)
        if self.jitter is not None:
            with torch.random.fork_rng(devices=[]):  # v2 draws from torch's generator (classify.py)
                torch.default_generator.manual_seed(seed)
                img = self.jitter(img)
        return img.contiguous(), mask.contiguous()


class SegValDataset(torch.utils.data.Dataset):
    """Image (bilinear) and mask (nearest) resized to imgsz x imgsz; no randomness."""

    def __init__(self, data: SegmentData, cfg):
        self.pairs, self.enc, self.imgsz = data.val, _encoding(data, cfg), int(cfg.imgsz)
        self.files = [p for p, _ in self.pairs]

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int):
        loaded = load_pair(*self.pairs[i], self.enc)
        if isinstance(loaded, _Unreadable):
            return loaded
        img, mask = loaded
        return resize_for_inference(img, self.imgsz), resize_nearest(mask, self.imgsz, self.imgsz)


def collate(items) -> SegBatch | _Unreadable:
    bad = next((it for it in items if isinstance(it, _Unreadable)), None)
    if bad is not None:
        return bad
    return SegBatch(torch.stack([it[0] for it in items]), SegTargets(torch.stack([it[1] for it in items])))


class SegTrainLoader(ClassTrainLoader):
    """Iterable of training SegBatches; call `set_epoch(epoch)` at each epoch start (classify.py's
    loader: the same sampling, multi-process sharding, seeding and pinning)."""

    collate_fn = staticmethod(collate)


class SegValLoader(ClassValLoader):
    """Iterable of validation SegBatches in file order."""

    collate_fn = staticmethod(collate)


def build_segment_train_loader(data: SegmentData, cfg, rank: int = 0, world_size: int = 1) -> SegTrainLoader:
    """The training loader; under multi-process training, rank's share of every global batch."""
    if getattr(cfg, "cache", False) not in (False, "auto"):  # auto: nothing to say where no cache applies
        log.info("cache=%s is not used for segmentation: images and masks are read from their files", cfg.cache)
    if getattr(cfg, "multi_scale", False):
        log.info("multi_scale=true is not used for segmentation: the random resize already varies the scale, and "
                 "every batch is imgsz=%d", cfg.imgsz)
    return SegTrainLoader(SegTrainDataset(data, cfg), cfg, rank, world_size)


def build_segment_val_loader(data: SegmentData, cfg, batch: int | None = None) -> SegValLoader:
    return SegValLoader(SegValDataset(data, cfg), cfg, int(batch or cfg.batch))


def build_segment_stats_loader(data: SegmentData, cfg, train_loader, images: int, batch: int) -> SegValLoader:
    """`images` training pairs spread evenly over the split, resized as validation loads them, read
    in the main process: where precise_bn measures BatchNorm's statistics."""
    from .loader import spread

    picked = dataclasses.replace(data, val=[data.train[i] for i in spread(len(data.train), images)])
    return SegValLoader(SegValDataset(picked, cfg), dataclasses.replace(cfg, workers=0), int(batch))
