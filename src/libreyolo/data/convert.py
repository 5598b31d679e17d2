"""`libreyolo data convert`: a detection dataset from YOLO txt labels to COCO json, or back.

- to COCO: `OUT/annotations/instances_{train,val}.json` (category id = class + 1, image id = the
  file stem where every stem is a distinct number, else 1..n: the ids `val --save-json` gives a
  YOLO dataset) and `OUT/data.yaml` with `train: {images, annotations}` naming the original image
  folders, so no image is copied;
- to YOLO: `OUT/images/{train,val}/` (hard links to the originals where the filesystem allows,
  else copies) with `OUT/labels/{train,val}/*.txt` and `OUT/data.yaml`; the classes are the
  categories in id order, and iscrowd boxes are left out (YOLO labels cannot say crowd; the count
  is printed).

Both read the dataset as training does (labels.scan_split: an unreadable image is skipped with
its one warning line) and write into a temp folder beside OUT, renamed to OUT at the end: a
conversion that fails leaves nothing. OUT must not exist yet.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import yaml

from ..errors import DataError
from .coco_json import yolo_image_ids
from .labels import scan_split

log = logging.getLogger("libreyolo")

FORMATS = ("coco", "yolo")


def convert(data: str, to: str, out: str | os.PathLike) -> dict[str, Any]:
    """Convert dataset `data` (anything `data=` takes for a detector) to `to` ('coco' or 'yolo')
    in the new folder `out`; returns {data_yaml, format, splits: {split: {images, boxes, crowd}}}."""
    from .dataset_yaml import load_data_config

    if to not in FORMATS:
        raise DataError(f"to={to}: convert to one of {', '.join(FORMATS)}")
    out = Path(out).expanduser()
    if out.exists():
        raise DataError(f"out={out} already exists: name a new folder")
    data_cfg = load_data_config(data)
    is_coco = data_cfg.category_ids is not None
    if is_coco == (to == "coco"):
        raise DataError(f"dataset {data_cfg.name} is already {'COCO json' if is_coco else 'YOLO'}")
    tmp = out.with_name(f".{out.name}.converting-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        writer = _to_coco if to == "coco" else _to_yolo
        if to == "yolo" and data_cfg.category_ids != list(range(1, data_cfg.nc + 1)):
            ids = ", ".join(map(str, data_cfg.category_ids[:8])) + (", ..." if data_cfg.nc > 8 else "")
            log.info(f"category ids {ids} become classes 0..{data_cfg.nc - 1}, in that order")
        splits = {s: writer(data_cfg, s, tmp) for s in ("train", "val") if _has(data_cfg, s)}
        top = {"path": str(out.resolve()), **{s: v.pop("entry") for s, v in splits.items()},
               "names": list(data_cfg.names)}
        (tmp / "data.yaml").write_text(yaml.safe_dump(top, sort_keys=False))
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"data_yaml": str(out / "data.yaml"), "format": to, "splits": splits}


def _has(data_cfg, split: str) -> bool:
    """A lone instances json has one split: the other is reported missing, not converted."""
    coco = data_cfg.annotations.get(split)
    if coco is not None and coco.missing:
        log.warning(f"{coco.missing}: not converted")
        return False
    return True


def _scan(data_cfg, split: str):
    return scan_split(split, getattr(data_cfg, split), data_cfg.nc, data_cfg.annotations.get(split))


def _to_coco(data_cfg, split: str, out: Path) -> dict[str, Any]:
    s = _scan(data_cfg, split)
    listed = getattr(data_cfg, split)
    ids = yolo_image_ids(listed)
    images_dir = Path(os.path.commonpath([str(f.parent) for f in s.files]))
    images, annotations = [], []
    for f, lab, (h, w), i in zip(s.files, s.labels, s.sizes, s.index):
        images.append({"id": ids[i], "file_name": f.relative_to(images_dir).as_posix(), "width": w, "height": h})
        for cls, cx, cy, bw, bh in lab.tolist():
            box = [(cx - bw / 2) * w, (cy - bh / 2) * h, bw * w, bh * h]
            annotations.append({"id": len(annotations) + 1, "image_id": ids[i], "category_id": int(cls) + 1,
                                "bbox": [round(v, 3) for v in box], "area": round(box[2] * box[3], 3),
                                "iscrowd": 0})
    doc = {"info": {"description": f"{data_cfg.name} ({split}), converted by libreyolo data convert"},
           "images": images, "annotations": annotations,
           "categories": [{"id": k + 1, "name": n} for k, n in enumerate(data_cfg.names)]}
    target = out / "annotations" / f"instances_{split}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(doc))
    return {"entry": {"images": str(images_dir), "annotations": f"annotations/instances_{split}.json"},
            "images": len(images), "boxes": len(annotations), "crowd": 0}


def _to_yolo(data_cfg, split: str, out: Path) -> dict[str, Any]:
    s = _scan(data_cfg, split)
    coco = data_cfg.annotations[split]
    crowd = 0
    for f, lab, extra in zip(s.files, s.labels, s.crowd or [()] * len(s)):
        rel = f.relative_to(coco.images_dir)
        image = out / "images" / split / rel
        image.parent.mkdir(parents=True, exist_ok=True)
        _link_or_copy(f, image)
        label = out / "labels" / split / rel.with_suffix(".txt")
        label.parent.mkdir(parents=True, exist_ok=True)
        label.write_text("".join(f"{int(c)} {cx:.6f} {cy:.6f} {bw:.6f} {bh:.6f}\n" for c, cx, cy, bw, bh in lab.tolist()))
        crowd += len(extra)
    if crowd:
        log.warning(f"{split}: {crowd} iscrowd boxes left out (YOLO labels cannot mark a box as a crowd)")
    return {"entry": f"images/{split}", "images": len(s), "boxes": sum(len(x) for x in s.labels), "crowd": crowd}


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another filesystem, or one without hard links
        shutil.copy2(src, dst)
