"""Point detection (object centroids): YOLO-format box datasets, F1 at a centroid distance, points
from predict.

The data is detection's, unchanged (data/dataset_yaml.py, the loaders of data/loader.py, the
built-in `shapes`): a box label's point is its centre, taken where the loss and the evaluator
need it, on the device (families/points.py `box_centroids`). docs/points.md is the user's page.
"""

from __future__ import annotations

from typing import Any

from .base import TaskSpec, lazy
from .detect import _pack, _unpack


def _evaluate(model, loader, device, cfg, *, amp_dtype=None, names=None, progress: bool = False) -> dict[str, Any]:
    from ..eval.points import evaluate_points

    return evaluate_points(model, loader, device, conf=cfg.conf, dist=cfg.point_dist, amp_dtype=amp_dtype,
                           names=names, progress=progress)


def fitness(metrics: dict[str, float]) -> float:
    """F1 at the centroid distance: the figure Edge Impulse's FOMO keeps its best epoch by (val_f1)."""
    return metrics["f1"]


SPEC = TaskSpec(
    name="points",
    display="point detection (object centroids)",
    metrics=("f1", "precision", "recall"),
    labels={"f1": "F1", "precision": "P", "recall": "R"},
    fitness=fitness,
    load_data=lazy("libreyolo.data", "load_data_config"),
    train_loader=lazy("libreyolo.data", "build_train_loader"),
    val_loader=lazy("libreyolo.data", "build_val_loader"),
    stats_loader=lazy("libreyolo.data", "build_stats_loader"),
    evaluate=_evaluate,
    table=lazy("libreyolo.eval.table", "points_table"),
    table_note=("a point at confidence above conf is a true positive within point_dist px (network input) of a "
                "box centre of its class that no better point took; each centre counts once"),
    pack_batch=_pack,  # the detection batch: images and boxes
    unpack_batch=_unpack,
    predicts=("[B, 1 + classes, S/8, S/8]: per-cell probabilities (softmax over background, then each class), "
              "one cell per 8 x 8 input pixels"),
    prepare=lazy("libreyolo.predict.post", "prepare_detect"),  # the letterbox, as validation
    results=lazy("libreyolo.predict.post", "points_results"),
    default_classes=80,  # a detection dataset's classes, COCO's count as for detect
    data_help="a built-in name (shapes, coco128) or a YOLO dataset yaml (path, train, val, names); each box "
              "label becomes its centre point",
    builtin_data="shapes",
    detail_keys=("per_class",),
)
