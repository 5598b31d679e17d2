"""Semantic segmentation data: image + single-channel class-mask datasets, their checks, loaders
and batches.

Batches mirror the classification loaders (classify.py): uint8 images [B, 3, S, S] plus class
masks [B, S, S] (uint8 when every class id and the ignore index fit in a byte, else int64), with
`ignore_index` (default 255) where a pixel is unlabelled or padding. `SegTargets.to()` hands the
device int64 masks, what cross-entropy and the confusion matrix index with.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class SegTargets(NamedTuple):
    masks: torch.Tensor  # [B, S, S] class ids, ignore_index where ignored or padded

    def to(self, device: torch.device | str, non_blocking: bool = False) -> SegTargets:
        """On `device`, as int64 (a uint8 mask crosses the bus as one byte a pixel, then widens there)."""
        return SegTargets(self.masks.to(device, non_blocking=non_blocking).long())


class SegBatch(NamedTuple):
    images: torch.Tensor  # uint8 [B, 3, S, S]; the step does .float() / 255 on the device
    targets: SegTargets

    def to(self, device: torch.device | str, non_blocking: bool = False) -> SegBatch:
        return SegBatch(self.images.to(device, non_blocking=non_blocking), self.targets.to(device, non_blocking))
