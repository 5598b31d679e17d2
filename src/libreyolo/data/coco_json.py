"""COCO-json detection datasets: the `instances_*.json` files the DETR repositories train from.

Two ways in (docs/datasets.md):
- `data=` a yaml whose splits are mappings, `train: {images: DIR, annotations: FILE}` and the same
  for `val`, relative to the yaml's `path` as in a YOLO yaml; `names` may be left out (the json's
  categories name the classes; given, it must list the same names);
- `data=` an `instances_<split>.json` in the usual COCO layout: `ROOT/annotations/instances_val2017.json`
  with its images in `ROOT/val2017/` (or `ROOT/images/val2017/`, or a `val2017/` beside the json).
  The other split is the sibling json with `train` for `val` in its name (or the reverse); without
  one, only the commands that need that split fail (`val` on a lone val json works).

What the dataset does:
- the categories, sorted by id, are classes 0..n-1; `DataConfig.category_ids[k]` is class k's
  COCO id, so what comes back (`val --save-json`, the per-class rows of `val --json`) carries the
  json's own ids and names, gaps included (COCO's 80 classes have ids 1..90);
- `iscrowd: 1` boxes are left out of training and reach the evaluator as crowd regions: a
  detection on one is neither a hit nor a false positive, as in the COCO metric;
- an image without annotations is a background image;
- a box of no width or height is dropped (one log line counts them); a box past the image border
  is clipped to it (the border of the file as decoded, whatever the json's width/height say);
- bad json, an annotation naming an unknown image or category, or a listed image missing on disk is
  one DataError line, before anything is written.
The boxes are normalised when a split is scanned (labels.scan_split), from the image header's size.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DataError
from .dataconfig import DataConfig

log = logging.getLogger("libreyolo")

SPLITS = ("train", "val")
NAMED = 3  # how many offending ids an error names


@dataclass
class CocoSplit:
    """One split of a COCO dataset: its json, images, and per image the boxes in pixels."""

    json_path: Path
    images_dir: Path
    files: list[Path]
    image_ids: list[int]        # the json's id of each file
    boxes: list[np.ndarray]     # per file float64 [n, 5]: class, x, y, w, h (original pixels)
    crowd: list[np.ndarray]     # the same for the file's iscrowd boxes
    missing: str | None = None  # set for a split the dataset does not have: why, for the loader
    empty: int = 0              # boxes of no width or height, left out

    def labels(self, i: int, size: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
        """File i's (labels, crowd) as YOLO rows float32 [n, 5] (class, cx, cy, w, h normalised to
        `size` = (h, w), the decoded image's), boxes clipped to the image, empty ones dropped."""
        return _normalised(self.boxes[i], size), _normalised(self.crowd[i], size)


def missing_split(name: str, why: str) -> CocoSplit:
    return CocoSplit(Path(), Path(), [], [], [], [], missing=f"{name}: {why}")


def _normalised(rows: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    h, w = size
    if not len(rows):
        return np.zeros((0, 5), np.float32)
    x1 = np.clip(rows[:, 1], 0, w)
    y1 = np.clip(rows[:, 2], 0, h)
    x2 = np.clip(rows[:, 1] + rows[:, 3], 0, w)
    y2 = np.clip(rows[:, 2] + rows[:, 4], 0, h)
    keep = (x2 > x1) & (y2 > y1)
    out = np.stack([rows[:, 0], (x1 + x2) / 2 / w, (y1 + y2) / 2 / h, (x2 - x1) / w, (y2 - y1) / h], 1)
    return out[keep].astype(np.float32)


def is_coco_yaml(raw: dict) -> bool:
    """A dataset yaml whose train or val split is a {images, annotations} mapping."""
    return any(isinstance(raw.get(s), dict) for s in SPLITS)


# --- reading a json --------------------------------------------------------------------------------
def read_json(path: Path) -> dict:
    """The json's mapping, checked for the three lists COCO detection needs; DataError otherwise."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"annotations not found: {path}") from None
    except UnicodeDecodeError as exc:
        raise DataError(f"annotations {path} are not UTF-8 text (byte {exc.start}); a binary file?") from None
    except OSError as exc:
        raise DataError(f"cannot read annotations {path} ({exc.strerror or type(exc).__name__})") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"annotations {path} are not valid json (line {exc.lineno}, column {exc.colno}: "
                        f"{exc.msg})") from None
    if not isinstance(raw, dict):
        raise DataError(f"annotations {path}: expected a COCO object with images, annotations and categories")
    for key in ("images", "categories"):
        if not isinstance(raw.get(key), list) or not raw[key]:
            raise DataError(f"annotations {path}: '{key}' must be a non-empty list (a COCO detection json)")
    if not isinstance(raw.get("annotations", []), list):
        raise DataError(f"annotations {path}: 'annotations' must be a list")
    return raw


def categories(raw: dict, path: Path) -> tuple[list[int], list[str]]:
    """(ids sorted, their names): class k is the k-th id."""
    found: dict[int, str] = {}
    for c in raw["categories"]:
        cid = c.get("id") if isinstance(c, dict) else None
        if not _is_int(cid):
            raise DataError(f"annotations {path}: every category needs an integer 'id' (got {c!r:.60})")
        if cid in found:
            raise DataError(f"annotations {path}: category id {cid} appears twice")
        found[cid] = str(c.get("name", cid))
    ids = sorted(found)
    return ids, [found[i] for i in ids]


def read_split(name: str, json_path: Path, images_dir: Path, ids: list[int] | None = None
               ) -> tuple[CocoSplit, list[int], list[str]]:
    """A split from its json and images folder; (split, category ids, names). With `ids` (the
    other split's categories) the json must name the same ones."""
    raw = read_json(json_path)
    cat_ids, names = categories(raw, json_path)
    if ids is not None and cat_ids != ids:
        raise DataError(f"{name}: {json_path} names categories {_few(cat_ids)}, the other split {_few(ids)}: "
                        f"both splits need the same categories")
    cls_of = {cid: k for k, cid in enumerate(cat_ids)}
    files, image_ids, row_of = [], [], {}
    for img in raw["images"]:
        iid = img.get("id") if isinstance(img, dict) else None
        fname = img.get("file_name") if isinstance(img, dict) else None
        if not _is_int(iid) or not isinstance(fname, str) or not fname:
            raise DataError(f"annotations {json_path}: every image needs an integer 'id' and a 'file_name' "
                            f"(got {img!r:.80})")
        if iid in row_of:
            raise DataError(f"annotations {json_path}: image id {iid} appears twice")
        row_of[iid] = len(files)
        files.append(images_dir / fname)
        image_ids.append(iid)
    absent = [f for f in files if not f.is_file()]
    if absent:
        more = f" and {len(absent) - NAMED} more" if len(absent) > NAMED else ""
        raise DataError(f"{name}: {len(absent)} of {len(files)} images listed in {json_path.name} are missing: "
                        f"{', '.join(str(f) for f in absent[:NAMED])}{more}")
    boxes: list[list] = [[] for _ in files]
    crowd: list[list] = [[] for _ in files]
    empty: list[Any] = []
    for a in raw.get("annotations", []):
        bbox = a.get("bbox") if isinstance(a, dict) else None
        if not isinstance(a, dict) or a.get("image_id") not in row_of:
            raise DataError(f"annotations {json_path}: annotation {_ann_id(a)} names image "
                            f"{a.get('image_id') if isinstance(a, dict) else '?'}, which 'images' does not list")
        if a.get("category_id") not in cls_of:
            raise DataError(f"annotations {json_path}: annotation {_ann_id(a)} names category {a.get('category_id')}, "
                            f"which 'categories' does not list")
        if not (isinstance(bbox, list) and len(bbox) == 4 and all(_is_number(v) for v in bbox)):
            raise DataError(f"annotations {json_path}: annotation {_ann_id(a)} needs a bbox [x, y, width, height] "
                            f"of numbers (got {bbox!r:.60})")
        if bbox[2] <= 0 or bbox[3] <= 0:
            empty.append(_ann_id(a))
            continue
        target = crowd if a.get("iscrowd", 0) else boxes
        target[row_of[a["image_id"]]].append([cls_of[a["category_id"]], *map(float, bbox)])
    if empty:
        more = f" and {len(empty) - NAMED} more" if len(empty) > NAMED else ""
        log.warning(f"{name}: {len(empty)} boxes of no width or height left out (annotation "
                    f"{', '.join(map(str, empty[:NAMED]))}{more}; in {json_path.name})")
    split = CocoSplit(json_path, images_dir, files, image_ids, [_rows(b) for b in boxes], [_rows(c) for c in crowd],
                      empty=len(empty))
    return split, cat_ids, names


def _rows(rows: list) -> np.ndarray:
    return np.array(rows, np.float64).reshape(-1, 5)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)


def _ann_id(a: Any) -> Any:
    return a.get("id", "?") if isinstance(a, dict) else "?"


def _few(ids: list[int]) -> str:
    return "[" + ", ".join(map(str, ids[:6])) + (", ..." if len(ids) > 6 else "") + "]"


# --- the two forms -----------------------------------------------------------------------------------
def load_coco_yaml(raw: dict, yaml_path: Path, root: Path, name: str):
    """A dataset yaml with `train: {images: DIR, annotations: FILE}` (and `val` alike)."""

    splits: dict[str, CocoSplit] = {}
    ids = names = None
    for s in SPLITS:
        entry = raw.get(s)
        if entry is None:
            raise DataError(f"dataset yaml {yaml_path}: '{s}' is missing")
        if not isinstance(entry, dict) or not isinstance(entry.get("images"), str) \
                or not isinstance(entry.get("annotations"), str):
            raise DataError(f"dataset yaml {yaml_path}: '{s}' must be {{images: DIR, annotations: FILE.json}} "
                            f"when a split is COCO json")
        images = (root / entry["images"]).resolve()
        if not images.is_dir():
            raise DataError(f"{s}: images folder not found: {images}")
        splits[s], ids, names = read_split(s, (root / entry["annotations"]).resolve(), images, ids)
    given = raw.get("names")
    if given is not None:
        listed = [str(v) for v in (given.values() if isinstance(given, dict) else given)] \
            if isinstance(given, (list, dict)) else None
        if listed != names:
            raise DataError(f"dataset yaml {yaml_path}: names {given!r:.80} differ from the json's categories "
                            f"{names!r:.80} (leave names out: the json names the classes)")
    known = {"path", "train", "val", "names", "nc", "task"}
    extra = {k: v for k, v in raw.items() if k not in known}
    return DataConfig(name, yaml_path, root, splits["train"].files, splits["val"].files, names, extra,
                      category_ids=ids, annotations=splits)


def load_coco_json(path: Path):
    """`data=` an instances json: its split, and the other split from the sibling json."""

    path = path.expanduser()
    if not path.is_file():
        raise DataError(f"annotations not found: {path}")
    path = path.resolve()
    own = "val" if "val" in _tag(path) else "train"
    other = "train" if own == "val" else "val"
    sibling = path.with_name(path.name.replace(own, other, 1)) if own in path.name else None
    split, ids, names = read_split(own, path, _images_dir(path, own))
    splits = {own: split}
    if sibling is not None and sibling.is_file():
        splits[other], _, _ = read_split(other, sibling, _images_dir(sibling, other), ids)
    else:
        looked = f"expected {sibling.name} beside it" if sibling is not None else \
            f"its name does not say {own} for the sibling to be found"
        splits[other] = missing_split(other, f"no {other} split for {path.name} ({looked}; or use a dataset yaml "
                                             f"with train: {{images, annotations}} and val alike)")
    root = path.parent.parent if path.parent.name == "annotations" else path.parent
    return DataConfig(root.name, path, root, splits["train"].files, splits["val"].files, names, {},
                      category_ids=ids, annotations=splits)


def _tag(path: Path) -> str:
    """'val2017' of instances_val2017.json (the whole stem when it has no `instances_` prefix)."""
    return re.sub(r"^instances_", "", path.stem)


def _images_dir(json_path: Path, split: str) -> Path:
    tag, here = _tag(json_path), json_path.parent
    up = here.parent if here.name == "annotations" else here
    candidates = [up / tag, up / "images" / tag, here / tag, here / "images" / tag, up / split, up / "images" / split]
    for c in candidates:
        if c.is_dir():
            return c
    raise DataError(f"{split}: the images of {json_path.name} not found: looked for a folder "
                    f"{tag}/ in {up} (or {up / 'images'}); pass a dataset yaml with {split}: {{images, annotations}}")


# --- what goes back out ----------------------------------------------------------------------------
def yolo_image_ids(files: list[Path]) -> list[int]:
    """COCO image ids of a YOLO split: the file stems where every stem is a distinct number
    (coco128's 000000000009.jpg is COCO image 9), else 1..n in file order. `data convert` writes
    the same ids, so `val --save-json` on a YOLO dataset matches its converted json."""
    stems = [f.stem for f in files]
    if stems and all(s.isdigit() for s in stems) and len({int(s) for s in stems}) == len(stems):
        return [int(s) for s in stems]
    return list(range(1, len(files) + 1))


def image_ids(data_cfg, split: str) -> list[int]:
    """The COCO image id of each of a split's listed files."""
    coco = getattr(data_cfg, "annotations", {}).get(split)
    return coco.image_ids if coco is not None else yolo_image_ids(getattr(data_cfg, split))


def category_ids(data_cfg) -> list[int]:
    """The COCO category id of each class: the json's, else class + 1 (what `data convert` writes)."""
    ids = getattr(data_cfg, "category_ids", None)
    return list(ids) if ids is not None else list(range(1, len(data_cfg.names) + 1))
