"""Semantic segmentation metrics: a confusion matrix over the valid pixels, then IoU per class, mIoU
and pixel accuracy, as mmsegmentation's IoUMetric computes them.

Rows of the matrix are the true class, columns the predicted one (the argmax of the probabilities);
pixels whose mask holds `ignore_index` are not counted. It is accumulated on the device, one
`torch.bincount` per batch over gt * C + pred (ignored pixels go to an extra bin that is dropped, so
no boolean indexing), and read back once at the end. From it, per class c: IoU = TP / (TP + FP +
FN) and accuracy = TP / (TP + FN); a class absent from both the ground truth and the predictions
has IoU NaN and is left out of the mean (mIoU = nanmean, as mmsegmentation). Pixel accuracy =
sum TP / valid pixels. The loss is the mean cross-entropy per valid pixel of the predicted
probabilities (comparable across recipes).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn

from ..families.segment import IGNORE_INDEX
from .loop import predict, to_input, validating


def confusion(pred: torch.Tensor, gt: torch.Tensor, nc: int, ignore_index: int) -> torch.Tensor:
    """[nc, nc] int64 counts of (true class, predicted class) over the pixels of gt != ignore_index."""
    valid = gt != ignore_index
    index = torch.where(valid, gt * nc + pred, nc * nc)
    return torch.bincount(index.flatten(), minlength=nc * nc + 1)[: nc * nc].view(nc, nc)


def scores(matrix: torch.Tensor) -> dict[str, Any]:
    """mIoU, pixel accuracy and per-class IoU / accuracy / pixels from a confusion matrix."""
    m = matrix.double().cpu()
    tp, gt, pred = m.diag(), m.sum(1), m.sum(0)
    union = gt + pred - tp
    iou = torch.where(union > 0, tp / union.clamp(min=1), torch.nan)
    acc = torch.where(gt > 0, tp / gt.clamp(min=1), torch.nan)
    total = float(m.sum())
    present = ~iou.isnan()
    return {"miou": float(iou[present].mean()) if present.any() else 0.0,
            "pixel_acc": float(tp.sum()) / total if total else 0.0,
            "iou": iou.tolist(), "acc": acc.tolist(), "pixels": gt.long().tolist()}


def evaluate_segment(model: nn.Module, loader: Iterable, device: torch.device | str, *,
                     ignore_index: int = IGNORE_INDEX, amp_dtype: torch.dtype | None = None,
                     names: Sequence[str] | None = None, progress: bool = False) -> dict[str, Any]:
    """Validate `model` (on `device`) over batches of uint8 `images` and `targets.masks`.

    `model.predict(images)` returns per-pixel probabilities [B, C, S, S]. Returns {"miou",
    "pixel_acc", "loss", "num_images", "per_class": [{"class", "pixels", "iou", "acc"}]} (None
    where a class is absent). The model's train/eval mode is restored."""
    device = torch.device(device)
    nc = model.num_classes
    matrix = torch.zeros(nc, nc, dtype=torch.int64, device=device)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    images_seen = 0
    with validating(model, loader, progress) as batches:
        for batch in batches:
            gt = batch.targets.to(device, non_blocking=True).masks
            probs = predict(model, to_input(batch.images, device), amp_dtype).float()
            matrix += confusion(probs.argmax(1), gt, nc, ignore_index)
            valid = gt != ignore_index
            picked = probs.gather(1, torch.where(valid, gt, 0)[:, None]).squeeze(1)
            loss_sum -= torch.where(valid, picked.clamp(min=1e-12).log(), 0.0).double().sum()
            images_seen += gt.shape[0]
    out = scores(matrix)
    valid_pixels = sum(out["pixels"])
    names = list(names) if names is not None else [str(i) for i in range(nc)]
    per_class = [{"class": names[c] if c < len(names) else str(c), "pixels": out["pixels"][c],
                  "iou": None if out["iou"][c] != out["iou"][c] else out["iou"][c],
                  "acc": None if out["acc"][c] != out["acc"][c] else out["acc"][c]} for c in range(nc)]
    return {"miou": out["miou"], "pixel_acc": out["pixel_acc"],
            "loss": float(loss_sum) / valid_pixels if valid_pixels else 0.0,
            "num_images": images_seen, "per_class": per_class}
