"""COCO box mAP of a model over a validation loader, through faster-coco-eval.

Each batch is predicted, post-processed and mapped back to original image pixels (ground truth
too, so letterbox rounding affects both sides equally). Everything is collected as small numpy
arrays; the COCO dicts are built in memory once, at the end. A COCO-json dataset's iscrowd boxes
(the loader's `crowd()`) join the ground truth as crowd regions, which the COCO metric neither
rewards nor holds against a detection. Nothing is written to disk unless `save_json` asks for the
detections as a COCO results file (original image and category ids: the loader's `image_ids` and
`category_ids`).
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from libreyolo.eval.details import details
from libreyolo.eval.loop import predict, validating
from libreyolo.eval.postprocess import postprocess, unletterbox


def evaluate(
    model: nn.Module,
    loader: Iterable,
    device: torch.device | str,
    *,
    conf: float = 0.001,
    iou: float = 0.7,
    max_det: int = 300,
    amp_dtype: torch.dtype | None = None,
    names: Sequence[str] | dict[int, str] | None = None,
    progress: bool = True,
    verbose: bool = False,
    preprocess: Callable[[Tensor], Tensor] | None = None,
    save_json: str | Path | None = None,
) -> dict[str, Any]:
    """Validate `model` (already on `device`) over `loader`; return COCO box metrics.

    Batches need fields `images`, `targets` (`families.base.Targets`, letterboxed pixels),
    `image_ids`, `orig_sizes [B, 2]` (h, w), `ratios [B]` and `pads [B, 2]` (left, top).
    `preprocess` turns the batch images (already on `device`) into network input; by default
    uint8 images are scaled to [0, 1] floats and float images pass through.
    Autocast with `amp_dtype` is used on CUDA only. The model's train/eval mode is restored.
    An image id seen twice (a distributed sampler pads with repeats) is counted once.
    Returns {"map50_95", "map50", "num_images", "num_dets"}, no ground truth at all giving zeros,
    and what eval/details.py computes: "precision" and "recall" (means over the classes),
    "per_class" (one row per class: images, instances, precision, recall, map50, map50_95) and
    "curves" (PR curves, F1 against confidence, the confusion matrix; for results.html).
    `verbose=True` lets faster-coco-eval print its summary table. With a COCO-json dataset the
    per-class rows also carry the json's `category_id`. `save_json`: write the detections there as
    a COCO results list ({image_id, category_id, bbox [x, y, w, h], score}, original pixels and
    ids) and return its path as "saved_json".
    """
    device = torch.device(device)
    preprocess = preprocess or _default_preprocess
    collector = _Collector()
    nms = not getattr(model, "end_to_end", False)  # DETRs: top-k over queries, no NMS
    with validating(model, loader, progress) as batches:
        for batch in batches:
            preds = predict(model, preprocess(batch.images.to(device, non_blocking=True)), amp_dtype)
            collector.add(batch, postprocess(preds, conf=conf, iou=iou, max_det=max_det, multi_label=True, nms=nms))
    crowd = collector.crowd_rows(loader)
    evaluator = coco_evaluator(collector.gt, collector.dets, collector.sizes, names, verbose, crowd=crowd)
    map50_95, map50 = _headline(evaluator)
    classes = _class_names(names, collector.gt, collector.dets)
    precision = evaluator.eval["precision"] if evaluator is not None else None
    recall_points = np.asarray(evaluator.params.recThrs) if evaluator is not None else None
    out = {
        "map50_95": map50_95,
        "map50": map50,
        "num_images": len(collector.sizes),
        "num_dets": int(sum(len(d) for d in collector.dets)),
        **details(collector.gt, collector.dets, len(collector.sizes), classes, precision, recall_points),
    }
    category_ids = getattr(loader, "category_ids", None)
    if getattr(loader, "coco_categories", False) and category_ids:
        for row in out["per_class"]:
            if row["id"] < len(category_ids):
                row["category_id"] = category_ids[row["id"]]
    if save_json is not None:
        out["saved_json"] = str(write_results_json(save_json, collector, loader))
    return out


def write_results_json(path: str | Path, collector: _Collector, loader: Any) -> Path:
    """The collected detections as a COCO results file (what pycocotools' and faster-coco-eval's
    `loadRes` read), under the loader's original image and category ids (else image index + 1 and
    class + 1); written to a temp file and renamed."""
    from ..atomic import write_json_atomic

    image_ids, category_ids = getattr(loader, "image_ids", None), getattr(loader, "category_ids", None)
    keys = {dense: key for key, dense in collector.ids.items()}
    results = []
    for row in _det_list(np.concatenate(collector.dets)) if collector.dets else []:
        key, cls = keys[row["image_id"]], row["category_id"] - 1
        row["image_id"] = int(image_ids[key]) if image_ids is not None else int(key) + 1
        row["category_id"] = int(category_ids[cls]) if category_ids is not None and cls < len(category_ids) \
            else cls + 1
        row["bbox"] = [round(v, 3) for v in row["bbox"]]
        row["score"] = round(row["score"], 5)
        results.append(row)
    return write_json_atomic(path, results, indent=None)


def _default_preprocess(images: Tensor) -> Tensor:
    return images.float().div_(255) if not images.is_floating_point() else images


class _Collector:
    """Detections and ground truth of the images seen so far, in original image pixels.

    `dets` rows: (image, x1, y1, x2, y2, score, class); `gt` rows: (image, x1, y1, x2, y2, class);
    `image` is a dense id 1..n in order of first appearance, `sizes[k]` = (h, w) of image k + 1.
    """

    def __init__(self) -> None:
        self.ids: dict[Any, int] = {}
        self.sizes: list[tuple[int, int]] = []
        self.dets: list[np.ndarray] = []
        self.gt: list[np.ndarray] = []

    def add(self, batch: Any, dets: list[Tensor]) -> None:
        ratios = torch.as_tensor(batch.ratios).cpu().reshape(-1)
        pads = torch.as_tensor(batch.pads).cpu().reshape(-1, 2)
        sizes = torch.as_tensor(batch.orig_sizes).cpu().reshape(-1, 2)
        dense, fresh = self._register(batch.image_ids, sizes)
        # One row index per detection, pointing at its image in the batch.
        counts = torch.tensor([len(d) for d in dets])
        owner = torch.repeat_interleave(torch.arange(len(dets)), counts)
        d = torch.cat(dets).cpu() if dets else torch.zeros(0, 6)
        boxes = unletterbox(d[:, :4], ratios[owner], pads[owner], sizes[owner])
        self._append(self.dets, dense[owner], fresh[owner], boxes, d[:, 4:6])

        t = batch.targets
        owner, slot = t.valid.cpu().nonzero(as_tuple=True)
        boxes = unletterbox(t.boxes.cpu().float()[owner, slot], ratios[owner], pads[owner], sizes[owner])
        labels = t.labels.cpu()[owner, slot].float()[:, None]
        # A box clipped to nothing can never be matched; it is a label error, not a miss.
        real = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
        self._append(self.gt, dense[owner], fresh[owner] & real, boxes, labels)

    def _register(self, image_ids: Any, sizes: Tensor) -> tuple[Tensor, Tensor]:
        """Dense id of each image of the batch, and whether it is seen for the first time."""
        if isinstance(image_ids, Tensor):
            image_ids = image_ids.tolist()
        dense, fresh = [], []
        for key, (h, w) in zip(image_ids, sizes.tolist()):
            fresh.append(key not in self.ids)
            if fresh[-1]:
                self.ids[key] = len(self.ids) + 1
                self.sizes.append((int(h), int(w)))
            dense.append(self.ids[key])
        return torch.tensor(dense, dtype=torch.float64), torch.tensor(fresh, dtype=torch.bool)

    def crowd_rows(self, loader: Any) -> list[np.ndarray]:
        """The iscrowd boxes of the images seen, as `gt` rows (none where the loader has none)."""
        crowd = loader.crowd() if callable(getattr(loader, "crowd", None)) else None
        rows = []
        for key, dense in self.ids.items() if crowd is not None else ():
            boxes, cls = crowd[int(key)]
            if len(boxes):
                rows.append(np.concatenate([np.full((len(boxes), 1), dense, np.float64), boxes.astype(np.float64),
                                            cls[:, None].astype(np.float64)], 1))
        return rows

    @staticmethod
    def _append(store: list, image: Tensor, keep: Tensor, boxes: Tensor, extra: Tensor) -> None:
        rows = torch.cat([image[:, None], boxes.double(), extra.double()], dim=1)[keep]
        if len(rows):
            store.append(rows.numpy())


def coco_map(
    gt: list[np.ndarray],
    dets: list[np.ndarray],
    sizes: list[tuple[int, int]],
    names: Sequence[str] | dict[int, str] | None = None,
    verbose: bool = False,
) -> tuple[float, float]:
    """(mAP50-95, mAP50) from `_Collector` rows; (0, 0) without ground truth or detections.

    Standard COCO parameters (101-point interpolation, maxDets 100 per image and class), so the
    numbers compare with published COCO results. Category ids are class + 1.
    """
    return _headline(coco_evaluator(gt, dets, sizes, names, verbose))


def coco_evaluator(gt: list[np.ndarray], dets: list[np.ndarray], sizes: list[tuple[int, int]],
                   names: Sequence[str] | dict[int, str] | None = None, verbose: bool = False,
                   crowd: list[np.ndarray] | None = None):
    """The accumulated faster-coco-eval evaluator of `_Collector` rows (its `stats` summarised, its
    `eval["precision"]` array for per-class figures and curves); None without ground truth or
    detections (older evaluators crash on it). `crowd`: iscrowd regions, rows like `gt`."""
    if not gt or not dets:
        return None
    from faster_coco_eval import (  # imported lazily: the CLI stays fast
        COCO,
        COCOeval_faster,
    )

    gt_rows, det_rows = np.concatenate(gt), np.concatenate(dets)
    crowd_rows = np.concatenate(crowd) if crowd else np.zeros((0, 6))
    say = print if verbose else _silent
    num_classes = _num_classes(names, gt_rows[:, 5], det_rows[:, 6])
    # print_function is set as an attribute: not every supported version takes it as an argument.
    quiet = contextlib.nullcontext() if verbose else contextlib.redirect_stdout(io.StringIO())
    with quiet:
        coco_gt = COCO(_gt_dict(gt_rows, sizes, names, num_classes, crowd_rows))
        coco_gt.print_function = say
        coco_dt = coco_gt.loadRes(_det_list(det_rows))
        coco_dt.print_function = say
        evaluator = COCOeval_faster(coco_gt, coco_dt, iouType="bbox")
        evaluator.print_function = say
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    return evaluator


def _headline(evaluator) -> tuple[float, float]:
    if evaluator is None:
        return 0.0, 0.0
    # COCO reports -1 for "nothing to measure"; as a training metric that is simply 0.
    return max(float(evaluator.stats[0]), 0.0), max(float(evaluator.stats[1]), 0.0)


def _class_names(names: Any, gt: list[np.ndarray], dets: list[np.ndarray]) -> list[str]:
    """One name per class id 0..n-1 (the ids themselves where `names` has none)."""
    gt_cls = np.concatenate(gt)[:, 5] if gt else np.zeros(0)
    det_cls = np.concatenate(dets)[:, 6] if dets else np.zeros(0)
    return [_class_name(names, k) for k in range(_num_classes(names, gt_cls, det_cls))]


def _silent(*args: Any, **kwargs: Any) -> None:
    return None


def _num_classes(names: Any, gt_cls: np.ndarray, det_cls: np.ndarray) -> int:
    largest = int(max(gt_cls.max(initial=-1), det_cls.max(initial=-1))) + 1
    if names is None:
        return largest
    known = max(names) + 1 if isinstance(names, dict) else len(names)
    return max(known, largest)


def _class_name(names: Any, k: int) -> str:
    if isinstance(names, dict):
        return str(names.get(k, k))
    return str(names[k]) if names is not None and k < len(names) else str(k)


def _xywh(rows: np.ndarray) -> np.ndarray:
    return np.stack([rows[:, 0], rows[:, 1], rows[:, 2] - rows[:, 0], rows[:, 3] - rows[:, 1]], 1)


def _gt_dict(rows: np.ndarray, sizes: list, names: Any, num_classes: int, crowd: np.ndarray | None = None) -> dict:
    crowd = np.zeros((0, 6)) if crowd is None else crowd
    every = np.concatenate([rows, crowd])
    boxes = _xywh(every[:, 1:5])
    annotations = [
        {
            "id": k + 1,  # id 0 means "unmatched" inside the evaluator
            "image_id": int(img),
            "category_id": int(cls) + 1,
            "bbox": box.tolist(),
            "area": float(box[2] * box[3]),
            "iscrowd": int(k >= len(rows)),
        }
        for k, (img, cls, box) in enumerate(zip(every[:, 0], every[:, 5], boxes))
    ]
    return {
        "images": [{"id": k + 1, "height": h, "width": w} for k, (h, w) in enumerate(sizes)],
        "annotations": annotations,
        "categories": [{"id": k + 1, "name": _class_name(names, k)} for k in range(num_classes)],
    }


def _det_list(rows: np.ndarray) -> list[dict]:
    boxes = _xywh(rows[:, 1:5])
    return [
        {"image_id": int(img), "category_id": int(cls) + 1, "bbox": box.tolist(), "score": float(s)}
        for img, s, cls, box in zip(rows[:, 0], rows[:, 5], rows[:, 6], boxes)
    ]
