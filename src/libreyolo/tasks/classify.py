"""Image classification: class-folder datasets, top-1/top-5 accuracy, probabilities from predict."""

from __future__ import annotations

from typing import Any

from .base import TaskSpec, lazy


def _evaluate(model, loader, device, cfg, *, amp_dtype=None, names=None, progress: bool = False) -> dict[str, Any]:
    from ..eval.classify import evaluate_classify

    return evaluate_classify(model, loader, device, amp_dtype=amp_dtype, names=names, progress=progress)


def _pack(batch) -> dict:
    return {"images": batch.images, "labels": batch.targets.labels}


def _unpack(saved: dict, pin: bool):
    from ..data import ClassBatch, ClassTargets

    images = saved["images"].pin_memory() if pin else saved["images"]
    return ClassBatch(images=images, targets=ClassTargets(saved["labels"]))


def fitness(metrics: dict[str, float]) -> float:
    """top-1 accuracy: the figure classification results are compared by."""
    return metrics["top1"]


SPEC = TaskSpec(
    name="classify",
    display="image classification",
    metrics=("top1", "top5"),
    labels={"top1": "top-1", "top5": "top-5"},
    fitness=fitness,
    load_data=lazy("libreyolo.data", "load_classify_data"),
    train_loader=lazy("libreyolo.data", "build_classify_train_loader"),
    val_loader=lazy("libreyolo.data", "build_classify_val_loader"),
    stats_loader=lazy("libreyolo.data", "build_classify_stats_loader"),
    evaluate=_evaluate,
    table=lazy("libreyolo.eval.table", "classify_table"),
    table_note="top-1: the highest score is the label; top-5: the label is among the 5 highest",
    pack_batch=_pack,
    unpack_batch=_unpack,
    predicts="[B, classes]: per-class probabilities (softmax), summing to 1 per image",
    prepare=lazy("libreyolo.predict.post", "prepare_classify"),
    results=lazy("libreyolo.predict.post", "classify_results"),
    default_classes=1000,
    data_help="a built-in name (shapes-cls), a folder with train/<class>/ and val/<class>/ image folders, "
              "or a yaml naming such folders (path, train, val)",
    builtin_data="shapes-cls",
    detail_keys=("per_class",),
)
