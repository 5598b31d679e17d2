"""Datasets: one training sample = tiles -> one warp -> mixup -> flip -> colour.

What travels from the main process to the workers is a `SampleKey` per image: the index plus the
epoch, the current mosaic/mixup probabilities, the batch's output size and the batch's *pool*.
Every random choice of a sample comes from a generator seeded with (seed, epoch, index), so a run
is reproducible with `seed` whatever the number of workers, and closing mosaic/mixup for the last
epochs reaches persistent workers without rebuilding them (the new probabilities ride on keys).

Mosaic and mixup partners are drawn from the pool: the batch's own images plus random others up
to POOL_MIN. A worker builds a whole batch, so it decodes each pool image once and reuses it:
about one decode per sample instead of four (Ultralytics gets the same saving from a buffer of
recently loaded images, which makes the partners depend on the worker count; the pool does not).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torchvision.io import ImageReadMode, decode_image, read_file
from torchvision.transforms.v2 import functional as TF

from .augment import (
    FILL,
    Tile,
    apply_color,
    fliplr,
    hsv_matrix,
    letterbox,
    mixup,
    mosaic_tiles,
    random_affine,
    render,
    resize_long_side,
    to_uint8,
    translation,
)
from .cache import ImageCache
from .labels import Split

log = logging.getLogger("libreyolo")

AUG_KEYS = ("hsv_h", "hsv_s", "hsv_v", "fliplr", "degrees", "translate", "scale", "shear")


class SampleKey(NamedTuple):
    index: int
    epoch: int
    mosaic: float  # probability, 0 once closed
    mixup: float
    size: int  # the batch's square size (multi-scale); collate resizes to it
    pool: tuple[int, ...] = ()  # mosaic/mixup partners come from here (empty: the whole set)


def decode_rgb(path: Path) -> torch.Tensor | None:
    """RGB uint8 [3, h, w] (a 16-bit PNG scaled down), or None if the file does not decode."""
    try:
        img = decode_image(read_file(str(path)), mode=ImageReadMode.RGB)
    except (RuntimeError, OSError, ValueError):
        return None
    if img.numel() == 0:
        return None
    return img if img.dtype == torch.uint8 else TF.to_dtype(img, torch.uint8, scale=True)


def decode_resized(path: Path, imgsz: int) -> torch.Tensor:
    """Decode to RGB uint8 [3, h, w] with long side imgsz; an empty [3, 0, 0] if unreadable."""
    img = decode_rgb(path)
    if img is None:
        log.warning("cannot decode %s; a stand-in image takes its place", path)
        return torch.zeros((3, 0, 0), dtype=torch.uint8)
    return resize_long_side(img, imgsz)


def label_boxes(lab: np.ndarray, h: int, w: int) -> np.ndarray:
    """Normalised (cls, cx, cy, w, h) rows -> xyxy pixel boxes float32 [n, 4] of an h x w image."""
    cx, cy, bw, bh = (lab[:, k] for k in range(1, 5))
    boxes = np.stack([(cx - bw / 2) * w, (cy - bh / 2) * h, (cx + bw / 2) * w, (cy + bh / 2) * h],
                     axis=1)
    return boxes.astype(np.float32).reshape(-1, 4)


def inference_letterbox(resized: torch.Tensor, orig_hw: tuple[int, int], imgsz: int,
                        boxes: np.ndarray | None = None
                        ) -> tuple[torch.Tensor, np.ndarray, float, tuple[int, int]]:
    """An image (already `resize_long_side` to imgsz) as validation and predict feed the network:
    centred on an imgsz x imgsz FILL canvas. Returns (canvas, boxes shifted with it, ratio, (left,
    top)); a network box maps back with `x_orig = (x - left) / ratio` (eval/postprocess.unletterbox).
    One function for both, so val and predict give the same boxes for the same image."""
    h0, w0 = orig_hw
    img, boxes, pad = letterbox(resized, np.zeros((0, 4), np.float32) if boxes is None else boxes, imgsz)
    return img, boxes, imgsz / max(h0, w0), pad


class _Base(torch.utils.data.Dataset):
    def __init__(self, split: Split, imgsz: int, cache=False):
        self.split = split
        self.imgsz = imgsz
        self.cache = ImageCache(cache, split.files, imgsz, self._decode, tag=split.name)

    def _decode(self, path: Path) -> torch.Tensor:
        return decode_resized(path, self.imgsz)

    def __len__(self) -> int:
        return len(self.split)

    def tile(self, i: int) -> Tile | None:
        """Image i resized (long side imgsz) with its boxes in those pixels; None if unreadable."""
        img = self.cache.get(i)
        if img.numel() == 0:
            return None
        h, w = img.shape[-2:]
        lab = self.split.labels[i]
        return Tile(img, label_boxes(lab, h, w), lab[:, 0].astype(np.int64))


class TrainDataset(_Base):
    def __init__(self, split: Split, imgsz: int, hyp, seed: int = 0, cache=False):
        super().__init__(split, imgsz, cache)
        self.seed = seed
        self.hyp = {k: float(getattr(hyp, k)) for k in AUG_KEYS}
        self._pool: tuple[int, ...] = ()
        self._memo: dict[int, Tile] = {}  # this process's decoded images of the current pool

    def __getitem__(self, key: SampleKey):
        if key.pool != self._pool:  # a new batch: forget the last one's images
            self._pool, self._memo = key.pool, {}
        rng = np.random.default_rng([self.seed, key.epoch, key.index])
        img, boxes, labels = self._sample(key.index, rng, key.mosaic)
        if key.mixup > 0 and rng.random() < key.mixup:
            img2, boxes2, labels2 = self._sample(self._partner(rng), rng, key.mosaic)
            img = mixup(img, img2, rng)
            boxes, labels = np.concatenate([boxes, boxes2]), np.concatenate([labels, labels2])
        hyp = self.hyp
        if rng.random() < hyp["fliplr"]:  # before colour: flipping uint8 moves 4x fewer bytes
            img, boxes = fliplr(img, boxes)
        c = hsv_matrix(rng, hyp["hsv_h"], hyp["hsv_s"], hyp["hsv_v"])
        if c is not None:
            img = apply_color(img, c)
        return to_uint8(img), boxes, labels, key.size

    def _partner(self, rng: np.random.Generator) -> int:
        if self._pool:
            return self._pool[int(rng.integers(len(self._pool)))]
        return int(rng.integers(len(self)))

    def _tile(self, i: int) -> Tile:
        t = self._memo.get(i)
        if t is None:
            t = self._readable_tile(i)
            if self.cache.mode != "ram" and i in self._pool:
                self._memo[i] = t
        # A fresh placement each time: a mosaic may hold one image twice, and moves its tiles.
        return Tile(t.image, t.boxes, t.labels)

    def _readable_tile(self, i: int) -> Tile:
        # An image that passed the header check but fails to decode is replaced by the next
        # readable one, so one bad file never stops an epoch.
        for k in range(len(self)):
            t = self.tile((i + k) % len(self))
            if t is not None:
                return t
        return Tile(torch.full((3, self.imgsz, self.imgsz), FILL, dtype=torch.uint8),
                    np.zeros((0, 4), np.float32), np.zeros(0, np.int64))

    def _sample(self, i: int, rng: np.random.Generator, mosaic_p: float):
        size, hyp = self.imgsz, self.hyp
        if mosaic_p > 0 and rng.random() < mosaic_p:
            tiles = [self._tile(j) for j in (i, *(self._partner(rng) for _ in range(3)))]
            canvas = mosaic_tiles(tiles, size, rng)
            centre = translation(-size, -size)
        else:
            tiles = [self._tile(i)]
            h, w = tiles[0].image.shape[-2:]
            canvas = (h, w)
            # With no other augmentation this places the image exactly like `letterbox`.
            centre = translation((size - w) // 2 - size // 2, (size - h) // 2 - size // 2)
        m = random_affine(rng, hyp["degrees"], hyp["scale"], hyp["shear"], hyp["translate"],
                          size) @ centre
        return render(tiles, canvas, m, size)


class ValDataset(_Base):
    """Letterboxed, unaugmented, in file order; also returns what maps boxes back."""

    def __getitem__(self, i: int):
        t = self.tile(i)
        h0, w0 = self.split.sizes[i]
        if t is None:  # undecodable despite a good header: a grey image, its labels still count
            t = Tile(torch.full((3, 1, 1), FILL, dtype=torch.uint8),
                     np.zeros((0, 4), np.float32), np.zeros(0, np.int64))
        img, boxes, ratio, pad = inference_letterbox(t.image, (h0, w0), self.imgsz, t.boxes)
        return img, boxes, t.labels, i, (h0, w0), ratio, pad

    def ground_truth(self, crowd: bool = False) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per image: boxes xyxy in original pixels (float32 [n, 4]) and class ids (int64); with
        `crowd`, its COCO iscrowd boxes instead (none for a dataset without them)."""
        rows = self.split.labels if not crowd else self.split.crowd or [np.zeros((0, 5), np.float32)] * len(self)
        return [(label_boxes(lab, h, w), lab[:, 0].astype(np.int64)) for lab, (h, w) in zip(rows, self.split.sizes)]
