"""BatchNorm statistics measured again before validation (`precise_bn=N`).

In training mode a BatchNorm keeps running averages (momentum 0.03 in most families, a memory of
about 33 batches) of its batches' mean and variance, and eval mode normalises with them. Those
averages describe the training batches of the last few epochs, at the weights of those batches,
after mosaic and the other augmentations, while validation and predict feed plain letterboxed
images to today's weights. In a long run the difference averages out. In a short one it need not:
on the one-class regime YOLO-NAS-s's val mAP fell from 0.86 to 0.2-0.4 for single epochs, on
every seed, with its training losses smooth, and scored with statistics measured on the val
images its curve had no such fall (benchmarks/val_dip_probe.py; docs/accuracy.md).

So before each validation of an epoch that trained with mosaic (the trainer's `_stats_images`
says why only then) the validated weights (the EMA) get their statistics measured again:
reset, then a plain average over `N` training images, spread evenly over the split and loaded as
validation loads images, with no gradient and no other module in training mode. That is
Detectron2's PreciseBN, here on the inference distribution rather than the augmented one (Wu and
Johnson, "Rethinking 'Batch' in BatchNorm", arXiv 2105.07576, sections 3 and 4, on both the
averages' lag and the train-test gap). The val split is never used. The EMA's own buffers are
overwritten in place, so best.pt and last.pt hold the statistics that their figure was measured
with; the average blends them away at its next updates, and training never reads them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import torch
from torch import nn

from ..eval.loop import to_input

# The measurement's batch (the training batch where that is larger): one batch is one estimate, and a
# larger one's variance is nearer the images' as a whole (the average of per-batch variances falls
# short of it by the variance of the batch means); on a GPU its eager forward costs little more
# launching than a small one's, so fewer batches cost less.
STATS_BATCH = 32


def batch_norms(model: nn.Module) -> list[nn.modules.batchnorm._BatchNorm]:
    """The BatchNorm layers that keep running statistics (SyncBatchNorm included)."""
    return [m for m in model.modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats and m.running_mean is not None]


@torch.no_grad()
def remeasure_(model: nn.Module, loader: Iterable, device: torch.device,
               amp_dtype: torch.dtype | None = None) -> int:
    """Replace the running statistics of `model`'s BatchNorms, in place, by their average over
    `loader`'s batches (each batch one estimate, as the running average takes them, weighted by
    its images). Runs
    `model.capturable` (the whole network, or the part that holds every BatchNorm) with only the
    BatchNorms in training mode; `model` is left in eval mode. Returns the images seen (0: none,
    or no BatchNorm, and nothing changed)."""
    norms = batch_norms(model)
    if not norms:
        return 0
    momenta = [b.momentum for b in norms]
    saved = [(b.running_mean.clone(), b.running_var.clone()) for b in norms]
    model.eval()
    for b in norms:
        b.train()
        if isinstance(b, nn.SyncBatchNorm):
            # Rank 0 measures alone: a SyncBatchNorm in training mode would wait for the other ranks
            # to join its all-reduce. The plain BatchNorm forward normalises with this batch only.
            b.forward = nn.modules.batchnorm._BatchNorm.forward.__get__(b)
    seen, done = 0, False
    cuda = device.type == "cuda"
    autocast = (torch.autocast("cuda", dtype=amp_dtype) if cuda and amp_dtype is not None
                else contextlib.nullcontext())
    try:
        for batch in loader:
            n = int(batch.images.shape[0])
            for b in norms:
                # running <- (1 - m) * running + m * batch with m = n / (seen + n): the mean of the
                # batches so far, each weighted by its images (a short last batch counts for less),
                # with no counter buffer (our families keep none).
                b.momentum = n / (seen + n)
            with autocast:
                model.capturable(to_input(batch.images, device))
            seen += n
        done = True
    finally:
        for b, m in zip(norms, momenta):
            b.momentum = m
            b.__dict__.pop("forward", None)
        model.eval()
        if not done or seen == 0:  # nothing measured, or a batch failed: the statistics as they were
            for b, (mean, var) in zip(norms, saved):
                b.running_mean.copy_(mean)
                b.running_var.copy_(var)
    return seen
