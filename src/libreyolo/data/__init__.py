"""Datasets and the data pipeline.

`load_data_config(data)` resolves a dataset (built-in name or yaml path) into a `DataConfig`;
`build_train_loader(data_cfg, cfg)` and `build_val_loader(data_cfg, cfg, batch=None)` return
iterables of `Batch` (uint8 images + padded `Targets`; see loader.py for the field contract).
"""

from .dataset_yaml import DataConfig, builtin_names, load_data_config
from .loader import Batch, TrainLoader, ValLoader, build_train_loader, build_val_loader

__all__ = ["Batch", "DataConfig", "TrainLoader", "ValLoader", "build_train_loader",
           "build_val_loader", "builtin_names", "load_data_config"]
