"""Datasets and the data pipeline.

Detection: `load_data_config(data)` resolves a dataset (built-in name or yaml path) into a
`DataConfig`; `build_train_loader(data_cfg, cfg)` and `build_val_loader(data_cfg, cfg, batch=None)`
return iterables of `Batch` (uint8 images + padded `Targets`; see loader.py for the field contract).

Classification: `load_classify_data(data)` resolves and checks a class-folder dataset (folder, yaml
or built-in name) into a `ClassifyData`; `build_classify_train_loader` / `build_classify_val_loader`
return iterables of `ClassBatch` (uint8 images + int64 `ClassTargets`; see classify.py).
"""

from .classify import (
    ClassBatch,
    ClassifyData,
    ClassTargets,
    build_classify_train_loader,
    build_classify_val_loader,
    load_classify_data,
)
from .dataset_yaml import DataConfig, builtin_names, load_data_config
from .loader import Batch, TrainLoader, ValLoader, build_train_loader, build_val_loader

__all__ = ["Batch", "ClassBatch", "ClassTargets", "ClassifyData", "DataConfig", "TrainLoader", "ValLoader",
           "build_classify_train_loader", "build_classify_val_loader", "build_train_loader",
           "build_val_loader", "builtin_names", "load_classify_data", "load_data_config"]
