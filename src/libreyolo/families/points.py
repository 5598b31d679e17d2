"""What the point-detection families share with the point task's evaluator: the prediction grid
and a box label's point.

The task's prediction (tasks/points.py `predicts`) has one cell per GRID_STRIDE x GRID_STRIDE
input pixels: FOMO's cut of MobileNetV2 at stride 8 (families/fomo/net.py). The data is
detection's: a box label's point is its centre, taken where the loss and the evaluator need it,
on the device (`box_centroids`).
"""

from __future__ import annotations

GRID_STRIDE = 8


def box_centroids(boxes):
    """xyxy boxes [..., 4] (a tensor) -> their centres [..., 2]: a box label's point."""
    return (boxes[..., :2] + boxes[..., 2:]) * 0.5
