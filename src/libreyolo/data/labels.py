"""YOLO txt labels and split scanning.

A label file sits where the image is, with the last `images` path component replaced by `labels`
and the suffix by `.txt`; each line is `cls cx cy w h`, normalised to [0, 1]. A missing label
file means an image without objects (legal). A COCO-json dataset's boxes come from its json
instead (coco_json.py), through the same scan. An image whose label file is corrupt (wrong column
count, a non-number, a class id out of range, coordinates outside [0, 1] beyond a small tolerance,
a non-positive size) or whose header cannot be read is skipped; the scan logs ONE summary line
with the counts and the first few files with their defects (`line 3: class id 12 out of range`),
so a bad file never stops training mid-epoch. A split with no usable image is a DataError
naming the same.
"""

from __future__ import annotations

import logging
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torchvision.io import ImageReadMode, decode_image, read_file

from ..errors import DataError

log = logging.getLogger("libreyolo")

COORD_TOL = 0.01  # exporters round; a box 1 % past the border is clamped, not rejected
# A label file past these is refused as corrupt (the image is skipped, named in the scan's line)
# before it is read: a crowded image holds hundreds of boxes, and every batch pads to its
# fullest image, so 10^6 boxes (a 50 MB file) would stall the scan and then the loss.
MAX_LABEL_BYTES = 2 << 20
MAX_BOXES = 10_000


@dataclass
class Split:
    """The usable images of one split: files, their labels and original sizes."""

    name: str
    files: list[Path]
    labels: list[np.ndarray]  # per image float32 [n, 5]: cls, cx, cy, w, h (normalised)
    sizes: list[tuple[int, int]]  # per image (h, w) in pixels, read from the header
    # Per image: its position in the listed files (a skipped file leaves a gap), and the COCO
    # iscrowd boxes as rows like `labels` (None: the dataset has none; coco_json.py).
    index: list[int] | None = None
    crowd: list[np.ndarray] | None = None

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
    """Parse one label file into float32 [n, 5]; raises ValueError naming the first bad line."""
    if not path.exists():
        return np.zeros((0, 5), np.float32)
    if not path.is_file():
        raise ValueError("not a file")
    size = path.stat().st_size
    if size > MAX_LABEL_BYTES:
        raise ValueError(f"{size / 2**20:.1f} MB: more than the {MAX_LABEL_BYTES >> 20} MB a label file may be")
    try:
        text = path.read_text(encoding="utf-8", errors="strict")
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text") from None
    rows = [(n, ln.split()) for n, ln in enumerate(text.splitlines(), 1)]
    rows = [(n, r) for n, r in rows if r]
    if not rows:
        return np.zeros((0, 5), np.float32)
    if len(rows) > MAX_BOXES:
        raise ValueError(f"{len(rows)} boxes: more than the {MAX_BOXES} an image may hold")
    for n, r in rows:
        _check_row(n, r, nc)
    arr = np.array([r for _, r in rows], dtype=np.float64)
    arr[:, 1:] = np.clip(arr[:, 1:], 0.0, 1.0)
    return arr.astype(np.float32)


def _check_row(n: int, row: list[str], nc: int) -> None:
    """Raise ValueError saying what is wrong with line `n` of a label file (`cls cx cy w h`)."""
    if len(row) != 5:
        raise ValueError(f"line {n}: {len(row)} columns, expected 5 (class cx cy w h)")
    try:
        values = [float(v) for v in row]
    except ValueError:
        bad = next(v for v in row if not _is_number(v))
        raise ValueError(f"line {n}: {bad[:20]!r} is not a number") from None
    if not all(np.isfinite(values)):
        raise ValueError(f"line {n}: {next(v for v in row if not np.isfinite(float(v)))!r} is not a finite number")
    cls, xywh = values[0], values[1:]
    if cls != round(cls):
        raise ValueError(f"line {n}: class id {row[0][:20]} is not an integer")
    if not 0 <= cls < nc:
        raise ValueError(f"line {n}: class id {row[0][:20]} out of range (the dataset has {nc} classes: 0..{nc - 1})")
    if any(v < -COORD_TOL or v > 1 + COORD_TOL for v in xywh):
        raise ValueError(f"line {n}: coordinates outside [0, 1] (cx cy w h are fractions of the image size)")
    if xywh[2] <= 0 or xywh[3] <= 0:
        raise ValueError(f"line {n}: box width and height must be > 0")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


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


# How many bad files a warning or an error names; the rest are counted.
NAMED = 3


def scan_split(name: str, files: list[Path], nc: int, annotations=None) -> Split:
    """Read labels and image headers of a split; skip broken images with one summary line.

    The labels are the YOLO txt files beside the images, or with `annotations` (a
    coco_json.CocoSplit of these files) the json's boxes, normalised to each image's header size.
    The first image is also decoded in full (and the next, until one decodes): a header can be
    fine while the pixels are not, and a split none of whose images decodes must not train or
    validate on stand-ins. Later undecodable images are replaced when they are met (dataset.py)."""
    if annotations is not None and annotations.missing:
        raise DataError(annotations.missing)
    keep, labels, sizes, index, crowd = [], [], [], [], []
    bad_label: list[tuple[Path, str]] = []
    bad_image: list[tuple[Path, str]] = []
    for i, f in enumerate(files):
        try:
            size = image_size(f)
        except (OSError, ValueError, struct.error) as exc:
            bad_image.append((f, _reason(exc, "unreadable image")))
            continue
        if annotations is not None:  # checked when the json was read: nothing left to fail here
            lab, lab_crowd = annotations.labels(i, size)
            crowd.append(lab_crowd)
        else:
            lab_path = label_path(f)
            try:
                lab = parse_label_file(lab_path, nc)
            except (OSError, ValueError) as exc:
                bad_label.append((lab_path, _reason(exc, "unreadable label file")))
                continue
        keep.append(f)
        labels.append(lab)
        sizes.append(size)
        index.append(i)
    first = _first_decodable(keep, bad_image)
    keep, labels, sizes, index, crowd = keep[first:], labels[first:], sizes[first:], index[first:], crowd[first:]
    skipped = len(bad_label) + len(bad_image)
    if skipped and keep:  # with none kept, the error below says the same in its one line
        log.warning("%s: %d of %d images skipped (%s)", name, skipped, len(files), _defects(bad_label, bad_image))
    if not keep:
        raise DataError(f"{name}: no usable images ({len(files)} found, all skipped: "
                        f"{_defects(bad_label, bad_image)})")
    boxes = sum(len(lab) for lab in labels)
    empty = sum(1 for lab in labels if len(lab) == 0)
    crowded = sum(len(c) for c in crowd)
    log.info("%s: %d images, %d boxes, %d without objects%s", name, len(keep), boxes, empty,
             f", {crowded} crowd boxes (scored as COCO does, not trained on)" if crowded else "")
    return Split(name, keep, labels, sizes, index, crowd if annotations is not None else None)


def _first_decodable(files: list[Path], bad_image: list[tuple[Path, str]]) -> int:
    """Index of the first image of `files` that decodes (len(files) if none); the ones before it
    join `bad_image`."""
    for i, f in enumerate(files):
        try:
            decode_image(read_file(str(f)), mode=ImageReadMode.RGB)
            return i
        except (RuntimeError, OSError, ValueError):
            bad_image.append((f, "does not decode (corrupt image data)"))
    return len(files)


def _reason(exc: Exception, fallback: str) -> str:
    text = str(exc).strip()
    if isinstance(exc, OSError) or not text:  # e.g. a folder named like a label file
        return f"{fallback} ({type(exc).__name__})"
    return text.splitlines()[0][:160]


def _defects(bad_label: list[tuple[Path, str]], bad_image: list[tuple[Path, str]]) -> str:
    """'2 corrupt labels, 1 unreadable image; labels/a.txt: line 3: ...; images/b.jpg: ...; in ROOT'."""
    counts = [f"{len(items)} {what}{'s' if len(items) > 1 else ''}" for items, what in
              ((bad_label, "corrupt label"), (bad_image, "unreadable image")) if items]
    bad = bad_label + bad_image
    # Paths relative to the folder holding them all (the dataset root, for images/ and labels/).
    base = Path(os.path.commonpath([str(p.parent) for p, _ in bad]))
    named = "; ".join(f"{_relative(path, base)}: {why}" for path, why in bad[:NAMED])
    more = f"; and {len(bad) - NAMED} more" if len(bad) > NAMED else ""
    return f"{', '.join(counts)}; {named}{more}; in {base}"


def _relative(path: Path, base: Path) -> str:
    try:
        return str(path.relative_to(base))
    except ValueError:
        return str(path)
