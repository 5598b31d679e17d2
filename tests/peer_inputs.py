"""Inputs of the recorded peer loss comparison (tests/fixtures/peer/loss.json), from fixed seeds.

Shared by benchmarks/peer_compare.py (which records the peer's numbers) and the tests (which
recompute ours), so the fixture holds only numbers, never tensors: raw YOLOv9-t head maps for a
batch of 2 at 128 px with 10 classes ([2, 64 + 10, 16|8|4, 16|8|4], box bins first), and padded
targets with overlapping boxes; case "mixed" adds boxes with a side under 16 px.
"""

from __future__ import annotations

import torch

from libreyolo.families.base import Targets

IMGSZ = 128
NC = 10
REG_MAX = 16
STRIDES = (8, 16, 32)

# xyxy pixels, class id
BOXES = {
    "large": [
        [([10, 10, 60, 50], 0), ([30, 20, 90, 70], 0), ([70, 70, 120, 124], 3), ([5, 80, 40, 120], 5)],
        [([20, 30, 100, 110], 1), ([40, 40, 80, 80], 2), ([90, 5, 126, 40], 1)],
    ],
    "mixed": [
        [([10, 10, 60, 50], 0), ([30, 20, 90, 70], 4), ([100, 10, 106, 16], 7), ([50, 100, 60, 108], 7),
         ([20, 90, 33, 103], 9)],
        [([20, 30, 100, 110], 1), ([40, 40, 80, 80], 1), ([110, 110, 115, 114], 6), ([64, 4, 76, 12], 8)],
    ],
    # only boxes under 16 px, with predictions of about their size (see make_preds)
    "small": [
        [([100, 10, 106, 16], 7), ([50, 100, 60, 108], 7), ([20, 90, 33, 103], 9), ([41, 41, 47, 46], 2)],
        [([110, 110, 115, 114], 6), ([64, 4, 76, 12], 8), ([30, 60, 39, 69], 3)],
    ],
}
CASES = tuple(BOXES)
SEEDS = {"large": 11, "mixed": 12, "small": 13}


def make_preds(case: str) -> tuple[torch.Tensor, ...]:
    """Raw head maps of one case: box logits ~ 2 N(0, 1), class logits ~ N(0, 1) - 2; in case
    "small" the box logits are 0.5 N(0, 1) + 6 at bin 1 (each side about one cell: 16 px boxes
    at stride 8), so boxes under 16 px overlap the predictions of the anchors around them."""
    g = torch.Generator().manual_seed(SEEDS[case])
    out = []
    for s in STRIDES:
        n = IMGSZ // s
        box = torch.randn(2, 4 * REG_MAX, n, n, generator=g) * 2.0
        if case == "small":
            box = box.view(2, 4, REG_MAX, n, n) * 0.25
            box[:, :, 1] += 6.0
            box = box.view(2, 4 * REG_MAX, n, n)
        cls = torch.randn(2, NC, n, n, generator=g) - 2.0
        out.append(torch.cat((box, cls), 1))
    return tuple(out)


def make_targets(case: str) -> Targets:
    rows = BOXES[case]
    m = 8
    boxes = torch.zeros(len(rows), m, 4)
    labels = torch.zeros(len(rows), m, dtype=torch.int64)
    valid = torch.zeros(len(rows), m, dtype=torch.bool)
    for b, image in enumerate(rows):
        for j, (box, c) in enumerate(image):
            boxes[b, j] = torch.tensor(box, dtype=torch.float32)
            labels[b, j] = c
            valid[b, j] = True
    return Targets(boxes, labels, valid)


def unrle(pairs: list[list[float]]) -> list[float]:
    """[[value, count], ...] (benchmarks/peer_compare.py `rle`) -> the full list."""
    return [v for v, n in pairs for _ in range(int(n))]
