"""From raw predictions to detections, and from network pixels back to image pixels.

Validation only: these functions sync with the host (`nonzero`, NMS) and are never called from the
training step.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchvision.ops import batched_nms

# An untrained network scores almost every anchor above conf=0.001; NMS cost grows with the square
# of the candidate count, so keep only the best this many per image before NMS.
MAX_CANDIDATES = 30_000


def postprocess(
    preds: Tensor, conf: float = 0.001, iou: float = 0.7, max_det: int = 300
) -> list[Tensor]:
    """Turn `model.predict` output into per-image detections.

    preds: `[B, N, 4 + nc]`, boxes xyxy in input pixels then per-class scores in [0, 1].
    Returns B tensors `[n, 6]` (x1, y1, x2, y2, score, class), float32, sorted by score, n <= max_det.

    Each box keeps only its best class (one detection per anchor, not one per class above `conf`):
    it makes NMS cheaper and changes mAP only marginally at the low `conf` used for validation.
    Class-aware NMS: boxes of different classes never suppress each other.
    """
    if preds.ndim != 3 or preds.shape[-1] < 5:
        raise ValueError(f"preds must be [B, N, 4 + num_classes], got {tuple(preds.shape)}")
    # Autocast may hand us fp16/bf16; NMS kernels and IoU thresholds want float32.
    preds = preds.float()
    boxes = preds[..., :4]
    scores, classes = preds[..., 4:].max(dim=-1)        # [B, N] each, for the whole batch at once
    passed = scores > conf
    out = []
    for i in range(preds.shape[0]):
        keep = passed[i].nonzero().squeeze(1)
        if keep.numel() > MAX_CANDIDATES:
            keep = keep[scores[i, keep].topk(MAX_CANDIDATES).indices]
        b, s, c = boxes[i, keep], scores[i, keep], classes[i, keep]
        kept = batched_nms(b, s, c, iou)[:max_det]     # sorted by decreasing score
        out.append(torch.cat([b[kept], s[kept, None], c[kept, None].float()], dim=1))
    return out


def unletterbox(boxes: Tensor, ratios: Tensor, pads: Tensor, orig_sizes: Tensor) -> Tensor:
    """Map xyxy boxes from letterboxed network pixels back to original image pixels.

    boxes `[K, 4]`; per-box `ratios [K]` (resize factor), `pads [K, 2]` (left, top) and
    `orig_sizes [K, 2]` (h, w). Undoes `x_net = x * ratio + pad` and clips to the image.
    """
    ratios = ratios.to(boxes.dtype)[:, None]
    pads = pads.to(boxes.dtype)
    sizes = orig_sizes.to(boxes.dtype)
    offset = pads.repeat(1, 2)                           # (left, top, left, top)
    out = (boxes - offset) / ratios
    upper = sizes.flip(1).repeat(1, 2)                   # (w, h, w, h)
    return torch.minimum(out.clamp(min=0), upper)
