"""Classification metrics: top-1 and top-5 accuracy, per class, and the validation loss.

top-5 counts an image as right when its label is among the 5 highest scores (among all classes
when there are fewer than 5, so it is then 1.0). The loss is the mean cross-entropy of the
predicted probabilities, without label smoothing: comparable across recipes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn

from .loop import predict, to_input, validating

TOPK = 5


def evaluate_classify(model: nn.Module, loader: Iterable, device: torch.device | str, *,
                      amp_dtype: torch.dtype | None = None, names: Sequence[str] | None = None,
                      progress: bool = False) -> dict[str, Any]:
    """Validate `model` (on `device`) over batches of uint8 `images` and `targets.labels`.

    `model.predict(images)` returns per-class probabilities [B, classes]. Returns {"top1",
    "top5", "loss", "num_images", "per_class": [{"class", "images", "top1", "top5"}]}; no images
    at all gives zeros. The model's train/eval mode is restored."""
    device = torch.device(device)
    nc = model.num_classes
    k = min(TOPK, nc)
    # Device-side sums, read back once at the end: per class [images, top-1 hits, top-k hits].
    counts = torch.zeros(3, nc, dtype=torch.float64, device=device)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    with validating(model, loader, progress) as batches:
        for batch in batches:
            labels = batch.targets.labels.to(device, non_blocking=True)
            probs = predict(model, to_input(batch.images, device), amp_dtype).float()
            hits = probs.topk(k, dim=1).indices == labels[:, None]  # [B, k]
            counts[0].index_add_(0, labels, torch.ones_like(labels, dtype=torch.float64))
            counts[1].index_add_(0, labels, hits[:, 0].double())
            counts[2].index_add_(0, labels, hits.any(1).double())
            picked = probs.gather(1, labels[:, None]).squeeze(1)
            loss_sum -= picked.clamp(min=1e-12).log().double().sum()
    images, top1, topk = counts.cpu().tolist()
    n = sum(images)
    names = list(names) if names is not None else [str(i) for i in range(nc)]
    per_class = [{"class": names[c] if c < len(names) else str(c), "images": int(images[c]),
                  "top1": top1[c] / images[c] if images[c] else None,
                  "top5": topk[c] / images[c] if images[c] else None} for c in range(nc)]
    return {"top1": sum(top1) / n if n else 0.0, "top5": sum(topk) / n if n else 0.0,
            "loss": float(loss_sum) / n if n else 0.0, "num_images": int(n), "per_class": per_class}
