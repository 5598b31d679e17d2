"""Object detection: YOLO-format datasets, COCO box mAP (faster-coco-eval), boxes from predict."""

from __future__ import annotations

from typing import Any

from .base import TaskSpec, lazy


def _evaluate(model, loader, device, cfg, *, amp_dtype=None, names=None, progress: bool = False,
              save_json=None) -> dict[str, Any]:
    from ..eval import evaluate

    return evaluate(model, loader, device, conf=cfg.conf, iou=cfg.iou, max_det=cfg.max_det,
                    amp_dtype=amp_dtype, names=names, progress=progress, save_json=save_json)


def _pack(batch) -> dict:
    return {"images": batch.images, "boxes": batch.targets.boxes, "labels": batch.targets.labels,
            "valid": batch.targets.valid}


def _unpack(saved: dict, pin: bool):
    from ..data import Batch
    from ..families.base import Targets

    images = saved["images"].pin_memory() if pin else saved["images"]
    return Batch(images=images, targets=Targets(saved["boxes"], saved["labels"], saved["valid"]))


def fitness(metrics: dict[str, float]) -> float:
    """0.9 mAP50-95 + 0.1 mAP50, the weighting YOLOv5-v9 pick their best checkpoint by."""
    return 0.9 * metrics["map50_95"] + 0.1 * metrics["map50"]


SPEC = TaskSpec(
    name="detect",
    display="object detection",
    metrics=("map50_95", "map50"),
    labels={"map50_95": "mAP50-95", "map50": "mAP50"},
    fitness=fitness,
    load_data=lazy("libreyolo.data", "load_data_config"),
    train_loader=lazy("libreyolo.data", "build_train_loader"),
    val_loader=lazy("libreyolo.data", "build_val_loader"),
    stats_loader=lazy("libreyolo.data", "build_stats_loader"),
    evaluate=_evaluate,
    table=lazy("libreyolo.eval.table", "detect_table"),
    table_note=("P and R at the confidence where the mean F1 is highest; mAP at IoU 0.5 and 0.5:0.95 (COCO, "
                "101 recall points)"),
    pack_batch=_pack,
    unpack_batch=_unpack,
    predicts="[B, N, 4 + classes]: boxes xyxy in input pixels, then per-class scores in [0, 1]",
    prepare=lazy("libreyolo.predict.post", "prepare_detect"),
    results=lazy("libreyolo.predict.post", "detect_results"),
    default_classes=80,
    data_help="a built-in name (shapes, coco128), a YOLO dataset yaml (path, train, val, names) or COCO json "
              "(an instances_*.json, or a yaml with train: {images, annotations})",
    builtin_data="shapes",
    detail_keys=("per_class", "curves"),
)
