"""A synthetic pinned batch in the trainer's format, shared by the GPU tests."""

import torch

from libreyolo.data import Batch
from libreyolo.families.base import Targets


def synthetic_batch(b: int = 8, size: int = 256, seed: int = 0, empty_first: bool = False) -> Batch:
    """Random uint8 images with 1-7 random boxes each (10 classes); image 0 empty if asked."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 255, (b, 3, size, size), dtype=torch.uint8, generator=g)
    m = 8
    xy = torch.rand(b, m, 2, generator=g) * size * 0.6
    wh = torch.rand(b, m, 2, generator=g) * size * 0.3 + 8
    boxes = torch.cat([xy, xy + wh], -1)
    labels = torch.randint(0, 10, (b, m), generator=g)
    valid = torch.arange(m).expand(b, m) < torch.randint(1, m, (b, 1), generator=g)
    if empty_first:
        valid[0] = False
    return Batch(images=images.pin_memory(),
                 targets=Targets(boxes.pin_memory(), labels.pin_memory(), valid.pin_memory()))
