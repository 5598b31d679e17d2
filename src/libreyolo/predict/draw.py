"""Predictions drawn onto their images, and the images and videos `predict` saves.

`annotate` draws a Result on a copy of its image: detection boxes with "name score" labels through
torchvision.utils.draw_bounding_boxes (one colour per class id from a fixed palette, so a class
keeps its colour across images and runs), a point detector's points as dots of the class colour
with the same labels beside them, a classification's top classes as "name prob" lines in the
top-left corner (the last two through PIL.ImageDraw), or a segmentation's class map as a
half-transparent colour per class (torchvision.utils.draw_segmentation_masks, the same palette).
Both fonts are Pillow's default, which is embedded
in Pillow itself: nothing is downloaded, drawing works offline.

`Saver` writes what `annotate` returns under the run directory, which `predict_dir` names like
training's (runs/predict/exp, exp2, ...) and which Saver creates with its first file: a run that
fails on its inputs, or saves nothing, leaves no folder. Every file is written under a temp name
and renamed when complete, so an interrupted run never leaves a half-written file under a final
name (a still image at once, a video when its last frame is in). A segmentation result's class map
is also saved as `<stem>_mask.png` (`save_mask`): a palette PNG whose pixel values are the class
ids (a 16-bit grey PNG above 256 classes), the mask format training reads.
"""

from __future__ import annotations

import contextlib
import os
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch
from PIL import ImageDraw, ImageFont
from torchvision.io import encode_jpeg, encode_png
from torchvision.transforms.v2 import functional as TF
from torchvision.utils import draw_bounding_boxes, draw_segmentation_masks

from ..atomic import atomic_path
from ..engine.rundir import run_dir_candidates
from ..errors import ConfigError
from .results import TOP_K, Result
from .sources import DEFAULT_FPS, Frame, import_av

# Okabe and Ito's colour-blind-safe colours (less black), then six more; light enough for the
# black label text on them. Class c is PALETTE[c % len(PALETTE)].
PALETTE = ((230, 159, 0), (86, 180, 233), (0, 158, 115), (240, 228, 66), (213, 94, 0), (204, 121, 167),
           (0, 170, 230), (148, 210, 90), (255, 127, 127), (170, 150, 255), (0, 200, 200), (255, 110, 190))
JPEG_QUALITY = 95
MASK_ALPHA = 0.5  # the class colours over a segmented image
VIDEO_CODECS = ("libx264", "mpeg4")  # preferred first; mpeg4 is FFmpeg's own encoder, in every build


def default_line_width(height: int, width: int) -> int:
    """Box outline in pixels: 2 for a 640 px image, growing with the image's mean side."""
    return max(1, round((height + width) / 2 * 0.003))


def annotate(image: torch.Tensor, result: Result, *, line_width: int | None = None) -> torch.Tensor:
    """`image` (RGB uint8 [3, h, w]) with `result` drawn on it, as a new tensor of the same shape;
    `image` itself is not modified. `line_width`: the box outline (default: scaled to the image)."""
    img = image.detach().cpu()
    if result.probs is not None:
        return _draw_top_classes(img, result)
    if result.mask is not None:
        return _draw_class_map(img, result)
    if not len(result):
        return img.clone()
    if result.points is not None:
        return _draw_points(img, result)
    h, w = img.shape[-2:]
    lw = default_line_width(h, w) if line_width is None else line_width
    boxes = result.boxes.detach().float().cpu().clone()
    boxes[:, 0::2] = boxes[:, 0::2].clamp(0, w - 1)  # draw_bounding_boxes wants boxes inside the image
    boxes[:, 1::2] = boxes[:, 1::2].clamp(0, h - 1)
    order = torch.arange(len(boxes) - 1, -1, -1)  # scores are sorted decreasing: the best is drawn last, on top
    classes = result.classes.cpu()[order].tolist()
    scores = result.scores.cpu()[order].tolist()
    labels = [f"{result.label(c)} {s:.2f}" for c, s in zip(classes, scores)]
    colors = [PALETTE[c % len(PALETTE)] for c in classes]
    return draw_bounding_boxes(img, boxes[order], labels=labels, colors=colors, width=lw, fill_labels=True)


def _draw_points(img: torch.Tensor, result: Result) -> torch.Tensor:
    """A dot of the class colour (black rim) per point, "name score" on the class colour beside it;
    the best point drawn last, on top."""
    h, w = img.shape[-2:]
    radius = max(2, round((h + w) / 2 * 0.008))  # 5 px for a 640 px image
    font = _font(max(10, round(min(h, w) / 40)))
    pil = TF.to_pil_image(img)  # a copy: the tensor is not drawn on
    draw = ImageDraw.Draw(pil)
    rows = zip(result.points.detach().float().cpu().tolist(), result.classes.cpu().tolist(),
               result.scores.cpu().tolist())
    for (x, y), c, s in reversed(list(rows)):
        color = PALETTE[c % len(PALETTE)]
        draw.ellipse((x - radius, y - radius, x + radius, y + radius), fill=color, outline=(0, 0, 0),
                     width=max(1, radius // 3))
        at, text = (x + radius + 2, y - radius), f"{result.label(c)} {s:.2f}"
        left, top, right, bottom = draw.textbbox(at, text, font=font)
        draw.rectangle((left - 1, top - 1, right + 1, bottom + 1), fill=color)
        draw.text(at, text, fill=(0, 0, 0), font=font)
    return TF.pil_to_tensor(pil)


def _draw_class_map(img: torch.Tensor, result: Result) -> torch.Tensor:
    """Each class present in the map in its palette colour at MASK_ALPHA over the image."""
    classes = [c for c, _ in result.class_pixels()]
    mask = result.mask.cpu()
    masks = mask[None] == torch.tensor(classes, dtype=mask.dtype)[:, None, None]
    return draw_segmentation_masks(img, masks, alpha=MASK_ALPHA, colors=[PALETTE[c % len(PALETTE)] for c in classes])


def mask_png(mask: torch.Tensor) -> bytes:
    """A class map as PNG bytes: palette mode (pixel = class id, the palette's colours for a viewer)
    up to 256 classes, else 16-bit grey."""
    import io

    from PIL import Image

    m = mask.cpu().numpy()
    if m.dtype == np.uint8:
        img = Image.frombytes("P", (m.shape[1], m.shape[0]), np.ascontiguousarray(m).tobytes())
        img.putpalette([v for i in range(256) for v in PALETTE[i % len(PALETTE)]])
    else:
        img = Image.fromarray(m.astype(np.uint16))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _draw_top_classes(img: torch.Tensor, result: Result) -> torch.Tensor:
    """The TOP_K most probable classes, best first, white on black in the top-left corner."""
    h, w = img.shape[-2:]
    probs = result.probs.detach().float().cpu()
    values, ids = probs.topk(min(TOP_K, len(probs)))
    size = max(10, round(min(h, w) / 24))  # font px: 10 at 240 px, 27 at 640 px
    font = _font(size)
    pil = TF.to_pil_image(img)  # a copy: the tensor is not drawn on
    draw = ImageDraw.Draw(pil)
    pad = max(1, size // 5)
    y = pad
    for v, c in zip(values.tolist(), ids.tolist()):
        text = f"{result.label(c)} {v:.2f}"
        left, top, right, bottom = draw.textbbox((pad, y), text, font=font)
        draw.rectangle((left - pad, top - pad, right + pad, bottom + pad), fill=(0, 0, 0))
        draw.text((pad, y), text, fill=(255, 255, 255), font=font)
        y = bottom + 2 * pad
    return TF.pil_to_tensor(pil)


def _font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    """Pillow's embedded Aileron at `size` px; its fixed bitmap font where Pillow is older than 10.1
    or built without FreeType."""
    try:
        return ImageFont.load_default(size)
    except (TypeError, ImportError, OSError):
        return ImageFont.load_default()


def predict_dir(project: str | Path = "runs/predict", name: str = "exp", exist_ok: bool = False) -> Path:
    """Where a predict run saves: project/name with exist_ok, else the first of project/name,
    name2, name3, ... that does not exist (training's numbering). Not created here: Saver creates
    it with its first file."""
    if exist_ok:
        return Path(project) / name
    return next(path for path in run_dir_candidates(project, name) if not path.exists())


class Saver:
    """Saves annotated frames under `save_dir` (created with the first file).

    A still image read from a file becomes `<stem>.jpg` (`<stem>.png` for a png); an in-memory one
    `image<index>.jpg`; the frames of a video one `<stem>.mp4` at the video's yielded frame rate.
    Two inputs with the same output name (a list naming a/x.jpg and b/x.jpg) give x.jpg and
    x_2.jpg: nothing of this run is overwritten. Use it as a context manager, or call `close()`:
    a video's file appears when the video ends (its last frame, the next input, or close); leaving
    the `with` block on an exception deletes the unfinished video instead (and the folder, if this
    run made it and it is still empty)."""

    def __init__(self, save_dir: Path):
        self.save_dir = Path(save_dir)
        self._taken: set[str] = set()  # lower-case: a.JPG and a.jpg are one file on macOS and Windows
        self._video: _VideoWriter | None = None
        self._made_dir = not self.save_dir.exists()  # removed again if the run fails before a file lands

    def save(self, frame: Frame, annotated: torch.Tensor) -> Path:
        """Write `annotated` (RGB uint8 [3, h, w]) for `frame`; the path it is (for a video frame:
        will be, once the video is finished) saved under. A folder that cannot be written is one
        ConfigError line."""
        try:
            return self._save(frame, annotated)
        except OSError as exc:
            raise ConfigError(f"cannot write annotated files to {self.save_dir}: {exc.strerror or exc} "
                              f"(choose another project= or name=, or save=false)") from None

    def _save(self, frame: Frame, annotated: torch.Tensor) -> Path:
        img = annotated.detach().cpu().contiguous()
        stem = Path(frame.name).stem
        if frame.frame is not None:
            video = self._video
            if video is None or video.source != frame.path or frame.frame <= video.last:  # a new video
                self._finish_video()
                video = self._video = _VideoWriter(self._claim(f"{stem}.mp4"), frame.path,
                                                   frame.fps or DEFAULT_FPS, *img.shape[-2:])
            video.write(img, frame.frame)
            return video.path
        self._finish_video()
        png = frame.path is not None and Path(frame.path).suffix.lower() == ".png"
        path = self._claim(f"{stem}.png" if png else f"{stem}.jpg")
        data = encode_png(img) if png else encode_jpeg(img, quality=JPEG_QUALITY)
        with atomic_path(path) as tmp:
            tmp.write_bytes(data.numpy().tobytes())
        return path

    def save_mask(self, frame: Frame, mask: torch.Tensor) -> Path:
        """Write a segmentation class map as `<stem>_mask.png` (a video frame's as
        `<stem>_<frame>_mask.png`); the path. Errors as `save`."""
        stem = Path(frame.name).stem + ("" if frame.frame is None else f"_{frame.frame:06d}")
        path = self._claim(f"{stem}_mask.png")
        try:
            with atomic_path(path) as tmp:
                tmp.write_bytes(mask_png(mask))
        except OSError as exc:
            raise ConfigError(f"cannot write class maps to {self.save_dir}: {exc.strerror or exc} "
                              f"(choose another project= or name=, or save=false)") from None
        return path

    def close(self) -> None:
        """Finish the video being written, if any."""
        self._finish_video()

    def __enter__(self) -> Saver:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        # A generator closed early (a `break` out of predict(stream=True)) is not a failure: the
        # video so far is kept.
        if exc is None or isinstance(exc, GeneratorExit):
            self.close()
            return
        if self._video is not None:
            self._video.abort(exc)
            self._video = None
        if self._made_dir and self.save_dir.is_dir() and not any(self.save_dir.iterdir()):
            self.save_dir.rmdir()

    def _finish_video(self) -> None:
        if self._video is not None:
            video, self._video = self._video, None
            video.finish()

    def _claim(self, name: str) -> Path:
        """`name` in save_dir, or name_2, name_3, ... if this run already used it."""
        stem, suffix = os.path.splitext(name)
        candidate, k = name, 1
        while candidate.lower() in self._taken:
            k += 1
            candidate = f"{stem}_{k}{suffix}"
        self._taken.add(candidate.lower())
        return self.save_dir / candidate


class _VideoWriter:
    """One mp4 in the making: encoded into a temp file beside `path` (atomic_path), renamed to
    `path` by finish(), deleted by abort()."""

    def __init__(self, path: Path, source: str | None, fps: float, height: int, width: int):
        self.av = import_av()
        self.path, self.source, self.last = path, source, -1
        self._target = atomic_path(path)
        self._out = None
        tmp = self._target.__enter__()
        try:
            self._out = self.av.open(str(tmp), mode="w", format="mp4")  # the temp name has no .mp4
            codec = _video_codec(self.av)
            self._stream = self._out.add_stream(codec, rate=Fraction(fps).limit_denominator(1001))
            # yuv420p stores colour per 2x2 pixels, so both sides must be even: write() pads an odd
            # side with a copy of the last row or column.
            self._stream.width, self._stream.height = width + width % 2, height + height % 2
            self._stream.pix_fmt = "yuv420p"
            if codec == "mpeg4":  # its default 200 kb/s smears the boxes and labels
                self._stream.bit_rate = max(1_000_000, int(0.15 * width * height * fps))
        except BaseException as exc:
            self.abort(exc)
            raise

    def write(self, image: torch.Tensor, frame: int) -> None:
        if image.shape[1] % 2:
            image = torch.cat([image, image[:, -1:]], 1)
        if image.shape[2] % 2:
            image = torch.cat([image, image[:, :, -1:]], 2)
        hwc = np.ascontiguousarray(image.permute(1, 2, 0).numpy())
        self._out.mux(self._stream.encode(self.av.VideoFrame.from_ndarray(hwc, format="rgb24")))
        self.last = frame

    def finish(self) -> None:
        try:
            self._out.mux(self._stream.encode(None))  # flush the encoder's delayed frames
            self._out.close()
        except BaseException as exc:
            self.abort(exc)
            raise
        self._target.__exit__(None, None, None)  # rename to the final name

    def abort(self, exc: BaseException) -> None:
        if self._out is not None:
            with contextlib.suppress(Exception):  # the temp file is deleted whatever state it is in
                self._out.close()
        self._target.__exit__(type(exc), exc, exc.__traceback__)  # deletes the temp file


def _video_codec(av) -> str:
    """The first of VIDEO_CODECS this PyAV build can encode, the last one in any case."""
    return next((name for name in VIDEO_CODECS[:-1] if _can_encode(av, name)), VIDEO_CODECS[-1])


def _can_encode(av, name: str) -> bool:
    """Asked of the encoder itself: `av.codecs_available` also lists decoders ('h264' is there in
    builds that cannot encode it)."""
    try:
        av.Codec(name, "w")
    except ValueError:  # av's UnknownCodecError
        return False
    return True
