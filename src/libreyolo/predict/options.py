"""What predict takes: its keys, their defaults and meanings, and the check of their values.

No torch here: `libreyolo predict --help` and a mistyped key answer before torch is imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError


@dataclass(frozen=True)
class Key:
    type: type
    default: Any
    doc: str


# What predict takes (CLI key=value and Python keywords). Keys that are also training keys keep
# their meaning; conf, batch and workers have predict's own defaults.
KEYS: dict[str, Key] = {
    "source": Key(str, None, "image file, folder, glob ('imgs/*.jpg') or video file"),
    "conf": Key(float, 0.25, "keep detections scoring above this"),
    "iou": Key(float, 0.7, "NMS IoU threshold (class-aware; the DETRs have no NMS: top max_det scores)"),
    "imgsz": Key(int, None, "network input size (default: the checkpoint's training size)"),
    "max_det": Key(int, 300, "maximum detections per image"),
    "batch": Key(int, 1, "images per forward (larger: more images/s, more latency)"),
    "device": Key(str, "", "cpu, cuda, cuda:N or N (default: cuda when available)"),
    "amp": Key(bool, True, "half-precision weights on CUDA (ignored on CPU)"),
    "amp_dtype": Key(str, "float16", "their dtype: float16 or bfloat16"),
    "cuda_graph": Key(bool, False, "replay the forward from a CUDA graph (CUDA only)"),
    "save": Key(bool, True, "write annotated images/videos to project/name (Python default: false)"),
    "project": Key(str, "runs/predict", "where predict runs go"),
    "name": Key(str, "exp", "run folder name (exp, exp2, ... when taken)"),
    "exist_ok": Key(bool, False, "write into an existing project/name"),
    "vid_stride": Key(int, 1, "predict every n-th video frame"),
    "workers": Key(int, 4, "threads decoding and preparing images ahead of the device"),
}
PYTHON_ONLY = {"multi_label": False, "progress": False}  # multi_label: one box per class, as val does


def check_options(options: dict[str, Any]) -> dict[str, Any]:
    """The options with defaults filled in, validated: one ConfigError line per mistake."""
    from ..config import FIELDS, check_value

    out = {k: v.default for k, v in KEYS.items()} | dict(PYTHON_ONLY)
    for key, value in options.items():
        if key not in out:
            from ..config import unknown_key_message

            raise ConfigError(unknown_key_message(key, set(out)))
        if key in FIELDS and key not in ("batch", "workers") and value is not None:
            value = check_value(key, value)  # the training key's type and range
        out[key] = value
    for key in ("batch", "workers", "vid_stride", "max_det"):
        if not isinstance(out[key], int) or isinstance(out[key], bool) or out[key] < 1:
            raise ConfigError(f"bad value for '{key}': {out[key]!r} (allowed: an int >= 1)")
    for key in ("conf", "iou"):
        if isinstance(out[key], bool) or not isinstance(out[key], (int, float)) or not 0 <= out[key] <= 1:
            raise ConfigError(f"bad value for '{key}': {out[key]!r} (allowed: a float in [0, 1])")
    for key in ("save", "exist_ok", "amp", "cuda_graph", "multi_label", "progress"):
        if not isinstance(out[key], bool):
            raise ConfigError(f"bad value for '{key}': {out[key]!r} (allowed: true or false)")
    if out["imgsz"] is not None and (not isinstance(out["imgsz"], int) or out["imgsz"] < 32 or out["imgsz"] % 32):
        raise ConfigError(f"bad value for 'imgsz': {out['imgsz']!r} (allowed: a multiple of 32)")
    return out
