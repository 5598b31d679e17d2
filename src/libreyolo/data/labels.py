"""YOLO txt labels and split scanning.

A label file sits where the image is, with the last `images` path component replaced by `labels`
and the suffix by `.txt`; each line is `cls cx cy w h`, normalised to [0, 1]. A missing label
file means an image without objects (legal). An image whose label file is corrupt (wrong column
count, a non-number, a class id out of range, coordinates outside [0, 1] beyond a small tolerance,
a non-positive size) or whose header cannot be read is skipped; the scan logs ONE summary line
with the counts, so a bad file never stops training mid-epoch.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torchvision.io import ImageReadMode, decode_image

from ..errors import DataError

log = logging.getLogger("libreyolo")

COORD_TOL = 0.01  # exporters round; a box 1 % past the border is clamped, not rejected


@dataclass
class Split:
    """The usable images of one split: files, their labels and original sizes."""

    name: str
    files: list[Path]
    labels: list[np.ndarray]  # per image float32 [n, 5]: cls, cx, cy, w, h (normalised)
    sizes: list[tuple[int, int]]  # per image (h, w) in pixels, read from the header

    def __len__(self) -> int:
        return len(self.files)


def label_path(image: Path) -> Path:
    parts = list(image.parts)
    for i in range(len(parts) - 2, -1, -1):
        if parts[i] == "images":
            parts[i] = "labels"
            break
    return Path(*parts).with_suffix(".txt")


def parse_label_file(path: Path, nc: int) -> np.ndarray:
    """Parse one label file into float32 [n, 5]; raises ValueError on any corrupt line."""
    if not path.is_file():
        return np.zeros((0, 5), np.float32)
    rows = [ln.split() for ln in path.read_text(encoding="utf-8", errors="strict").splitlines()]
    rows = [r for r in rows if r]
    if not rows:
        return np.zeros((0, 5), np.float32)
    if any(len(r) != 5 for r in rows):
        raise ValueError("wrong column count")
    arr = np.array(rows, dtype=np.float64)  # ValueError on a non-number
    if not np.isfinite(arr).all():
        raise ValueError("non-finite value")
    cls = arr[:, 0]
    if (cls != np.round(cls)).any() or (cls < 0).any() or (cls >= nc).any():
        raise ValueError("class id out of range")
    xywh = arr[:, 1:]
    if (xywh < -COORD_TOL).any() or (xywh > 1 + COORD_TOL).any() or (xywh[:, 2:] <= 0).any():
        raise ValueError("coordinates outside [0, 1]")
    arr[:, 1:] = np.clip(xywh, 0.0, 1.0)
    return arr.astype(np.float32)


class _Truncated(ValueError):
    """The bytes given end before the JPEG frame header."""


def image_size(path: Path) -> tuple[int, int]:
    """(h, w) from the file header (JPEG/PNG), else a full decode; raises ValueError if unreadable."""
    with open(path, "rb") as f:
        head = f.read(1 << 16)
    if head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR":
        w, h = struct.unpack(">II", head[16:24])
        return _checked(h, w)
    if head[:2] == b"\xff\xd8":
        try:
            return _jpeg_size(head)
        except _Truncated:  # the frame header lies past the first 64 KiB (large EXIF block)
            return _jpeg_size(path.read_bytes())
    data = torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8)
    try:
        img = decode_image(data, mode=ImageReadMode.RGB)
    except RuntimeError:
        raise ValueError("undecodable image") from None
    return _checked(int(img.shape[-2]), int(img.shape[-1]))


def _jpeg_size(data: bytes) -> tuple[int, int]:
    """Walk the JPEG markers to the start-of-frame segment, which holds height and width."""
    i = 2
    while True:
        if i + 9 > len(data):
            raise _Truncated("no JPEG frame header")
        if data[i] != 0xFF:
            raise ValueError("corrupt JPEG marker")
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        seg_len = struct.unpack(">H", data[i + 2:i + 4])[0]
        # SOF0..SOF15 except DHT (C4), JPG (C8) and DAC (CC) carry the frame size.
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            h, w = struct.unpack(">HH", data[i + 5:i + 9])
            return _checked(h, w)
        i += 2 + seg_len


def _checked(h: int, w: int) -> tuple[int, int]:
    if h <= 0 or w <= 0:
        raise ValueError("zero image size")
    return h, w


def scan_split(name: str, files: list[Path], nc: int) -> Split:
    """Read labels and image headers of a split; skip broken images with one summary line."""
    keep, labels, sizes = [], [], []
    bad_label = bad_image = 0
    for f in files:
        try:
            size = image_size(f)
        except (OSError, ValueError, struct.error):
            bad_image += 1
            continue
        try:
            lab = parse_label_file(label_path(f), nc)
        except (OSError, ValueError, UnicodeDecodeError):
            bad_label += 1
            continue
        keep.append(f)
        labels.append(lab)
        sizes.append(size)
    skipped = bad_label + bad_image
    if skipped:
        why = [f"{n} {what}{'s' if n > 1 else ''}" for n, what in
               ((bad_label, "corrupt label"), (bad_image, "unreadable image")) if n]
        log.warning("%s: %d of %d images skipped (%s)", name, skipped, len(files), ", ".join(why))
    if not keep:
        raise DataError(f"{name}: no usable images ({len(files)} found, all skipped)")
    boxes = sum(len(lab) for lab in labels)
    empty = sum(1 for lab in labels if len(lab) == 0)
    log.info("%s: %d images, %d boxes, %d without objects", name, len(keep), boxes, empty)
    return Split(name, keep, labels, sizes)
