"""Semantic segmentation: images with single-channel class masks, mIoU and pixel accuracy, a class
map from predict."""

from __future__ import annotations

from typing import Any

from .base import TaskSpec, lazy


def _evaluate(model, loader, device, cfg, *, amp_dtype=None, names=None, progress: bool = False) -> dict[str, Any]:
    from ..eval.segment import evaluate_segment

    return evaluate_segment(model, loader, device, ignore_index=cfg.ignore_index, amp_dtype=amp_dtype,
                            names=names, progress=progress)


def _pack(batch) -> dict:
    return {"images": batch.images, "masks": batch.targets.masks}


def _unpack(saved: dict, pin: bool):
    from ..data.segment import SegBatch, SegTargets

    images, masks = saved["images"], saved["masks"]
    if pin:
        images, masks = images.pin_memory(), masks.pin_memory()
    return SegBatch(images=images, targets=SegTargets(masks))


def fitness(metrics: dict[str, float]) -> float:
    """mIoU: the figure semantic segmentation results are compared by."""
    return metrics["miou"]


SPEC = TaskSpec(
    name="segment",
    display="semantic segmentation",
    metrics=("miou", "pixel_acc"),
    labels={"miou": "mIoU", "pixel_acc": "pixel acc"},
    fitness=fitness,
    load_data=lazy("libreyolo.data.segment", "load_segment_data"),
    train_loader=lazy("libreyolo.data.segment", "build_segment_train_loader"),
    val_loader=lazy("libreyolo.data.segment", "build_segment_val_loader"),
    stats_loader=lazy("libreyolo.data.segment", "build_segment_stats_loader"),
    evaluate=_evaluate,
    table=lazy("libreyolo.eval.table", "segment_table"),
    table_note=("IoU = TP / (TP + FP + FN) per class over the whole val set at imgsz x imgsz; mIoU the mean over "
                "classes present in the ground truth or the prediction; ignored pixels do not count"),
    pack_batch=_pack,
    unpack_batch=_unpack,
    predicts="[B, classes, S, S]: per-pixel class probabilities (softmax) at the input size",
    prepare=lazy("libreyolo.predict.post", "prepare_segment"),
    results=lazy("libreyolo.predict.post", "segment_results"),
    default_classes=150,  # ADE20K's 150 classes, the published SegFormer configuration
    data_help="a built-in name (shapes-seg), a folder with images/{train,val} and masks/{train,val} (or the "
              "ADE20K or Cityscapes layout), or a yaml naming such folders (path, train, val, train_masks, "
              "val_masks, names)",
    builtin_data="shapes-seg",
    detail_keys=("per_class",),
)
