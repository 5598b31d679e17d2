"""From raw predictions to detections, and from network pixels back to image pixels.

Validation and predict: these functions sync with the host (`nonzero`, NMS) and are never called
from the training step.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchvision.ops import batched_nms

# An untrained network scores almost every anchor above conf=0.001; NMS cost grows with the square
# of the candidate count, so keep only the best this many per image before NMS.
MAX_CANDIDATES = 30_000


def postprocess(
    preds: Tensor, conf: float = 0.001, iou: float = 0.7, max_det: int = 300, multi_label: bool = False,
    nms: bool = True,
) -> list[Tensor]:
    """Turn `model.predict` output into per-image detections.

    preds: `[B, N, 4 + nc]`, boxes xyxy in input pixels then per-class scores in [0, 1].
    Returns B tensors `[n, 6]` (x1, y1, x2, y2, score, class), float32, sorted by score, n <= max_det.

    By default each box keeps only its best class (one detection per anchor). `multi_label=True`
    makes one candidate of every (box, class) scoring above `conf`, as validation does: at the low
    `conf` of validation a box's second class is often a real object the metric would otherwise
    miss (+0.006 mAP50-95 measured on a weak model, `benchmarks/peer_nms.py`), and the peer
    trainer validates that way. Class-aware NMS: boxes of different classes never suppress each other.
    `nms=False` is for end-to-end models (`model.end_to_end`, the DETR families): see `top_k`.
    """
    if preds.ndim != 3 or preds.shape[-1] < 5:
        raise ValueError(f"preds must be [B, N, 4 + num_classes], got {tuple(preds.shape)}")
    # Autocast may hand us fp16/bf16; NMS kernels and IoU thresholds want float32.
    preds = preds.float()
    if not nms:
        return top_k(preds, conf, max_det)
    boxes, class_scores = preds[..., :4], preds[..., 4:]
    if not multi_label:
        best, best_class = class_scores.max(dim=-1)     # [B, N] each, for the whole batch at once
        passed = best > conf
    out = []
    for i in range(preds.shape[0]):
        if multi_label:
            anchor, c = (class_scores[i] > conf).nonzero(as_tuple=True)
            s = class_scores[i, anchor, c]
        else:
            anchor = passed[i].nonzero().squeeze(1)
            s, c = best[i, anchor], best_class[i, anchor]
        if s.numel() > MAX_CANDIDATES:
            top = s.topk(MAX_CANDIDATES).indices
            anchor, s, c = anchor[top], s[top], c[top]
        b = boxes[i, anchor]
        kept = batched_nms(b, s, c, iou)[:max_det]     # sorted by decreasing score
        out.append(torch.cat([b[kept], s[kept, None], c[kept, None].float()], dim=1))
    return out


def top_k(preds: Tensor, conf: float, max_det: int) -> list[Tensor]:
    """Detections of an end-to-end model: the `max_det` best (query, class) scores of each image.

    A DETR's one-to-one matching trains one query per object, so there is nothing to suppress:
    the detections are the top-k over every query's every class score (a query may hold two
    classes), as the RT-DETR and D-FINE post-processors do (top 300 over the flattened sigmoid
    scores), then the `conf` threshold. Same output form as `postprocess`.
    """
    boxes, scores = preds[..., :4], preds[..., 4:]
    b, q, c = scores.shape
    best, index = scores.flatten(1).topk(min(max_det, q * c), dim=1)   # [B, k], sorted per image
    query, cls = index // c, index % c
    picked = boxes.gather(1, query.unsqueeze(-1).expand(-1, -1, 4))
    rows = torch.cat([picked, best.unsqueeze(-1), cls.unsqueeze(-1).to(picked.dtype)], -1)
    return [r[s > conf] for r, s in zip(rows, best)]


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
