"""Each task's two ends of predict: an image into network input, network output into Results.

`prepare_*` are the validation transforms themselves (data/dataset.py `inference_letterbox`,
data/classify.py `center_crop_for_inference`, data/segment.py `resize_for_inference`), so val and
predict see the same pixels. The task modules (tasks/*.py) point at these through `lazy()`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .results import Result


@dataclass(frozen=True)
class PostOptions:
    conf: float = 0.25       # keep detections scoring above this
    iou: float = 0.7         # NMS IoU threshold (class-aware)
    max_det: int = 300       # per image
    multi_label: bool = False  # one candidate per (box, class) above conf, as validation does
    nms: bool = True         # False for end-to-end models (DETRs): the top max_det (query, class) scores


def prepare_detect(image: Tensor, imgsz: int) -> tuple[Tensor, tuple[float, tuple[int, int]]]:
    """RGB uint8 [3, h, w] -> (letterboxed uint8 [3, imgsz, imgsz], (ratio, (left, top)))."""
    from ..data.augment import resize_long_side
    from ..data.dataset import inference_letterbox

    h, w = image.shape[-2:]
    img, _, ratio, pad = inference_letterbox(resize_long_side(image, imgsz), (h, w), imgsz)
    return img, (ratio, pad)


def detect_results(preds: Tensor, metas: Sequence[Any], frames: Sequence[Any], names: list[str],
                   opts: PostOptions) -> list[Result]:
    """Detections per image, boxes in original pixels: NMS, then the letterbox undone."""
    from ..eval.postprocess import postprocess, unletterbox

    dets = postprocess(preds, conf=opts.conf, iou=opts.iou, max_det=opts.max_det, multi_label=opts.multi_label,
                       nms=opts.nms)
    counts = [len(d) for d in dets]
    d = torch.cat(dets).cpu() if dets else torch.zeros(0, 6)  # one device -> host copy per batch
    owner = torch.repeat_interleave(torch.arange(len(dets)), torch.tensor(counts))
    ratios = torch.tensor([m[0] for m in metas], dtype=torch.float32)
    pads = torch.tensor([m[1] for m in metas], dtype=torch.float32).reshape(-1, 2)
    sizes = torch.tensor([tuple(f.image.shape[-2:]) for f in frames], dtype=torch.float32).reshape(-1, 2)
    boxes = unletterbox(d[:, :4], ratios[owner], pads[owner], sizes[owner])
    out, start = [], 0
    for f, n in zip(frames, counts):
        rows = slice(start, start + n)
        out.append(Result(f.name, f.path, f.frame, tuple(f.image.shape[-2:]), names, "detect", boxes=boxes[rows],
                          scores=d[rows, 4].clone(), classes=d[rows, 5].long()))
        start += n
    return out


def prepare_classify(image: Tensor, imgsz: int) -> tuple[Tensor, None]:
    """RGB uint8 [3, h, w] -> (the centre crop uint8 [3, imgsz, imgsz], None)."""
    from ..data.classify import center_crop_for_inference

    return center_crop_for_inference(image, imgsz), None


def classify_results(preds: Tensor, metas: Sequence[Any], frames: Sequence[Any], names: list[str],
                     opts: PostOptions) -> list[Result]:
    """The class probabilities per image."""
    probs = preds.float().cpu()
    return [Result(f.name, f.path, f.frame, tuple(f.image.shape[-2:]), names, "classify", probs=p)
            for f, p in zip(frames, probs)]


def prepare_segment(image: Tensor, imgsz: int) -> tuple[Tensor, None]:
    """RGB uint8 [3, h, w] -> (the image resized to uint8 [3, imgsz, imgsz], None)."""
    from ..data.segment import resize_for_inference

    return resize_for_inference(image, imgsz), None


def segment_results(preds: Tensor, metas: Sequence[Any], frames: Sequence[Any], names: list[str],
                    opts: PostOptions) -> list[Result]:
    """A class map per image at its original size: the probabilities resized (bilinear) to the
    image's (h, w), then the argmax; uint8 for up to 256 classes, else int32."""
    import torch.nn.functional as F

    dtype = torch.uint8 if preds.shape[1] <= 256 else torch.int32
    out = []
    for f, p in zip(frames, preds):
        h, w = f.image.shape[-2:]
        p = F.interpolate(p[None].float(), size=(h, w), mode="bilinear", align_corners=False)[0]
        out.append(Result(f.name, f.path, f.frame, (h, w), names, "segment", mask=p.argmax(0).to(dtype).cpu()))
    return out
