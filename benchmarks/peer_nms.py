"""Single-label (ours) vs multi-label (the peer's validator) NMS, on one model's predictions.

    PYTHONPATH=src python benchmarks/peer_nms.py WEIGHTS.pt [--data shapes] [--imgsz 160] [--device cpu]

Our `eval.postprocess` keeps one detection per anchor (its best class); Ultralytics' validator
(`multi_label=True`) keeps every class whose score passes `conf`, then class-aware NMS, conf
0.001, iou 0.7, max_det 300 in both. Everything else (model, loader, faster-coco-eval) is ours,
so the printed difference is the NMS variant alone. No Ultralytics needed.
"""

from __future__ import annotations

import argparse
import json

import torch
from torchvision.ops import batched_nms

from libreyolo.eval import coco
from libreyolo.eval.postprocess import MAX_CANDIDATES


def postprocess_multilabel(preds: torch.Tensor, conf: float = 0.001, iou: float = 0.7,
                           max_det: int = 300) -> list[torch.Tensor]:
    """Like `postprocess`, but one candidate per (anchor, class) with score > conf."""
    preds = preds.float()
    out = []
    for p in preds:
        boxes, scores = p[:, :4], p[:, 4:]
        a, c = (scores > conf).nonzero(as_tuple=True)
        s = scores[a, c]
        if s.numel() > MAX_CANDIDATES:
            top = s.topk(MAX_CANDIDATES).indices
            a, c, s = a[top], c[top], s[top]
        b = boxes[a]
        kept = batched_nms(b, s, c, iou)[:max_det]
        out.append(torch.cat([b[kept], s[kept, None], c[kept, None].float()], 1))
    return out


def main() -> None:
    from libreyolo import LibreYOLO

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("weights")
    ap.add_argument("--data", default="shapes")
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args()
    kw = dict(data=args.data, imgsz=args.imgsz, device=args.device, batch=args.batch, workers=0)
    res = {"single_label": LibreYOLO(args.weights).val(**kw)}
    original = coco.postprocess
    coco.postprocess = postprocess_multilabel
    try:
        res["multi_label"] = LibreYOLO(args.weights).val(**kw)
    finally:
        coco.postprocess = original
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
