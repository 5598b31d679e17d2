"""What `predict` reads: image files, folders, globs, videos and in-memory images, as one stream
of `Frame`s.

`open_source(source)` checks the whole source before anything is decoded, so a mistake (a missing
path, an empty folder, an array of the wrong shape, an unreadable video header) is one DataError
before a model runs or an output folder exists. Iterating the returned `Source` then decodes one
image (or video frame) at a time: a folder of 100 000 images never sits in memory.

Which files are read: a folder gives its images sorted by file name, not its subfolders (files
whose name starts with a dot are not data: macOS `._x.jpg`); a glob gives the images it matches,
sorted by path. Image suffixes are the dataset readers' (dataset_yaml.IMAGE_SUFFIXES), decoding is
the training pipeline's (dataset.decode_rgb), so what trains also predicts. A lone image file that
does not decode is a DataError; inside a folder, glob or list it is skipped with one warning line
and counted in `Source.skipped`: one bad file should not stop a run over thousands.

In-memory images are RGB: a numpy array is HxWx3 uint8 in RGB order (OpenCV's BGR must be flipped
first, `img[..., ::-1]`) or HxW grayscale; a torch tensor is CxHxW, uint8 or float in [0, 1]; a
PIL image is converted to RGB. Videos are read with PyAV (the `video` extra): torchvision no
longer decodes video.
"""

from __future__ import annotations

import glob
import logging
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torchvision.transforms.v2 import functional as TF

from ..data.classify import image_ok
from ..data.dataset import decode_rgb
from ..data.dataset_yaml import IMAGE_SUFFIXES
from ..errors import ConfigError, DataError

log = logging.getLogger("libreyolo")

VIDEO_SUFFIXES = (".mp4", ".m4v", ".mov", ".avi", ".mkv", ".webm", ".mpg", ".mpeg", ".wmv")
DEFAULT_FPS = 30.0  # a video whose header states no frame rate
_ACCEPTED = ("accepted: uint8 HxWx3 (RGB) or HxW (grayscale) numpy arrays, CxHxW torch tensors "
             "(C 1 or 3; uint8, or float in [0, 1]), PIL images")


@dataclass(frozen=True)
class Frame:
    """One image to predict on. `image` is RGB uint8 [3, h, w], CPU, contiguous (an input tensor
    that already is one is passed through, not copied)."""

    image: torch.Tensor
    name: str                   # 'img.jpg', 'clip.mp4', 'image3' (in memory: 'image' + index)
    path: str | None            # the file it was read from; None in memory
    frame: int | None           # 0-based number in its video, counting the frames vid_stride drops; None for a still
    index: int                  # 0-based position among the frames the source yielded
    fps: float | None = None    # a video's rate of yielded frames (its fps / vid_stride); None for a still


class Source:
    """A checked source: `kind`, `total` (the frames it will yield when known, files that turn out
    not to decode included), `fps` (a lone video's yielded frame rate), and iteration yielding
    `Frame`s lazily. `skipped` counts the files the
    last iteration could not decode. `len()` is `total`, a TypeError when unknown (as for any
    iterator without a length: progress bars then count without a total)."""

    def __init__(self, kind: str, items: list[_Item]):
        self.kind = kind
        self._items = items
        self.skipped = 0
        self._index = 0  # the next yielded frame's index

    @property
    def total(self) -> int | None:
        counts = [item.count for item in self._items]
        return None if None in counts else sum(counts)

    @property
    def fps(self) -> float | None:
        return self._items[0].fps if self.kind == "video" else None

    def __len__(self) -> int:
        if self.total is None:
            raise TypeError("the number of frames of this video is not known before it is read")
        return self.total

    def __bool__(self) -> bool:  # never empty (checked), whether or not its length is known
        return True

    def __iter__(self) -> Iterator[Frame]:
        for decode in self.decoders():
            frame = self.frame_of(decode())
            if frame is not None:
                yield frame

    def image_files(self) -> list[Path]:
        """The image files this source reads, in order (not its videos or in-memory images)."""
        return [item.path for item in self._items if isinstance(item, _ImageFile)]

    def decoders(self) -> Iterator[Callable[[], _Yield | None]]:
        """The iteration split for a thread pool: one callable per frame, in order. Calling it
        decodes an image file (None if it does not decode), or hands over a frame this thread
        already decoded (video frames come in order; arrays are converted). `frame_of` turns the
        results, taken in order, into Frames."""
        self.skipped = 0
        self._index = 0
        for item in self._items:
            if isinstance(item, _ImageFile):
                yield item.decode
            else:
                for decoded in item.frames():
                    yield lambda decoded=decoded: decoded

    def frame_of(self, decoded: _Yield | None) -> Frame | None:
        """The Frame of one decoder's result, numbered in order; None (counted as skipped) for a
        file that did not decode."""
        if decoded is None:
            self.skipped += 1
            return None
        image, name, path, frame, fps = decoded
        out = Frame(image, name or f"image{self._index}", path, frame, self._index, fps)
        self._index += 1
        return out

    def __repr__(self) -> str:
        return f"Source(kind={self.kind!r}, total={self.total})"


def open_source(source: Any, vid_stride: int = 1) -> Source:
    """Check `source` (a path, folder, glob, video, array, tensor, PIL image, or a list of these)
    and return it as a `Source`; a DataError (one line) if it cannot be read. `vid_stride` keeps
    every n-th video frame (the first one included)."""
    if isinstance(vid_stride, bool) or not isinstance(vid_stride, int) or vid_stride < 1:
        raise ConfigError(f"vid_stride={vid_stride!r}: must be a whole number >= 1 (1 reads every frame)")
    if isinstance(source, (list, tuple)):
        if not source:
            raise DataError("the source is an empty list: pass at least one image, folder, glob or video")
        items: list[_Item] = []
        for i, entry in enumerate(source):
            if isinstance(entry, (list, tuple)):
                raise DataError(f"source list entry {i} is itself a list: pass one flat list")
            try:
                items += _items(entry, vid_stride, strict=False)[1]
            except DataError as exc:  # which entry: ten arrays look alike
                raise DataError(f"source list entry {i}: {exc}") from None
        return Source("list", items)
    kind, items = _items(source, vid_stride, strict=True)
    return Source(kind, items)


def _items(source: Any, vid_stride: int, strict: bool) -> tuple[str, list[_Item]]:
    """(kind, items) of one non-list source. `strict`: a lone image file that fails to decode is a
    DataError rather than a skip."""
    if isinstance(source, (str, os.PathLike)):
        return _path_items(os.fspath(source), vid_stride, strict)
    return "array", [_InMemory(_check_array(source))]


def _path_items(text: str, vid_stride: int, strict: bool) -> tuple[str, list[_Item]]:
    if text.startswith(("http://", "https://", "rtsp://", "rtmp://")):
        raise DataError(f"source {text}: URLs and streams are not read; download the file and pass its path")
    path = Path(text).expanduser()
    if path.is_dir():
        files = sorted((p for p in path.iterdir() if _is_image(p)), key=lambda p: p.name)
        if not files:
            raise DataError(f"no images ({_exts()}) in folder {path} (subfolders are not read)")
        return "folder", [_ImageFile(p, strict=False) for p in files]
    if path.is_file():
        suffix = path.suffix.lower()
        if suffix in IMAGE_SUFFIXES:
            return "image", [_ImageFile(path, strict)]
        if suffix in VIDEO_SUFFIXES:
            return "video", [_VideoFile(path, vid_stride)]
        raise DataError(f"{path}: unsupported file type '{path.suffix or path.name}'; images: {_exts()}; "
                        f"videos: {', '.join(VIDEO_SUFFIXES)}")
    if any(c in text for c in "*?["):
        files = sorted(p for p in _glob(os.path.expanduser(text)) if _is_image(p))
        if not files:
            raise DataError(f"no images ({_exts()}) match {text}")
        return "glob", [_ImageFile(p, strict=False) for p in files]
    raise DataError(f"source not found: {path}")


def _glob(pattern: str):
    """The paths matching `pattern`, `**` included, without following symlinked folders in a `**`:
    glob.glob(recursive=True) follows them, and a folder holding a link to itself or its parent
    made it list an endless tree (a million names in a minute). pathlib's `**` does not follow."""
    parts = Path(pattern).parts
    first = next((i for i, part in enumerate(parts) if glob.has_magic(part)), len(parts))
    base = Path(*parts[:first]) if first else Path(".")
    rest = list(parts[first:])
    if not rest:
        return iter([base])
    if rest[-1] == "**":  # glob's `dir/**` lists files as well; pathlib's only folders
        rest.append("*")
    return base.glob(str(Path(*rest)))


def _is_image(path: Path) -> bool:
    return path.suffix.lower() in IMAGE_SUFFIXES and not path.name.startswith(".") and path.is_file()


def _exts() -> str:
    return ", ".join(IMAGE_SUFFIXES)


def _is_pil(value: Any) -> bool:
    pil = sys.modules.get("PIL.Image")  # a PIL image exists only where PIL was imported
    return pil is not None and isinstance(value, pil.Image)


def _check_array(value: Any) -> Any:
    """`value` if it is an in-memory image this module reads, else a DataError saying what it is
    and what is accepted. Nothing is converted yet."""
    if _is_pil(value):
        if value.width == 0 or value.height == 0:
            raise DataError(f"PIL image of size {value.size}: empty; {_ACCEPTED}")
        return value
    if isinstance(value, np.ndarray):
        ok = value.dtype == np.uint8 and (value.ndim == 2 or (value.ndim == 3 and value.shape[2] in (1, 3)))
        if not ok or 0 in value.shape:
            raise DataError(f"numpy array of shape {value.shape} and dtype {value.dtype}; {_ACCEPTED}")
        return value
    if isinstance(value, torch.Tensor):
        ok = (value.dtype == torch.uint8 or value.is_floating_point()) and value.ndim == 3 and value.shape[0] in (1, 3)
        if not ok or 0 in value.shape:
            hint = " (a batch: pass list(tensor))" if value.ndim == 4 else ""
            raise DataError(f"tensor of shape {tuple(value.shape)} and dtype {value.dtype}{hint}; {_ACCEPTED}")
        if value.is_floating_point():
            lo, hi = float(value.min()), float(value.max())
            if not (0.0 <= lo and hi <= 1.0):  # NaN fails too
                raise DataError(f"float tensor with values in [{lo:g}, {hi:g}]: float images must be in [0, 1] "
                                f"(divide by 255, or pass uint8)")
        return value
    raise DataError(f"cannot read a source of type {type(value).__name__}: pass a path, folder, glob, video, "
                    f"list, or an in-memory image ({_ACCEPTED})")


def _to_chw(value: Any) -> torch.Tensor:
    """A checked in-memory image as RGB uint8 [3, h, w], CPU, contiguous."""
    if _is_pil(value):
        value = np.asarray(value.convert("RGB"))
    if isinstance(value, np.ndarray):
        if value.ndim == 2:
            value = value[:, :, None]
        chw = np.array(value.transpose(2, 0, 1), order="C")  # one copy, writable, C-contiguous
        t = torch.from_numpy(chw)
    else:
        t = value.detach().cpu()
        if t.is_floating_point():
            t = TF.to_dtype(t, torch.uint8, scale=True)
    return t.expand(3, -1, -1).contiguous() if t.shape[0] == 1 else t.contiguous()


# What an item yields: (image, name, path, frame number, fps); name None = in memory.
_Yield = tuple[torch.Tensor, str | None, str | None, int | None, float | None]


class _ImageFile:
    count = 1
    fps = None

    def __init__(self, path: Path, strict: bool):
        self.path, self.strict = path, strict
        if strict and not image_ok(path):  # a lone image is checked up front, before any model is built
            raise DataError(f"{path}: does not decode (truncated or not an image)")

    def decode(self) -> _Yield | None:
        """The image, or None (said in one warning line) when it does not decode; thread-safe."""
        # image_ok first: it is silent, where libpng prints its own line on a broken PNG.
        image = decode_rgb(self.path) if self.strict or image_ok(self.path) else None
        if image is None:
            if self.strict:
                raise DataError(f"{self.path}: does not decode (truncated or not an image)")
            log.warning("cannot decode %s (truncated or not an image); skipped", self.path)
            return None
        return image.contiguous(), self.path.name, str(self.path), None, None


class _InMemory:
    count = 1
    fps = None

    def __init__(self, value: Any):  # a numpy array, tensor or PIL image that _check_array passed
        self.value = value

    def frames(self) -> Iterator[_Yield]:
        yield _to_chw(self.value), None, None, None, None


class _VideoFile:
    """A video whose header was read at open (a file FFmpeg cannot open is a DataError then);
    frames are decoded when iterated."""

    def __init__(self, path: Path, stride: int):
        av = import_av()
        self.path, self.stride = path, stride
        try:
            with av.open(str(path)) as container:
                if not container.streams.video:
                    raise DataError(f"{path}: no video stream in the file")
                stream = container.streams.video[0]
                rate = float(stream.average_rate or stream.guessed_rate or 0) or DEFAULT_FPS
                n = stream.frames  # from the container's index; 0 when it has none
                if not n and stream.duration and stream.time_base:  # estimated from the duration
                    n = round(float(stream.duration * stream.time_base) * rate)
                elif not n and container.duration:
                    n = round(container.duration / av.time_base * rate)
        except (av.error.FFmpegError, OSError) as exc:
            raise DataError(f"cannot read video {path}: {_reason(exc)}") from None
        self.count = -(-n // stride) if n else None
        self.fps = rate / stride

    def frames(self) -> Iterator[_Yield]:
        av = import_av()
        n = -1
        try:
            with av.open(str(self.path)) as container:
                stream = container.streams.video[0]
                stream.thread_type = "AUTO"  # frame-parallel decoding
                for n, frame in enumerate(container.decode(stream)):
                    if n % self.stride == 0:
                        rgb = torch.from_numpy(frame.to_ndarray(format="rgb24")).permute(2, 0, 1).contiguous()
                        yield rgb, self.path.name, str(self.path), n, self.fps
        except (av.error.FFmpegError, OSError) as exc:
            raise DataError(f"video {self.path}: decoding failed after {n + 1} frames: {_reason(exc)}") from None
        if n < 0:
            raise DataError(f"video {self.path}: no frame decodes (corrupt or empty video)")


_Item = _ImageFile | _InMemory | _VideoFile


def import_av():
    try:
        import av
    except ImportError:
        raise DataError("reading video needs PyAV: pip install 'libreyolo[video]'") from None
    return av


def _reason(exc: Exception) -> str:
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return " ".join(str(text).split())  # one line
