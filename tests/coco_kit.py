"""One small detection dataset written in both forms: YOLO txt labels and COCO json.

Images are 80 x 60 JPEGs of flat colour (at imgsz 64 the letterbox scale is exactly 0.8, so no
rounding moves a box); their boxes sit in four fixed slots (so a model that
predicts the slots scores a real, imperfect mAP). The COCO form uses non-contiguous category ids
(3, 7, 12), has a background image in each split, and may add one iscrowd box.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from torchvision.io import encode_jpeg

W, H = 80, 60
SLOTS = [(4, 4, 36, 28), (42, 4, 76, 28), (4, 32, 36, 56), (42, 32, 76, 56)]  # x1, y1, x2, y2 pixels
NAMES = ["cat", "dog", "bird"]
CATEGORY_IDS = [3, 7, 12]
COUNTS = {"train": 6, "val": 6}


def spec(seed: int = 0) -> dict[str, list[list[tuple[int, int]]]]:
    """Per split, per image: (slot, class) pairs; the last image of each split has none."""
    rng = np.random.default_rng(seed)
    out = {}
    for split, n in COUNTS.items():
        images = []
        for i in range(n):
            if i == n - 1:
                images.append([])
                continue
            slots = rng.choice(len(SLOTS), size=int(rng.integers(1, 4)), replace=False)
            images.append([(int(s), int(rng.integers(len(NAMES)))) for s in sorted(slots)])
        out[split] = images
    return out


def _jpeg(i: int) -> bytes:
    img = torch.full((3, H, W), (40 + 13 * i) % 251, dtype=torch.uint8)  # distinct bytes per image
    img[0, :8, :8] = 200
    return encode_jpeg(img, quality=95).numpy().tobytes()


def write_yolo(root: Path, objects=None) -> Path:
    """root/images/{split}/*.jpg, root/labels/{split}/*.txt, root/data.yaml."""
    objects = objects or spec()
    for split, images in objects.items():
        (root / "images" / split).mkdir(parents=True, exist_ok=True)
        (root / "labels" / split).mkdir(parents=True, exist_ok=True)
        for i, objs in enumerate(images):
            (root / "images" / split / f"{split}{i}.jpg").write_bytes(_jpeg(i + (7 if split == "val" else 0)))
            lines = []
            for slot, cls in objs:
                x1, y1, x2, y2 = SLOTS[slot]
                lines.append(f"{cls} {(x1 + x2) / 2 / W:.6f} {(y1 + y2) / 2 / H:.6f} {(x2 - x1) / W:.6f} "
                             f"{(y2 - y1) / H:.6f}\n")
            (root / "labels" / split / f"{split}{i}.txt").write_text("".join(lines))
    yaml = root / "data.yaml"
    yaml.write_text(f"path: .\ntrain: images/train\nval: images/val\nnames: {NAMES}\n")
    return yaml


def write_coco(root: Path, objects=None, crowd: dict | None = None) -> Path:
    """The COCO layout: root/annotations/instances_{split}.json, root/{split}/*.jpg; the same images
    as write_yolo. `crowd`: {split: [(image index, slot, class)]} extra iscrowd boxes."""
    objects = objects or spec()
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    for split, images in objects.items():
        (root / split).mkdir(parents=True, exist_ok=True)
        doc = {"images": [], "annotations": [],
               "categories": [{"id": c, "name": n} for c, n in zip(CATEGORY_IDS, NAMES)][::-1]}  # any order
        for i, objs in enumerate(images):
            image_id = 1000 + 10 * i  # not 1..n: the ids must come back as the json's
            (root / split / f"{split}{i}.jpg").write_bytes(_jpeg(i + (7 if split == "val" else 0)))
            doc["images"].append({"id": image_id, "file_name": f"{split}{i}.jpg", "width": W, "height": H})
            extra = [(s, c) for k, s, c in (crowd or {}).get(split, []) if k == i]
            for n, (slot, cls) in enumerate([*objs, *extra]):
                x1, y1, x2, y2 = SLOTS[slot]
                doc["annotations"].append({"id": len(doc["annotations"]) + 1, "image_id": image_id,
                                           "category_id": CATEGORY_IDS[cls], "bbox": [x1, y1, x2 - x1, y2 - y1],
                                           "area": (x2 - x1) * (y2 - y1), "iscrowd": int(n >= len(objs))})
        (root / "annotations" / f"instances_{split}.json").write_text(json.dumps(doc))
    return root / "annotations" / "instances_val.json"
