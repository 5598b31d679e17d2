"""Datasets and the data pipeline.

Detection: `load_data_config(data)` resolves a dataset (built-in name or yaml path) into a
`DataConfig`; `build_train_loader(data_cfg, cfg)` and `build_val_loader(data_cfg, cfg, batch=None)`
return iterables of `Batch` (uint8 images + padded `Targets`; see loader.py for the field contract).

Classification: `load_classify_data(data)` resolves and checks a class-folder dataset (folder, yaml
or built-in name) into a `ClassifyData`; `build_classify_train_loader` / `build_classify_val_loader`
return iterables of `ClassBatch` (uint8 images + int64 `ClassTargets`; see classify.py).

Segmentation: `load_segment_data(data)` resolves and checks an images + masks dataset (folder,
ADE20K, Cityscapes, yaml or built-in name) into a `SegmentData`; `build_segment_train_loader` /
`build_segment_val_loader` return iterables of `SegBatch` (uint8 images + `SegTargets` masks; see
segment.py).
"""

from .classify import (
    ClassBatch,
    ClassifyData,
    ClassTargets,
    build_classify_stats_loader,
    build_classify_train_loader,
    build_classify_val_loader,
    load_classify_data,
)
from .dataset_yaml import DataConfig, builtin_names, load_data_config
from .loader import Batch, TrainLoader, ValLoader, build_stats_loader, build_train_loader, build_val_loader
from .segment import (
    SegBatch,
    SegmentData,
    SegTargets,
    build_segment_stats_loader,
    build_segment_train_loader,
    build_segment_val_loader,
    load_segment_data,
)

__all__ = ["Batch", "ClassBatch", "ClassTargets", "ClassifyData", "DataConfig", "SegBatch", "SegTargets",
           "SegmentData", "TrainLoader", "ValLoader", "build_classify_stats_loader", "build_classify_train_loader",
           "build_classify_val_loader",
           "build_segment_stats_loader", "build_segment_train_loader", "build_segment_val_loader",
           "build_stats_loader", "build_train_loader", "build_val_loader",
           "builtin_names", "load_classify_data", "load_data_config", "load_segment_data"]
