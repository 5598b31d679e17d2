"""Boxes stay consistent with pixels through every augmentation.

Each test draws solid coloured rectangles on black, applies one augmentation, finds the object's
pixels by colour in the output image, and checks that they lie inside the transformed box
(2 px tolerance) and that the box is not much larger than their extent (3 px). The image path
(grid_sample, slicing, resize) and the box path (corner transforms) are separate code, so each
checks the other.
"""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from libreyolo.data.augment import (
    Tile,
    apply_color,
    fliplr,
    hsv_matrix,
    letterbox,
    mixup,
    mosaic_tiles,
    random_affine,
    render,
    to_uint8,
    translation,
)
from libreyolo.data.dataset import SampleKey, TrainDataset
from libreyolo.data.labels import Split
from libreyolo.data.loader import collate_train

COLOURS = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0)]  # red, green, blue, yellow
TOL, LOOSE = 2.0, 3.0


def score(img: torch.Tensor, k: int) -> torch.Tensor:
    """How strongly each pixel shows colour k (about 255 on the object, <= 0 on black/grey)."""
    r, g, b = img.float()
    return [r - torch.maximum(g, b), g - torch.maximum(r, b), b - torch.maximum(r, g),
            torch.minimum(r, g) - b][k]


def pixels(img: torch.Tensor, k: int, thr: float = 100.0) -> np.ndarray:
    ys, xs = torch.nonzero(score(img, k) > thr, as_tuple=True)
    return np.stack([xs.numpy(), ys.numpy()], axis=1)


def canvas_with(objs, h: int, w: int) -> Tile:
    """A black h x w image with solid rectangles; objs = [(class, x1, y1, x2, y2)]."""
    img = torch.zeros((3, h, w), dtype=torch.uint8)
    for k, x1, y1, x2, y2 in objs:
        img[:, y1:y2, x1:x2] = torch.tensor(COLOURS[k], dtype=torch.uint8)[:, None, None]
    boxes = np.array([o[1:] for o in objs], np.float32).reshape(-1, 4)
    return Tile(img, boxes, np.array([o[0] for o in objs], np.int64))


def check(img: torch.Tensor, boxes: np.ndarray, labels: np.ndarray, thr: float = 100.0):
    """Every class present: its pixels inside its box, and the box hugging them."""
    assert len(boxes) == len(labels) > 0
    for box, k in zip(boxes, labels):
        p = pixels(img, int(k), thr)
        assert len(p) > 20, f"class {k}: object vanished"
        x1, y1, x2, y2 = box
        assert p[:, 0].min() >= x1 - TOL and p[:, 0].max() + 1 <= x2 + TOL, (box, p.min(0), p.max(0))
        assert p[:, 1].min() >= y1 - TOL and p[:, 1].max() + 1 <= y2 + TOL, (box, p.min(0), p.max(0))
        extent = np.array([p[:, 0].min(), p[:, 1].min(), p[:, 0].max() + 1, p[:, 1].max() + 1])
        assert np.abs(extent - box).max() <= LOOSE, (box, extent)


def test_letterbox():
    t = canvas_with([(0, 10, 5, 40, 25)], 50, 80)
    img, boxes, (left, top) = letterbox(t.image, t.boxes, 96)
    assert img.shape == (3, 96, 96) and (left, top) == (8, 23)
    assert (img[:, :top] == 114).all() and (img[:, :, :left] == 114).all()
    check(img, boxes, t.labels)


@pytest.mark.parametrize("seed", range(4))
def test_affine_rotation_shear_scale_translate(seed):
    rng = np.random.default_rng(seed)
    t = canvas_with([(0, 20, 30, 50, 45)], 80, 96)
    m = random_affine(rng, degrees=40, scale=0.4, shear=15, translate=0.1, size=96)
    m = m @ translation(-48, -40)
    img, boxes, labels = render([t], (80, 96), m, 96)
    assert img.dtype == torch.float32  # really warped, not the copy fast path
    check(to_uint8(img), boxes, labels)
    # the box of a sheared/rotated rectangle is the bbox of its 4 transformed corners
    corners = np.array([[20, 30, 1], [50, 30, 1], [20, 45, 1], [50, 45, 1]], float) @ m.T
    expect = np.clip([*corners[:, :2].min(0), *corners[:, :2].max(0)], 0, 96)
    np.testing.assert_allclose(boxes[0], expect, atol=1e-3)


@pytest.mark.parametrize("seed", range(4))
def test_scale_and_translate_without_rotation(seed):
    rng = np.random.default_rng(seed)
    t = canvas_with([(0, 20, 30, 50, 45)], 80, 96)
    m = random_affine(rng, degrees=0, scale=0.5, shear=0, translate=0.2, size=96)
    img, boxes, labels = render([t], (80, 96), m @ translation(-48, -40), 96)
    assert img.dtype == torch.uint8  # the resize-and-paste path, no warp
    check(img, boxes, labels)


def test_integer_translation_is_an_exact_copy():
    t = canvas_with([(1, 5, 5, 20, 15)], 40, 64)
    img, boxes, labels = render([t], (40, 64), translation(0, 12), 64)
    lb, lb_boxes, _ = letterbox(t.image, t.boxes, 64)
    assert img.dtype == torch.uint8 and torch.equal(img, lb)
    np.testing.assert_allclose(boxes, lb_boxes)


@pytest.mark.parametrize("seed, degrees, shear", [(0, 10, 5), (1, 10, 5), (2, 0, 0), (3, 0, 0)])
def test_mosaic(seed, degrees, shear):
    rng = np.random.default_rng(seed)
    s = 64
    # each tile has its object near the corner that touches the mosaic centre
    tiles = [canvas_with([(0, 40, 40, 60, 60)], 64, 64), canvas_with([(1, 4, 30, 24, 58)], 64, 48),
             canvas_with([(2, 30, 4, 60, 20)], 48, 64), canvas_with([(3, 6, 6, 26, 30)], 64, 64)]
    canvas = mosaic_tiles(tiles, s, rng)
    m = random_affine(rng, degrees=degrees, scale=0.3, shear=shear, translate=0.05, size=s) @ \
        translation(-s, -s)
    img, boxes, labels = render(tiles, canvas, m, s)
    img = to_uint8(img)
    assert len(labels) >= 1
    check(img, boxes, labels)
    for k in set(range(4)) - set(labels.tolist()):
        # dropped (cut off by the canvas or the output): at most 10 % of the object may show
        assert len(pixels(img, k)) <= 0.1 * 600 * 1.3**2, k


def test_mixup():
    a = canvas_with([(0, 5, 5, 30, 30)], 64, 64)
    b = canvas_with([(1, 35, 30, 60, 60)], 64, 64)
    img = mixup(a.image, b.image, np.random.default_rng(0))
    check(to_uint8(img), np.concatenate([a.boxes, b.boxes]), np.concatenate([a.labels, b.labels]),
          thr=60.0)  # each object at about half strength


def test_hsv():
    t = canvas_with([(0, 10, 10, 40, 30)], 48, 64)
    c = hsv_matrix(np.random.default_rng(3), 0.05, 0.7, 0.4)
    img = to_uint8(apply_color(t.image.float(), c))
    # the object's colour after the same matrix sets the detection threshold
    red = c @ torch.tensor([255.0, 0, 0])
    check(img, t.boxes, t.labels, thr=0.5 * float(red[0] - red[1:].max()))


def test_flip():
    t = canvas_with([(2, 3, 10, 20, 30)], 40, 64)
    img, boxes = fliplr(t.image, t.boxes)
    np.testing.assert_allclose(boxes[0], [44, 10, 61, 30])
    check(img, boxes, t.labels)


def test_multi_scale_collate():
    items = []
    for obj in [(0, 10, 10, 40, 50), (1, 60, 20, 90, 40)]:
        img, boxes, _ = letterbox(canvas_with([obj], 96, 96).image,
                                  np.array([obj[1:]], np.float32), 96)
        items.append((img, boxes, np.array([obj[0]]), 64))
    batch = collate_train(items)
    assert batch.images.shape == (2, 3, 64, 64) and batch.images.dtype == torch.uint8
    for i in range(2):
        v = batch.targets.valid[i]
        check(batch.images[i], batch.targets.boxes[i][v].numpy(), batch.targets.labels[i][v].numpy())


@pytest.mark.parametrize("degrees, shear", [(15, 5), (0, 0)])
def test_full_training_pipeline_keeps_boxes_on_objects(degrees, shear):
    """Mosaic + mixup + rotation/shear/scale/translate + hsv + flip, through TrainDataset."""
    imgs = [canvas_with([(k, 20, 24, 44, 44)], 64, 64) for k in range(4)]
    hyp = SimpleNamespace(hsv_h=0.01, hsv_s=0.3, hsv_v=0.2, fliplr=0.5, degrees=degrees,
                          translate=0.1, scale=0.3, shear=shear)
    ds = TrainDataset(Split("train", [None] * 4, [None] * 4, [(64, 64)] * 4), 64, hyp, seed=1)
    ds.tile = lambda i: Tile(imgs[i].image, imgs[i].boxes.copy(), imgs[i].labels)
    checked = 0
    for index in range(12):
        img, boxes, labels, _ = ds[SampleKey(index, 0, 1.0, 1.0, 64)]
        assert img.dtype == torch.uint8 and img.shape == (3, 64, 64)
        for k in range(4):
            p = pixels(img, k, thr=50.0)
            own = boxes[labels == k]
            inside = np.zeros(len(p), bool)
            for x1, y1, x2, y2 in own:
                inside |= ((p[:, 0] >= x1 - TOL) & (p[:, 0] + 1 <= x2 + TOL)
                           & (p[:, 1] >= y1 - TOL) & (p[:, 1] + 1 <= y2 + TOL))
            # a box is dropped only when < 10 % of its object is left, so few strays may remain
            assert (~inside).sum() <= 0.1 * 20 * 20 * 1.3**2, (index, k, own)
            checked += len(own)
    assert checked > 12
