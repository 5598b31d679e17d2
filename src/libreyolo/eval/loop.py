"""What every evaluator's loop shares: the model in eval mode under inference mode, the batches
behind a progress bar, the model's train/eval mode restored however the loop ends; and one
prediction per batch under autocast (CUDA only)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch
from torch import Tensor, nn

from ..logs import progress_bar


@contextlib.contextmanager
def validating(model: nn.Module, loader: Iterable, progress: bool) -> Iterator[Iterable]:
    """`with validating(model, loader, progress) as batches:` the loader's batches, with the model
    in eval mode and autograd off (inference mode); its train/eval mode comes back on exit."""
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode(), progress_bar(loader, progress, "validating") as batches:
            yield batches
    finally:
        model.train(was_training)


def to_input(images: Tensor, device: torch.device) -> Tensor:
    """A batch's uint8 images on `device` as float [0, 1]: what the step hands a network too."""
    return images.to(device, non_blocking=True).float().div_(255.0)


def predict(model: nn.Module, images: Tensor, amp_dtype: torch.dtype | None) -> Tensor:
    """`model.predict(images)`, under autocast to `amp_dtype` where the images are on a CUDA device."""
    cuda = images.device.type == "cuda"
    with torch.autocast(images.device.type, dtype=amp_dtype, enabled=amp_dtype is not None and cuda):
        return model.predict(images)
