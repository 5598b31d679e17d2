"""What `predict` returns: one `Result` per image (or video frame), in original image pixels.

A Result knows where its image came from (`name`, `path`, `frame`), the image's size and the
model's class names, and holds the task's own output: boxes, scores and class ids for detection;
the class probabilities for classification; points, scores and class ids for point detection; a
class map (the class id of every pixel) for semantic segmentation. `to_dict()` is the JSON line
`predict --json` prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from ..logs import counted

TOP_K = 5  # the classes a classification result lists (to_dict), best first


@dataclass
class Result:
    name: str                       # 'img.jpg', 'clip.mp4', 'image0' (in memory): what the user calls the image
    path: str | None                # the file it was read from; None for an in-memory image
    frame: int | None               # the frame number in a video, None for a still image
    orig_shape: tuple[int, int]     # (height, width) of the image as read
    names: list[str]                # the model's class names, index = class id
    task: str                       # "detect" | "classify" | "points" | "segment"
    boxes: Tensor | None = None     # float32 [n, 4] xyxy, original pixels (detect)
    scores: Tensor | None = None    # float32 [n], sorted decreasing (detect, points)
    classes: Tensor | None = None   # int64 [n] (detect, points)
    probs: Tensor | None = None     # float32 [num_classes] (classify)
    points: Tensor | None = None    # float32 [n, 2] (x, y), original pixels (points)
    mask: Tensor | None = None      # [h, w] class id per original pixel, uint8 (int32 above 256 classes) (segment)
    extra: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        """Detections or points; 1 for a classification or segmentation result."""
        if self.points is not None:
            return len(self.points)
        if self.boxes is not None:
            return len(self.boxes)
        return 0 if self.probs is None and self.mask is None else 1

    def class_pixels(self) -> list[tuple[int, int]]:
        """(class id, pixels) of each class in a segmentation result's map, most pixels first."""
        counts = torch.bincount(self.mask.flatten().long().cpu(), minlength=len(self.names)).tolist()
        return sorted(((c, n) for c, n in enumerate(counts) if n), key=lambda cn: (-cn[1], cn[0]))

    @property
    def top1(self) -> int | None:
        """The most probable class id of a classification result (None for detection)."""
        return None if self.probs is None else int(self.probs.argmax())

    def label(self, c: int) -> str:
        return self.names[c] if 0 <= c < len(self.names) else str(c)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: source, frame, width, height, then `detections` [{box, score, class, name}]
        (box xyxy in original pixels, rounded to 0.01 px), `points` [{point, score, class, name}]
        (point x, y likewise), `top` [{class, name, prob}] (best first) with the top-1 `class`, `name`
        and `prob`, or `classes` [{class, name, pixels, fraction}] (the classes of a segmentation map,
        most pixels first; the map itself is `mask`, or the PNG saved)."""
        h, w = self.orig_shape
        out: dict[str, Any] = {"source": self.name, "frame": self.frame, "width": w, "height": h, "task": self.task}
        if self.mask is not None:
            out["classes"] = [{"class": c, "name": self.label(c), "pixels": n, "fraction": round(n / (h * w), 6)}
                              for c, n in self.class_pixels()]
            return out
        if self.probs is not None:
            p = self.probs.float().cpu()
            values, ids = p.topk(min(TOP_K, len(p)))
            top = [{"class": int(c), "name": self.label(int(c)), "prob": round(float(v), 6)}
                   for v, c in zip(values, ids)]
            out.update(top[0] if top else {"class": None, "name": None, "prob": None})
            out["top"] = top
            return out
        scores = self.scores.cpu().tolist() if self.scores is not None else []
        classes = self.classes.cpu().tolist() if self.classes is not None else []
        field, where = ("points", self.points) if self.points is not None else ("detections", self.boxes)
        coords = where.cpu().tolist() if where is not None else []
        key = "point" if field == "points" else "box"
        out[field] = [{key: [round(v, 2) for v in b], "score": round(s, 5), "class": int(c),
                       "name": self.label(int(c))} for b, s, c in zip(coords, scores, classes)]
        return out

    def summary(self) -> str:
        """'3 detections (2 circle, 1 square)' / '3 points (...)' / 'circle 0.97' / 'background 81%,
        circle 12%, ...': one human line."""
        if self.mask is not None:
            h, w = self.orig_shape
            parts = [f"{self.label(c)} {100 * n / (h * w):.0f}%" for c, n in self.class_pixels()]
            return ", ".join(parts[:TOP_K]) + (f" and {len(parts) - TOP_K} more" if len(parts) > TOP_K else "")
        if self.probs is not None:
            c = self.top1
            return f"{self.label(c)} {float(self.probs[c]):.2f}"
        n = len(self)
        what = "point" if self.points is not None else "detection"
        if n == 0:
            return f"no {what}s"
        counts = torch.bincount(self.classes.cpu(), minlength=len(self.names)).tolist()
        parts = ", ".join(f"{k} {self.label(c)}" for c, k in enumerate(counts) if k)
        return f"{counted(n, what)} ({parts})"
