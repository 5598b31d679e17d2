"""`libreyolo data check`: what is in a detection dataset, and what in it will hurt training.

Per split it counts images, boxes and the images without labels (backgrounds), per class boxes and
the images holding them; it finds corrupt or undecodable images, label files that training would
skip (and why), byte-identical images (within a split, and between train and val: a leak), boxes
outside the image or of no size, and how small the boxes get at the planned `imgsz` (the long side
resized to imgsz, as training letterboxes): a box whose shorter side falls below `TINY_PX` pixels
is hard to learn at any stride. `verdict()` sums it up in one line, which `train` prints too.

Two depths: `check_dataset` reads every file (full decode, content hash, in threads); training's
quick form (`quick_report`) uses what the loaders' scan already holds (header sizes and labels),
so it costs nothing, and says that it neither decodes nor hashes.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .labels import COORD_TOL, Split, image_size, label_path, parse_label_file

log = logging.getLogger("libreyolo")

SCHEMA, SCHEMA_VERSION = "libreyolo-data-check", 1
TINY_PX = 4.0  # shorter side at imgsz below which a box counts as vanishing
# Histogram bin edges of the boxes' shorter side at imgsz, in pixels (the last bin is open).
SIZE_EDGES = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
EXAMPLES = 20  # files named per problem in the JSON and on the page


@dataclass
class FileRecord:
    """One listed image: what reading it found."""

    path: Path
    size: tuple[int, int] | None = None  # (h, w) of the header; None when unreadable
    image_error: str | None = None       # unreadable header, or pixels that do not decode
    boxes: np.ndarray = field(default_factory=lambda: np.zeros((0, 5)))  # class, cx, cy, w, h (fractions)
    crowd: int = 0
    label_error: str | None = None       # why training's scan skips this image's labels
    digest: str | None = None            # content hash (full check only)


def check_dataset(data: str, imgsz: int = 640, threads: int | None = None) -> dict[str, Any]:
    """The full report of dataset `data` (anything `data=` takes for a detector)."""
    from ..errors import DataError
    from .dataset_yaml import load_data_config

    if Path(data).expanduser().is_dir():
        raise DataError(f"data={data} is a folder: data check reads detection datasets (a dataset yaml or an "
                        f"instances json), not classification or segmentation folders")
    data_cfg = load_data_config(data)
    splits = {}
    for s in ("train", "val"):
        coco = data_cfg.annotations.get(s)
        if coco is not None and coco.missing:
            continue
        files = getattr(data_cfg, s)
        with ThreadPoolExecutor(max_workers=threads or min(8, os.cpu_count() or 1)) as pool:
            records = list(pool.map(_read_image, files))
        for i, rec in enumerate(records):
            _read_labels(rec, i, data_cfg.nc, coco)
        splits[s] = records
    extra_empty = {s: c.empty for s, c in data_cfg.annotations.items() if not c.missing}
    return build_report(data_cfg.name, data_cfg.names, splits, imgsz, full=True, empty_boxes=extra_empty)


def quick_report(name: str, names: list[str], splits: dict[str, Split], imgsz: int) -> dict[str, Any]:
    """The report from the loaders' scanned splits (no decode, no hash): what `train` prints."""
    records = {}
    for s, split in splits.items():
        crowd = split.crowd or [()] * len(split)
        records[s] = [FileRecord(f, size, boxes=lab, crowd=len(c))
                      for f, size, lab, c in zip(split.files, split.sizes, split.labels, crowd)]
    return build_report(name, names, records, imgsz, full=False)


def _read_image(path: Path) -> FileRecord:
    import torch
    from torchvision.io import ImageReadMode, decode_image

    rec = FileRecord(path)
    try:
        rec.size = image_size(path)
        data = path.read_bytes()
    except (OSError, ValueError) as exc:
        rec.image_error = _why(exc, "unreadable image")
        return rec
    rec.digest = hashlib.blake2b(data, digest_size=16).hexdigest()
    try:
        img = decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)
        if img.numel() == 0:
            raise ValueError("empty image")
    except (RuntimeError, ValueError):
        rec.image_error = "does not decode (corrupt image data)"
    return rec


def _read_labels(rec: FileRecord, i: int, nc: int, coco) -> None:
    if coco is not None:  # pixels -> fractions of the decoded size, unclipped (to see what lies outside)
        if rec.size is not None:
            h, w = rec.size
            b = coco.boxes[i]
            rec.boxes = np.stack([b[:, 0], (b[:, 1] + b[:, 3] / 2) / w, (b[:, 2] + b[:, 4] / 2) / h,
                                  b[:, 3] / w, b[:, 4] / h], 1) if len(b) else np.zeros((0, 5))
        rec.crowd = len(coco.crowd[i])
        return
    path = label_path(rec.path)
    try:
        rec.boxes = parse_label_file(path, nc).astype(np.float64)
    except (OSError, ValueError) as exc:
        rec.label_error = _why(exc, "unreadable label file")
        rec.boxes = _lenient_rows(path, nc)


def _lenient_rows(path: Path, nc: int) -> np.ndarray:
    """The rows of a label file that training rejects which are still boxes (5 numbers, a known
    class), to count those outside the image or of no size."""
    rows = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return np.zeros((0, 5))
    for line in lines:
        parts = line.split()
        try:
            values = [float(v) for v in parts]
        except ValueError:
            continue
        if len(values) == 5 and all(np.isfinite(values)) and values[0] == round(values[0]) and 0 <= values[0] < nc:
            rows.append(values)
    return np.array(rows, np.float64).reshape(-1, 5)


def _why(exc: Exception, fallback: str) -> str:
    text = str(exc).strip()
    return f"{fallback} ({type(exc).__name__})" if isinstance(exc, OSError) or not text else text.splitlines()[0][:160]


# --- the report --------------------------------------------------------------------------------------
def build_report(name: str, names: list[str], splits: dict[str, list[FileRecord]], imgsz: int, full: bool,
                 empty_boxes: dict[str, int] | None = None) -> dict[str, Any]:
    """The JSON report: per split counts, the problems with examples, box sizes, the verdict."""
    nc = len(names)
    out_splits, problems = {}, []
    sizes_all: dict[str, list[float]] = {}
    for s, records in splits.items():
        stats, sides = _split_stats(records, nc, names, imgsz, (empty_boxes or {}).get(s, 0))
        out_splits[s], sizes_all[s] = stats, sides
        problems += _split_problems(s, stats, records, imgsz)
    duplicates = _duplicates(splits) if full else None
    if duplicates:
        within = [g for g in duplicates if len({s for s, _ in g}) == 1]
        across = [g for g in duplicates if len({s for s, _ in g}) > 1]
        if across:
            problems.append(_problem("warning", "train_val_duplicates", len(across),
                                     f"{len(across)} image{_s(across)} in both train and val (byte-identical)",
                                     [" = ".join(p for _, p in g) for g in across]))
        if within:
            problems.append(_problem("warning", "duplicates", sum(len(g) - 1 for g in within),
                                     f"{sum(len(g) - 1 for g in within)} duplicate image{_s(range(sum(len(g) - 1 for g in within)))} within a split",
                                     [" = ".join(p for _, p in g) for g in within]))
    if "train" in out_splits:
        absent = [names[k] for k in range(nc) if out_splits["train"]["per_class"][k]["boxes"] == 0]
        if absent:
            problems.append(_problem("warning", "classes_without_train_boxes", len(absent),
                                     f"{len(absent)} class{'es' if len(absent) > 1 else ''} with no train box "
                                     f"({', '.join(absent[:5])}{', ...' if len(absent) > 5 else ''})", absent))
    hist = {s: np.histogram(np.clip(v, 0, SIZE_EDGES[-1] * 4), bins=[*SIZE_EDGES, np.inf])[0].tolist()
            for s, v in sizes_all.items()}
    report = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "data": name, "imgsz": imgsz, "full": full,
              "names": list(names), "splits": out_splits, "problems": problems,
              "box_sizes": {"measure": "shorter side in pixels at imgsz", "edges": list(SIZE_EDGES),
                            "counts": hist, "tiny_px": TINY_PX},
              "duplicates": [[{"split": s, "path": p} for s, p in g] for g in duplicates or []]}
    report["ok"] = not problems
    report["verdict"] = verdict(report)
    return report


def _split_stats(records: list[FileRecord], nc: int, names: list[str], imgsz: int, empty_boxes: int):
    boxes_per_class, images_per_class = np.zeros(nc, np.int64), np.zeros(nc, np.int64)
    sides: list[float] = []
    outside = degenerate = backgrounds = crowd = 0
    for rec in records:
        crowd += rec.crowd
        if rec.image_error is not None:
            continue
        b = rec.boxes
        if not len(b) and rec.label_error is None:
            backgrounds += 1
        if not len(b):
            continue
        cls = b[:, 0].astype(np.int64)
        boxes_per_class += np.bincount(cls, minlength=nc)[:nc]
        images_per_class[np.unique(cls)] += 1
        x1, y1, x2, y2 = b[:, 1] - b[:, 3] / 2, b[:, 2] - b[:, 4] / 2, b[:, 1] + b[:, 3] / 2, b[:, 2] + b[:, 4] / 2
        bad_size = (b[:, 3] <= 0) | (b[:, 4] <= 0)
        out = ((x1 < -COORD_TOL) | (y1 < -COORD_TOL) | (x2 > 1 + COORD_TOL) | (y2 > 1 + COORD_TOL)) & ~bad_size
        degenerate += int(bad_size.sum())
        outside += int(out.sum())
        if rec.size is not None:
            h, w = rec.size
            scale = imgsz / max(h, w)
            good = ~bad_size
            sides += (np.minimum(b[good, 3] * w, b[good, 4] * h) * scale).tolist()
    sides_arr = np.array(sides)
    return {
        "images": len(records), "boxes": int(boxes_per_class.sum()), "backgrounds": backgrounds, "crowd": crowd,
        "unreadable_images": sum(r.image_error is not None for r in records),
        "skipped_label_files": sum(r.label_error is not None and r.image_error is None for r in records),
        "outside_boxes": outside, "degenerate_boxes": degenerate + empty_boxes,
        "tiny_boxes": int((sides_arr < TINY_PX).sum()),
        "per_class": [{"class": names[k], "id": k, "boxes": int(boxes_per_class[k]), "images": int(images_per_class[k])}
                      for k in range(nc)],
    }, sides


def _split_problems(s: str, stats: dict, records: list[FileRecord], imgsz: int) -> list[dict]:
    out = []
    bad = [r for r in records if r.image_error is not None]
    if bad:
        out.append(_problem("error", f"{s}_unreadable_images", len(bad),
                            f"{len(bad)} corrupt or undecodable {s} image{_s(bad)}",
                            [f"{r.path}: {r.image_error}" for r in bad]))
    skipped = [r for r in records if r.label_error is not None and r.image_error is None]
    if skipped:
        out.append(_problem("error", f"{s}_skipped_label_files", len(skipped),
                            f"{len(skipped)} {s} label file{_s(skipped)} that training skips",
                            [f"{label_path(r.path)}: {r.label_error}" for r in skipped]))
    if stats["outside_boxes"]:
        out.append(_problem("warning", f"{s}_outside_boxes", stats["outside_boxes"],
                            f"{stats['outside_boxes']} {s} box{_es(stats['outside_boxes'])} outside the image",
                            [str(r.path) for r in records if _has_outside(r)]))
    if stats["degenerate_boxes"]:
        out.append(_problem("warning", f"{s}_degenerate_boxes", stats["degenerate_boxes"],
                            f"{stats['degenerate_boxes']} {s} box{_es(stats['degenerate_boxes'])} of no width or height",
                            [str(r.path) for r in records if len(r.boxes) and ((r.boxes[:, 3] <= 0) | (r.boxes[:, 4] <= 0)).any()]))
    if stats["tiny_boxes"]:
        share = stats["tiny_boxes"] / max(stats["boxes"], 1)
        out.append(_problem("warning", f"{s}_tiny_boxes", stats["tiny_boxes"],
                            f"{stats['tiny_boxes']} of {stats['boxes']} {s} boxes ({100 * share:.1f}%) below "
                            f"{TINY_PX:g} px at imgsz {imgsz}", []))
    if stats["images"] and stats["backgrounds"] == stats["images"]:
        out.append(_problem("error", f"{s}_no_boxes", stats["images"], f"no {s} image has a box", []))
    return out


def _has_outside(r: FileRecord) -> bool:
    b = r.boxes
    if not len(b):
        return False
    lo = np.minimum(b[:, 1] - b[:, 3] / 2, b[:, 2] - b[:, 4] / 2)
    hi = np.maximum(b[:, 1] + b[:, 3] / 2, b[:, 2] + b[:, 4] / 2)
    return bool(((lo < -COORD_TOL) | (hi > 1 + COORD_TOL)).any())


def _duplicates(splits: dict[str, list[FileRecord]]) -> list[list[tuple[str, str]]]:
    groups: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for s, records in splits.items():
        for r in records:
            if r.digest is not None:
                groups[r.digest].append((s, str(r.path)))
    # The same file listed twice (a .txt list naming one image twice) is one entry per listing.
    return [g for g in groups.values() if len(g) > 1]


def _problem(level: str, key: str, count: int, text: str, examples: list[str]) -> dict[str, Any]:
    return {"level": level, "key": key, "count": int(count), "text": text, "examples": examples[:EXAMPLES]}


def _s(items) -> str:
    return "" if len(items) == 1 else "s"


def _es(n: int) -> str:
    return "" if n == 1 else "es"


def verdict(report: dict[str, Any]) -> str:
    """'data check: ok (128 train / 32 val images, 1302 boxes, 10 classes)', or the problems first,
    errors before warnings; the quick form says what it left out."""
    splits = report["splits"]
    counts = " / ".join(f"{v['images']} {s}" for s, v in splits.items())
    boxes = sum(v["boxes"] for v in splits.values())
    facts = f"{counts} images, {boxes} boxes, {len(report['names'])} classes"
    problems = sorted(report["problems"], key=lambda p: p["level"] != "error")
    head = "ok" if not problems else f"{len(problems)} problem{_s(problems)}: " + "; ".join(p["text"] for p in problems)
    tail = "" if report["full"] else "; labels and sizes only: `libreyolo data check` also decodes and compares every image"
    return f"data check: {head} ({facts}{tail})"

