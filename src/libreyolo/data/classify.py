"""Image classification data: class-folder datasets, their checks, loaders and batches.

A dataset is `train/<class>/<image>` and `val/<class>/<image>` (the layout torchvision's
ImageFolder reads): class ids are the train class-folder names in sorted order, val uses the same
ids. It comes as the folder itself (val may be `valid/` or `test/`), a dataset yaml (`path`,
`train`, `val`, optional `names`, which must then equal the class folders) or a built-in name
(`shapes-cls`, generated on first use; see dataset_yaml.py for roots and built-ins). Names
starting with a dot are skipped: `.ipynb_checkpoints/` and macOS `._x.jpg` files are not data.

Every mistake is one DataError line raised while scanning, before any training starts: a missing
split, a split without class folders, an empty class folder, a val class train does not have, a
file that does not decode. The decode check is cheap (signature + end marker, see `image_ok`);
a file that breaks after the scan is one DataError line when it is loaded.

Batches mirror the detection loaders (loader.py): uint8 images [B, 3, S, S] plus int64 labels.
Training reuses `EpochBatchSampler` (per-(seed, epoch) order, multi-process sharding) and seeds
each sample's augmentation from (seed, epoch, index), so a sample is augmented alike whatever
the worker count or rank.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF

from ..errors import DataError
from .dataset import SampleKey, decode_rgb
from .dataset_yaml import (
    IMAGE_SUFFIXES,
    _materialise,
    _parse_names,
    _resolve_root,
    read_task_yaml,
)
from .loader import EpochBatchSampler, EpochLoader, _dataloader, _one_thread

log = logging.getLogger("libreyolo")

VAL_FOLDERS = ("val", "valid", "test")  # the folder form's validation split, first found wins
NAMED = 3  # how many bad files an error names; the rest are counted
# Validation resizes the short side to imgsz / CROP_FRACTION, then centre-crops imgsz: the
# convention of the torchvision reference scripts (resize 256, crop 224 = 0.875).
CROP_FRACTION = 0.875


class ClassTargets(NamedTuple):
    labels: torch.Tensor  # int64 [B] class ids

    def to(self, device: torch.device | str, non_blocking: bool = False) -> ClassTargets:
        return ClassTargets(self.labels.to(device, non_blocking=non_blocking))


class ClassBatch(NamedTuple):
    images: torch.Tensor  # uint8 [B, 3, S, S]; the step does .float() / 255 on the device
    targets: ClassTargets

    def to(self, device: torch.device | str, non_blocking: bool = False) -> ClassBatch:
        return ClassBatch(self.images.to(device, non_blocking=non_blocking),
                          self.targets.to(device, non_blocking))


@dataclass
class ClassifyData:
    """A scanned classification dataset: (image, class id) pairs of each split, in file order."""

    name: str
    root: Path
    names: list[str]  # the train split's class folders, sorted; index = class id
    train: list[tuple[Path, int]]
    val: list[tuple[Path, int]]
    yaml_path: Path | None = None  # None for the folder form

    @property
    def nc(self) -> int:
        return len(self.names)


def load_classify_data(data: str | os.PathLike) -> ClassifyData:
    """Resolve and scan `data`: a dataset folder, a dataset yaml or a built-in name."""
    text = str(data)
    path = Path(text).expanduser()
    if path.is_dir():
        root = path.resolve()
        if not (root / "train").is_dir():
            raise DataError(f"no train/ folder in {root}: a classification dataset folder holds "
                            f"train/<class>/<image> and val/<class>/<image>")
        return _scan(root.name, root, root / "train", _val_folder(root), None, None)
    yaml_path, raw, packaged = read_task_yaml(text, "classify", "a folder with train/<class>/ images")
    names = _parse_names(raw, yaml_path) if "names" in raw else None
    root = _resolve_root(raw, yaml_path, packaged)
    splits = [_yaml_split(raw, s, root, yaml_path) for s in ("train", "val")]
    _materialise(raw, root, text)
    return _scan(text if packaged else yaml_path.stem, root, *splits, names, yaml_path)


def _val_folder(root: Path) -> Path:
    for name in VAL_FOLDERS:
        if (root / name).is_dir():
            if name != VAL_FOLDERS[0]:
                log.info("val: no val/ folder in %s, validating on %s/", root, name)
            return root / name
    raise DataError(f"no val/, valid/ or test/ folder in {root}: a classification dataset folder "
                    f"holds train/<class>/<image> and val/<class>/<image>")


def _yaml_split(raw: dict, split: str, root: Path, where: Path) -> Path:
    entry = raw.get(split)
    if entry is None or entry == "" or entry == []:
        raise DataError(f"dataset yaml {where}: '{split}' is missing")
    if not isinstance(entry, str):
        raise DataError(f"dataset yaml {where}: '{split}' must be one folder of class folders "
                        f"(relative to path), not {type(entry).__name__} {entry!r}")
    return root / entry


def _scan(name: str, root: Path, train_dir: Path, val_dir: Path, names: list[str] | None,
          yaml_path: Path | None) -> ClassifyData:
    """Check and list both splits; the cheap checks of both run before any file is opened."""
    classes = _class_folders("train", train_dir)
    val_classes = _class_folders("val", val_dir)
    if names is not None and names != classes:
        raise DataError(f"dataset yaml {yaml_path}: {_first_difference(names, classes)} "
                        f"(names must be the sorted class folders of {train_dir})")
    known = set(classes)
    stray = next((c for c in val_classes if c not in known), None)
    if stray is not None:
        raise DataError(f"val: class folder '{stray}' in {val_dir} is not a class of train "
                        f"({train_dir}): rename or remove it, or add it to train")
    ids = {c: i for i, c in enumerate(classes)}
    train = _list_images("train", train_dir, classes, ids)
    val = _list_images("val", val_dir, val_classes, ids)
    for split, folder, samples in (("train", train_dir, train), ("val", val_dir, val)):
        _check_decodable(split, folder, samples)
    log.info("%s: train %d images in %d classes, val %d images in %d classes", name, len(train),
             len(classes), len(val), len(val_classes))
    return ClassifyData(name, root, classes, train, val, yaml_path)


def _class_folders(split: str, folder: Path) -> list[str]:
    """Sorted names of the class folders (plain string order, as torchvision's ImageFolder)."""
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "not found"
        raise DataError(f"{split}: {folder} {what} (expected a folder of class folders)")
    classes = sorted(e.name for e in os.scandir(folder) if e.is_dir() and not e.name.startswith("."))
    if not classes:
        raise DataError(f"{split}: no class folders in {folder} (expected {folder}/<class>/<image>; "
                        f"a detection dataset's images/ folder has none)")
    return classes


def _first_difference(names: list[str], classes: list[str]) -> str:
    for i, (a, b) in enumerate(zip(names, classes)):
        if a != b:
            return f"names[{i}] is '{a}' but class folder {i} of train is '{b}'"
    if len(names) > len(classes):
        return f"names[{len(classes)}] '{names[len(classes)]}' has no class folder in train"
    return f"class folder '{classes[len(names)]}' of train is not in names"


def _list_images(split: str, folder: Path, classes: list[str], ids: dict[str, int]) -> list[tuple[Path, int]]:
    out = []
    for c in classes:
        base = folder / c
        files = sorted(p for p in base.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES
                       and not any(part.startswith(".") for part in p.relative_to(base).parts)
                       and p.is_file())
        if not files:
            raise DataError(f"{split}: class folder {base} has no images ({', '.join(IMAGE_SUFFIXES)}); "
                            f"add some or remove the folder")
        out += [(p, ids[c]) for p in files]
    return out


def _check_decodable(split: str, folder: Path, samples: list[tuple[Path, int]]) -> None:
    bad = [p for p, _ in samples if not image_ok(p)]
    if bad:
        named = ", ".join(str(p.relative_to(folder)) for p in bad[:NAMED])
        more = f" and {len(bad) - NAMED} more" if len(bad) > NAMED else ""
        what = "image does" if len(bad) == 1 else "images do"
        raise DataError(f"{split}: {len(bad)} {what} not decode (truncated or not an image): "
                        f"{named}{more} (in {folder}); replace or delete them")


_PNG_END = b"IEND\xaeB`\x82"  # the IEND chunk and its CRC: always a PNG's last 8 bytes


def image_ok(path: Path) -> bool:
    """Whether `path` holds a whole image. Cheap first: a known signature and the format's end
    (PNG IEND, JPEG EOI, WebP's RIFF size = file size) cost two small reads, about 12 us here,
    and catch garbage and truncated files. Only a file that fails it is decoded in full, so a
    valid oddity (bytes after a JPEG's EOI) still passes. Measured on a 500x375 image: PIL's
    `verify()` passed a truncated JPEG; a full decode costs 0.8 ms (JPEG) to 5 ms (PNG)."""
    try:
        with open(path, "rb") as f:
            head = f.read(16)
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - 32))
            tail = f.read()
    except OSError:
        return False
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        complete = tail.endswith(_PNG_END)
    elif head.startswith(b"\xff\xd8"):
        complete = tail.rstrip(b"\x00").endswith(b"\xff\xd9")
    elif head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        complete = int.from_bytes(head[4:8], "little") + 8 == size
    else:
        complete = False
    return complete or _pil_decodes(path)


def _pil_decodes(path: Path) -> bool:
    """A full decode by PIL, which says nothing on failure (torchvision's PNG decoder lets libpng
    print its complaint on stderr, a second line beside ours)."""
    from PIL import Image

    try:
        with Image.open(path) as img:
            img.load()
    except Exception:  # PIL raises many types for a bad file: OSError, SyntaxError, ValueError, ...
        return False
    return True


@dataclass(frozen=True)
class _Unreadable:
    """Stands in for a batch holding an image that no longer decodes. A DataError raised in a
    worker process reaches the caller wrapped in a multi-line traceback; this travels back as
    data and the main process raises the one line (`_raise_unreadable`)."""

    path: str


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """A 64-bit torch seed for one sample, well mixed from (seed, epoch, index)."""
    return int(np.random.SeedSequence([seed, epoch, index]).generate_state(1, np.uint64)[0])


class ClassTrainDataset(torch.utils.data.Dataset):
    """RandomResizedCrop -> horizontal flip -> colour jitter (torchvision v2), keyed by SampleKey.

    v2 transforms draw from torch's global generator, so each sample runs inside `fork_rng`
    seeded with `sample_seed`: reproducible per sample, and the caller's generator is untouched
    when the main process loads (workers=0)."""

    def __init__(self, samples: list[tuple[Path, int]], cfg):
        self.files = [p for p, _ in samples]
        self.labels = np.array([c for _, c in samples], np.int64)
        self.seed = int(cfg.seed)
        scale = float(getattr(cfg, "crop_scale", 0.08))  # 0.08: torchvision's default
        self.transform = v2.Compose([
            v2.RandomResizedCrop(int(cfg.imgsz), scale=(scale, 1.0), ratio=(3 / 4, 4 / 3), antialias=True),
            v2.RandomHorizontalFlip(float(cfg.fliplr)),
            v2.ColorJitter(brightness=float(cfg.hsv_v), saturation=float(cfg.hsv_s),
                           hue=min(float(cfg.hsv_h), 0.5)),  # ColorJitter allows hue <= 0.5
        ])

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, key: SampleKey):
        img = decode_rgb(self.files[key.index])
        if img is None:
            return _Unreadable(str(self.files[key.index]))
        with torch.random.fork_rng(devices=[]):
            # Only the CPU generator: torch.manual_seed also seeds every accelerator backend,
            # 135 us a call here against 1 us, more than the crop itself costs.
            torch.default_generator.manual_seed(sample_seed(self.seed, key.epoch, key.index))
            img = self.transform(img)
        return img, int(self.labels[key.index])


def center_crop_for_inference(img: torch.Tensor, imgsz: int) -> torch.Tensor:
    """An RGB uint8 image as validation and predict feed a classifier: short side to
    round(imgsz / 0.875), then the centre imgsz x imgsz."""
    img = TF.resize(img, [round(imgsz / CROP_FRACTION)], antialias=True)  # one size: the short side
    return TF.center_crop(img, [imgsz, imgsz])


class ClassValDataset(torch.utils.data.Dataset):
    """Short side to round(imgsz / 0.875), centre crop imgsz; no randomness."""

    def __init__(self, samples: list[tuple[Path, int]], imgsz: int):
        self.files = [p for p, _ in samples]
        self.labels = np.array([c for _, c in samples], np.int64)
        self.imgsz = imgsz

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        img = decode_rgb(self.files[i])
        if img is None:
            return _Unreadable(str(self.files[i]))
        return center_crop_for_inference(img, self.imgsz), int(self.labels[i])


def collate(items) -> ClassBatch | _Unreadable:
    bad = next((it for it in items if isinstance(it, _Unreadable)), None)
    if bad is not None:
        return bad
    return ClassBatch(torch.stack([it[0] for it in items]),
                      ClassTargets(torch.tensor([it[1] for it in items], dtype=torch.int64)))


def _raise_unreadable(it):
    for batch in it:
        if isinstance(batch, _Unreadable):
            raise DataError(f"cannot decode {batch.path}: it changed since the dataset was scanned; "
                            f"replace or delete it and start again")
        yield batch


def _iterate(loader: torch.utils.data.DataLoader):
    it = iter(loader)
    return _raise_unreadable(it if loader.num_workers else _one_thread(it))


class ClassTrainLoader(EpochLoader):
    """Iterable of training ClassBatches; call `set_epoch(epoch)` at each epoch start. `dataset` is
    keyed by SampleKey; another task's loader is a subclass whose `collate_fn` makes its batch
    (segment.py)."""

    collate_fn = staticmethod(collate)

    def __init__(self, dataset: torch.utils.data.Dataset, cfg, rank: int = 0, world_size: int = 1):
        self.dataset = dataset
        self.num_images = len(dataset)
        self.sampler = EpochBatchSampler(len(dataset), int(cfg.batch), int(cfg.seed), int(cfg.imgsz),
                                         False, rank, world_size)
        # seed + rank, as the detection loader: only third-party code draws from workers' seeds.
        self.loader = _dataloader(dataset, cfg, int(cfg.seed) + int(rank), batch_sampler=self.sampler,
                                  collate_fn=self.collate_fn)
        self._fresh = False
        self.set_epoch(0)  # order and augmentation are keyed by the epoch (SampleKey)

    def _batches(self):
        return _iterate(self.loader)


class ClassValLoader:
    """Iterable of validation ClassBatches in file order (`dataset.files`); a subclass sets
    `collate_fn` as ClassTrainLoader's do."""

    collate_fn = staticmethod(collate)

    def __init__(self, dataset: torch.utils.data.Dataset, cfg, batch: int):
        self.dataset = dataset
        self.num_images = len(dataset)
        self.files = dataset.files
        self.loader = _dataloader(dataset, cfg, int(cfg.seed), batch_size=batch, shuffle=False,
                                  collate_fn=self.collate_fn)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        return _iterate(self.loader)


def build_classify_train_loader(data: ClassifyData, cfg, rank: int = 0, world_size: int = 1) -> ClassTrainLoader:
    """The training loader; under multi-process training, rank's share of every global batch."""
    if getattr(cfg, "cache", False) not in (False, "auto"):  # auto: nothing to say where no cache applies
        log.info("cache=%s is not used for classification: images are read from their files", cfg.cache)
    if getattr(cfg, "multi_scale", False):
        log.info("multi_scale=true is not used for classification: the random resized crop already varies "
                 "the scale, and every batch is imgsz=%d", cfg.imgsz)
    return ClassTrainLoader(ClassTrainDataset(data.train, cfg), cfg, rank, world_size)


def build_classify_val_loader(data: ClassifyData, cfg, batch: int | None = None) -> ClassValLoader:
    return ClassValLoader(ClassValDataset(data.val, int(cfg.imgsz)), cfg, int(batch or cfg.batch))


def build_classify_stats_loader(data: ClassifyData, cfg, train_loader, images: int, batch: int) -> ClassValLoader:
    """`images` training images spread evenly over the split, centre-cropped as validation loads
    them, read in the main process: where precise_bn measures BatchNorm's statistics."""
    from .loader import spread

    picked = [data.train[i] for i in spread(len(data.train), images)]
    return ClassValLoader(ClassValDataset(picked, int(cfg.imgsz)), dataclasses.replace(cfg, workers=0), int(batch))
