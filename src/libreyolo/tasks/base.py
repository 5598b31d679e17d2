"""The task contract: what differs between detection, classification, ... and nothing else.

A task is one module in `tasks/` that declares a `TaskSpec`; `tasks/__init__.py` registers it with
one line. The step, precision, CUDA graphs, DDP and the profiler never look at the task: they see a
batch with `images` (uint8 [B, 3, S, S]) and `targets` (anything with `.to(device)`), a model that
follows the family contract (families/base.py) and a criterion. What the task decides:

- its data: how `data=` resolves (`load_data`), the loaders and their batch type, and
  `stats_loader`: some training images loaded as validation loads images, where `precise_bn`
  measures BatchNorm's statistics before each validation (engine/precise_bn.py);
- its evaluation: `evaluate` (model, loader, device, cfg, ...) -> metrics, the scalar metric names
  (`metrics`, headline first) and how they are shown (`labels`), the non-scalar results that feed
  results.html (`detail_keys`), and `fitness`, the one number that picks best.pt;
- what `model.predict(images)` returns (`predicts`, the contract text) and its per-class table
  (`table`, `table_note`: what `val` prints and results.html shows);
- the two ends of `predict`: an image into network input with validation's own transform
  (`prepare`), and network output into `predict.Result`s in original pixels (`results`);
- how `libreyolo bench step` saves and restores one batch (`pack_batch`, `unpack_batch`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def lazy(module: str, name: str) -> Callable[..., Any]:
    """`module.name`, imported at the first call: a task module stays free of the data, eval and
    torch imports until a task is actually used (the CLI answers `--help` without them)."""
    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    return call


@dataclass(frozen=True)
class TaskSpec:
    name: str                                   # registry name and the `task=` value: "detect"
    display: str                                # "object detection"
    metrics: tuple[str, ...]                    # scalar metrics, headline first: ("map50_95", "map50")
    labels: dict[str, str]                      # as printed: {"map50_95": "mAP50-95"}
    fitness: Callable[[dict[str, float]], float]  # metrics -> the number best.pt maximises
    load_data: Callable[[str], Any]             # data= -> a dataset with .name, .names (class names)
    train_loader: Callable[..., Any]            # (data, cfg, rank, world_size) -> training loader
    val_loader: Callable[..., Any]              # (data, cfg, batch=None) -> validation loader
    stats_loader: Callable[..., Any]            # (data, cfg, train_loader, images, batch) -> that many training
                                                # images as validation loads them (precise_bn)
    evaluate: Callable[..., dict[str, Any]]     # (model, loader, device, cfg, *, amp_dtype, names, progress)
    table: Callable[[dict[str, Any]], tuple[list[str], list[list[str]]]]  # metrics -> per-class (head, rows)
    table_note: str                             # what the table's figures mean (val's title, results.html)
    pack_batch: Callable[[Any], dict]           # one batch -> {name: tensor} (bench step)
    unpack_batch: Callable[[dict, bool], Any]   # ({name: tensor}, pin) -> the batch again
    predicts: str                               # what model.predict(images) returns
    prepare: Callable[..., tuple[Any, Any]]     # (RGB uint8 [3,h,w], imgsz) -> (network image, meta): val's transform
    results: Callable[..., list]                # (preds, metas, frames, names, PostOptions) -> predict.Result per image
    default_classes: int                        # classes of a model built without a checkpoint (COCO 80, ImageNet 1000)
    data_help: str                              # the data= forms this task reads, for errors and help
    builtin_data: str                           # the generated offline set: bench's default data=
    detail_keys: tuple[str, ...] = ()           # evaluate()'s non-scalar results (results.html)

    def summary(self, metrics: dict[str, Any], sep: str = " ") -> str:
        """'mAP50-95 0.5123 mAP50 0.7012': the scalar metrics present in `metrics`, in order."""
        return sep.join(f"{self.labels[k]} {metrics[k]:.4f}" for k in self.metrics if k in metrics)

    def report(self, metrics: dict[str, Any], file=None) -> None:
        """The per-class table on stderr: rich on a terminal, aligned text in a log."""
        from ..eval.table import print_rows

        print_rows(*self.table(metrics), f"validation: {self.table_note}", file)

    def scalars(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """`metrics` without the detail keys: what checkpoints, results.csv and --json carry."""
        return {k: v for k, v in metrics.items() if k not in self.detail_keys}
