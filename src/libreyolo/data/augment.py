"""Augmentations as geometry: every spatial step is a 3x3 matrix, applied in ONE warp.

Coordinates are continuous pixels: pixel i covers [i, i+1), a box is (x1, y1, x2, y2) with x2 an
exclusive edge, an image of width W spans [0, W]. That is exactly grid_sample's
`align_corners=False` convention, so image and boxes move through the same matrix.

A training sample is a set of *tiles* (one image, or four for a mosaic) placed on a virtual
canvas and a matrix M mapping canvas -> output (then mixup, colour and flip, see dataset.py):
- only the canvas region that the output can see is materialised (uint8); without rotation or
  shear it is resized and pasted, else one `grid_sample` (bilinear) renders it;
- boxes: the 4 corners of each box go through M, their bounding box is clipped to the output,
  and boxes that became tiny, thin or mostly cut off are dropped;
- HSV jitter is one 3x3 colour matrix in YIQ space (hue = rotation of the chroma plane,
  saturation = chroma gain, value = overall gain): one matmul instead of an RGB->HSV round trip.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torchvision.transforms.v2 import functional as TF

FILL = 114  # grey for padding, as YOLO-style trainers use

_RGB2YIQ = np.array([[0.299, 0.587, 0.114], [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]])
_YIQ2RGB = np.linalg.inv(_RGB2YIQ)


@dataclass
class Tile:
    """An image (uint8 [3, h, w]) with boxes (xyxy px, float32 [n, 4]) at (x, y) on a canvas."""

    image: torch.Tensor
    boxes: np.ndarray
    labels: np.ndarray
    x: int = 0
    y: int = 0


# ----------------------------------------------------------------------------- matrices
def translation(tx: float, ty: float) -> np.ndarray:
    return np.array([[1.0, 0, tx], [0, 1.0, ty], [0, 0, 1.0]])


def random_affine(rng: np.random.Generator, degrees: float, scale: float, shear: float,
                  translate: float, size: int) -> np.ndarray:
    """Rotation + scale + shear about the origin, then a move to the jittered output centre."""
    a = math.radians(rng.uniform(-degrees, degrees))
    s = rng.uniform(1 - scale, 1 + scale)
    rot = np.array([[s * math.cos(a), -s * math.sin(a), 0], [s * math.sin(a), s * math.cos(a), 0],
                    [0, 0, 1.0]])
    shx = math.tan(math.radians(rng.uniform(-shear, shear)))
    shy = math.tan(math.radians(rng.uniform(-shear, shear)))
    sh = np.array([[1.0, shx, 0], [shy, 1.0, 0], [0, 0, 1.0]])
    # Whole pixels: with no rotation/scale the warp then degenerates to an exact copy.
    tx = round(rng.uniform(-translate, translate) * size)
    ty = round(rng.uniform(-translate, translate) * size)
    return translation(size // 2 + tx, size // 2 + ty) @ sh @ rot


def hsv_matrix(rng: np.random.Generator, h: float, s: float, v: float) -> torch.Tensor | None:
    """A 3x3 RGB colour matrix for random hue/saturation/value gains; None when all are off."""
    if h == 0 and s == 0 and v == 0:
        return None
    dh, ds, dv = rng.uniform(-1, 1, 3) * (h, s, v)
    a = dh * 2 * math.pi
    chroma = (1 + ds) * np.array([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]])
    yiq = np.eye(3)
    yiq[1:, 1:] = chroma
    m = (1 + dv) * (_YIQ2RGB @ yiq @ _RGB2YIQ)
    return torch.from_numpy(m.astype(np.float32))


# ----------------------------------------------------------------------------- layouts
def mosaic_tiles(tiles: list[Tile], size: int, rng: np.random.Generator) -> tuple[int, int]:
    """Place 4 tiles around a random centre on a 2S x 2S canvas (in place); returns the canvas
    size. Tile k sits in quadrant k (top-left, top-right, bottom-left, bottom-right) with one
    corner at the centre; whatever falls outside the canvas is cut, and so are its boxes."""
    xc, yc = (int(v) for v in rng.integers(size // 2, 3 * size // 2 + 1, size=2))
    for k, t in enumerate(tiles):
        h, w = t.image.shape[-2:]
        t.x = xc - w if k in (0, 2) else xc
        t.y = yc - h if k in (0, 1) else yc
    return 2 * size, 2 * size


# ----------------------------------------------------------------------------- rendering
def fill_image(h: int, w: int) -> torch.Tensor:
    """A FILL image uint8 [3, h, w] stored channels-last (HWC in memory).

    That is the layout decode_image and torch's uint8 antialiased resize produce: pasting a
    decoded tile then copies whole rows instead of transposing (5-10x cheaper), and resizing
    the region skips the resize's own round trip through channels-last (2.5x cheaper)."""
    return torch.full((h, w, 3), FILL, dtype=torch.uint8).permute(2, 0, 1)


def render(tiles: list[Tile], canvas_hw: tuple[int, int], m: np.ndarray, size: int
           ) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
    """Warp the canvas through M into a size x size image; returns (image, boxes, labels).

    Without rotation or shear (the default config) the visible canvas region is resized
    (uint8, antialiased) and pasted: about half the cost of a bilinear warp, and an exact copy
    for a whole-pixel translation. Otherwise one grid_sample warp; the image is then float32."""
    if m[0, 1] == 0 and m[1, 0] == 0 and m[0, 0] > 0 and m[1, 1] > 0:
        return _render_scaled(tiles, canvas_hw, m, size)
    return _render_warped(tiles, canvas_hw, m, size)


def _render_scaled(tiles: list[Tile], canvas_hw: tuple[int, int], m: np.ndarray, size: int):
    # The visible canvas region, in whole canvas pixels, and where it lands in whole output
    # pixels; the boxes then follow the scale and offset actually realised (a hair off M's).
    span = []
    for axis, extent in ((0, canvas_hw[1]), (1, canvas_hw[0])):
        s, t = m[axis, axis], m[axis, 2]
        lo, hi = max(0, math.floor(-t / s)), min(extent, math.ceil((size - t) / s))
        span.append((lo, hi, round(s * lo + t), round(s * hi + t)))
    (x0, x1, ox0, ox1), (y0, y1, oy0, oy1) = span
    if x1 <= x0 or y1 <= y0 or ox1 <= ox0 or oy1 <= oy0:  # nothing of the canvas is visible
        return fill_image(size, size), *_transform_tile_boxes(tiles, canvas_hw, m, size)
    sx, sy = (ox1 - ox0) / (x1 - x0), (oy1 - oy0) / (y1 - y0)
    realised = np.array([[sx, 0, ox0 - sx * x0], [0, sy, oy0 - sy * y0], [0, 0, 1.0]])
    region = fill_image(y1 - y0, x1 - x0)
    for t in tiles:
        _paste(region, t, x0, y0, canvas_hw)
    if (oy1 - oy0, ox1 - ox0) != (y1 - y0, x1 - x0):
        region = TF.resize(region, [oy1 - oy0, ox1 - ox0], antialias=True)
    if (ox0, oy0, ox1, oy1) == (0, 0, size, size):  # the region is the output: no FILL margin
        return region, *_transform_tile_boxes(tiles, canvas_hw, realised, size)
    out = fill_image(size, size)
    _paste(out, Tile(region, np.zeros((0, 4)), np.zeros(0), ox0, oy0), 0, 0, (size, size))
    return out, *_transform_tile_boxes(tiles, canvas_hw, realised, size)


def _render_warped(tiles: list[Tile], canvas_hw: tuple[int, int], m: np.ndarray, size: int):
    ch, cw = canvas_hw
    inv = np.linalg.inv(m)
    corners = inv @ np.array([[0, size, 0, size], [0, 0, size, size], [1.0, 1, 1, 1]])
    corners = corners[:2] / corners[2]
    # The visible region plus a 1 px margin for bilinear taps, cut to the canvas plus a 1 px
    # FILL frame: the frame is what warp's border padding replicates outside the canvas.
    x0, y0 = (max(-1, math.floor(c.min()) - 1) for c in corners)
    x1 = min(cw + 1, math.ceil(corners[0].max()) + 1)
    y1 = min(ch + 1, math.ceil(corners[1].max()) + 1)
    boxes, labels = _transform_tile_boxes(tiles, canvas_hw, m, size)
    if x1 <= x0 or y1 <= y0:  # the output sees nothing of the canvas
        return fill_image(size, size), boxes, labels
    region = fill_image(y1 - y0, x1 - x0)
    for t in tiles:
        _paste(region, t, x0, y0, canvas_hw)
    return warp(region, m @ translation(x0, y0), size), boxes, labels


def warp(image: torch.Tensor, m: np.ndarray, size: int) -> torch.Tensor:
    """Bilinear warp of uint8 [3, h, w] through M (input px -> output px); float32 [3, S, S].

    Samples outside the image repeat its border, so a caller wanting FILL there frames the
    image with FILL (render does): cheaper than shifting by FILL and zero padding."""
    h, w = image.shape[-2:]
    to_norm_in = np.array([[2.0 / w, 0, -1], [0, 2.0 / h, -1], [0, 0, 1]])
    from_norm_out = np.array([[size / 2, 0, size / 2], [0, size / 2, size / 2], [0, 0, 1]])
    theta = torch.from_numpy((to_norm_in @ np.linalg.inv(m) @ from_norm_out)[:2].astype(np.float32))
    # The grid of an affine map is an outer sum of a row term and a column term: building it
    # that way is ~6x cheaper than F.affine_grid's per-pixel matmul.
    base = (torch.arange(size, dtype=torch.float32) * 2 + 1) / size - 1  # pixel centres
    gx = theta[:, 0, None] * base  # [2, S]: x contribution to (grid_x, grid_y)
    gy = theta[:, 1, None] * base + theta[:, 2, None]  # [2, S]: y contribution + offset
    grid = (gx.T[None, :, :] + gy.T[:, None, :])[None]  # [1, S(y), S(x), 2]
    out = F.grid_sample(image.float()[None], grid, mode="bilinear", padding_mode="border",
                        align_corners=False)
    return out[0]


def _paste(dst: torch.Tensor, t: Tile, ox: int, oy: int, canvas_hw: tuple[int, int]) -> None:
    """Copy the part of tile t that is on the canvas and inside dst (dst's origin at ox, oy)."""
    h, w = t.image.shape[-2:]
    dh, dw = dst.shape[-2:]
    cx0, cy0 = max(t.x, 0, ox), max(t.y, 0, oy)
    cx1 = min(t.x + w, canvas_hw[1], ox + dw)
    cy1 = min(t.y + h, canvas_hw[0], oy + dh)
    if cx1 > cx0 and cy1 > cy0:
        dst[:, cy0 - oy:cy1 - oy, cx0 - ox:cx1 - ox] = \
            t.image[:, cy0 - t.y:cy1 - t.y, cx0 - t.x:cx1 - t.x]


def _transform_tile_boxes(tiles: list[Tile], canvas_hw, m: np.ndarray, size: int):
    boxes, labels = [], []
    for t in tiles:
        h, w = t.image.shape[-2:]
        b = t.boxes + np.array([t.x, t.y, t.x, t.y], np.float32)
        # Cut boxes to the visible part of their tile (mosaic tiles are cut at the canvas edge).
        lo = np.array([max(t.x, 0), max(t.y, 0)] * 2, np.float32)
        hi = np.array([min(t.x + w, canvas_hw[1]), min(t.y + h, canvas_hw[0])] * 2, np.float32)
        boxes.append(np.clip(b, lo, hi))
        labels.append(t.labels)
    b = np.concatenate(boxes) if boxes else np.zeros((0, 4), np.float32)
    lab = np.concatenate(labels) if labels else np.zeros(0, np.int64)
    return transform_boxes(b, lab, m, size)


def transform_boxes(boxes: np.ndarray, labels: np.ndarray, m: np.ndarray, size: int
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Map boxes through M (bbox of the 4 transformed corners), clip, drop degenerate ones."""
    if len(boxes) == 0:
        return boxes.reshape(0, 4).astype(np.float32), labels
    x1, y1, x2, y2 = boxes.T.astype(np.float64)
    pts = np.stack([np.stack([x1, y1]), np.stack([x2, y1]), np.stack([x1, y2]),
                    np.stack([x2, y2])], axis=-1)  # [2, n, 4]
    xy = np.einsum("ij,jnk->ink", m[:2, :2], pts) + m[:2, 2, None, None]
    out = np.stack([xy[0].min(1), xy[1].min(1), xy[0].max(1), xy[1].max(1)], axis=1)
    out = np.clip(out, 0, size)
    area_before = (x2 - x1) * (y2 - y1) * abs(np.linalg.det(m[:2, :2]))
    keep = box_candidates(out, area_before)
    return out[keep].astype(np.float32), labels[keep]


def box_candidates(boxes: np.ndarray, area_before: np.ndarray, min_side: float = 2.0,
                   max_aspect: float = 20.0, min_area_frac: float = 0.1) -> np.ndarray:
    """Keep boxes at least min_side px wide and high, not thinner than 1:max_aspect, and
    keeping at least min_area_frac of their (transformed) area after clipping."""
    w = boxes[:, 2] - boxes[:, 0]
    h = boxes[:, 3] - boxes[:, 1]
    aspect = np.maximum(w / np.maximum(h, 1e-9), h / np.maximum(w, 1e-9))
    return ((w > min_side) & (h > min_side) & (aspect < max_aspect)
            & (w * h > min_area_frac * area_before))


# ----------------------------------------------------------------------------- pixel ops
def apply_color(image: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """image [3, H, W] (uint8 or float, any layout) -> c @ rgb per pixel, float contiguous.

    The conversion to float and to the contiguous layout the matmul needs is one pass (a no-op
    for a float contiguous image): a channels-last uint8 image is not transposed separately."""
    h, w = image.shape[-2:]
    x = image.to(torch.float32, memory_format=torch.contiguous_format)
    return torch.mm(c, x.reshape(3, -1)).reshape(3, h, w)


def fliplr(image: torch.Tensor, boxes: np.ndarray) -> tuple[torch.Tensor, np.ndarray]:
    w = image.shape[-1]
    out = boxes.copy()
    out[:, 0], out[:, 2] = w - boxes[:, 2], w - boxes[:, 0]
    return image.flip(-1), out


def mixup(a: torch.Tensor, b: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
    """Blend two rendered samples (float or uint8) with r ~ Beta(32, 32) (about 0.5)."""
    r = float(rng.beta(32.0, 32.0))
    return a.float().mul_(r).add_(b.float(), alpha=1 - r)


def to_uint8(image: torch.Tensor) -> torch.Tensor:
    """A sample as collate takes it: uint8 [3, H, W], contiguous; a float image is rounded."""
    if image.dtype == torch.uint8:
        return image.contiguous()
    # +0.5 then truncation rounds (values are >= 0 after the clamp): one pass less than round_.
    # numpy's float -> uint8 cast truncates like torch's and is ~5x faster than `.to` on CPU.
    x = image.add_(0.5).clamp_(0, 255).contiguous()
    return torch.from_numpy(x.numpy().astype(np.uint8))


def resize_long_side(image: torch.Tensor, size: int) -> torch.Tensor:
    """Resize uint8 [3, h, w] so that max(h, w) == size (aspect kept, antialiased)."""
    h, w = image.shape[-2:]
    r = size / max(h, w)
    nh, nw = max(1, round(h * r)), max(1, round(w * r))
    if (nh, nw) == (h, w):
        return image
    return TF.resize(image, [nh, nw], antialias=True)


def letterbox(image: torch.Tensor, boxes: np.ndarray, size: int
              ) -> tuple[torch.Tensor, np.ndarray, tuple[int, int]]:
    """Centre an image (long side <= size) on a size x size FILL canvas; returns the padded
    image, the shifted boxes and the (left, top) padding."""
    h, w = image.shape[-2:]
    left, top = (size - w) // 2, (size - h) // 2
    out = torch.full((3, size, size), FILL, dtype=torch.uint8)
    out[:, top:top + h, left:left + w] = image
    return out, boxes + np.array([left, top, left, top], np.float32), (left, top)
