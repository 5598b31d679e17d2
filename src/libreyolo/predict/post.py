"""Each task's two ends of predict: an image into network input, network output into Results.

`prepare_*` are the validation transforms themselves (data/dataset.py `inference_letterbox`,
data/classify.py `center_crop_for_inference`, data/segment.py `resize_for_inference`), so val and
predict see the same pixels. The task modules (tasks/*.py) point at these through `lazy()`; point
detection prepares as detection does (the letterbox).
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


def points_results(preds: Tensor, metas: Sequence[Any], frames: Sequence[Any], names: list[str],
                   opts: PostOptions) -> list[Result]:
    """Points per image in original pixels: the probability map's cells above conf, neighbouring
    cells of a class merged (eval/points.decode_points, as validation), the best max_det per image,
    then the letterbox undone."""
    from ..eval.points import decode_points

    pts = decode_points(preds, opts.conf)
    counts = torch.bincount(pts.image, minlength=len(frames)).cpu()
    cls, xy, score = (t.cpu() for t in pts[1:])  # one device -> host copy per batch
    out, start = [], 0
    for f, n, (ratio, (left, top)) in zip(frames, counts.tolist(), metas):
        rows = slice(start, start + min(n, opts.max_det))  # best first within the image
        h, w = f.image.shape[-2:]
        point = (xy[rows] - torch.tensor([left, top], dtype=torch.float32)) / ratio
        point = torch.minimum(point.clamp(min=0), torch.tensor([w, h], dtype=torch.float32))
        out.append(Result(f.name, f.path, f.frame, (h, w), names, "points", points=point, scores=score[rows].clone(),
                          classes=cls[rows].clone()))
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


# At most this many float32 values of the resized probabilities exist at once (256 MiB): a
# 150-class map of a 12-megapixel photo would otherwise take 7 GB.
UPSAMPLE_ELEMENTS = 1 << 26


def segment_results(preds: Tensor, metas: Sequence[Any], frames: Sequence[Any], names: list[str],
                    opts: PostOptions) -> list[Result]:
    """A class map per image at its original size: the probabilities resized (bilinear) to the
    image's (h, w), then the argmax; uint8 for up to 256 classes, else int32."""
    dtype = torch.uint8 if preds.shape[1] <= 256 else torch.int32
    out = []
    for f, p in zip(frames, preds):
        h, w = f.image.shape[-2:]
        mask = upsampled_argmax(p, h, w)
        out.append(Result(f.name, f.path, f.frame, (h, w), names, "segment", mask=mask.to(dtype).cpu()))
    return out


def upsampled_argmax(probs: Tensor, h: int, w: int) -> Tensor:
    """argmax over classes of `probs` [C, h0, w0] resized bilinearly to (h, w), a few classes at a
    time (UPSAMPLE_ELEMENTS). Resizing treats each class on its own, and a later group takes a
    pixel only with a strictly larger value, so the map equals the one-shot argmax (first maximum)."""
    import torch.nn.functional as F

    group = max(1, UPSAMPLE_ELEMENTS // max(h * w, 1))
    best = index = None
    for c0 in range(0, probs.shape[0], group):
        part = F.interpolate(probs[None, c0:c0 + group].float(), size=(h, w), mode="bilinear", align_corners=False)[0]
        value, arg = part.max(0)
        if best is None:
            best, index = value, arg
        else:
            better = value > best
            best, index = torch.where(better, value, best), torch.where(better, arg + c0, index)
    return index
