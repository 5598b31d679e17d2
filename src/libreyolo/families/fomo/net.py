"""FOMO (Edge Impulse's "Faster Objects, More Objects"): MobileNetV2 cut at stride 8, then a
1x1-convolution classifier applied to every cell.

Every constant is Edge Impulse's, from its FOMO docs (docs.edgeimpulse.com, Studio > learning
blocks > object detection > FOMO: "MobileNet cut point", "FOMO classifier capacity") and the FOMO
training script Studio's expert mode shows (`build_model`):
- the trunk is MobileNetV2 (Sandler et al., 2018, arXiv 1801.04381) at alpha 0.35, cut at Keras'
  layer `block_6_expand_relu`: the expansion 1x1 conv + BatchNorm + ReLU6 of the first block of
  the 64-channel stage, the last layer before its stride-2 depthwise conv, so the output is 1/8 of
  the input (96 x 96 -> 12 x 12) with 6 x 16 = 96 channels;
- the head: Conv2D(32, 1x1, ReLU) named `head`, then Conv2D(1 + classes, 1x1) named `logits`
  (background first; softmax at inference, the "explicit softmax layer before export");
- BatchNorm momentum 0.9 in Keras' convention ("Default batch norm is configured for huge
  networks, let's speed it up"), torch's 0.1, and Keras' epsilon 1e-3.

The trunk is torchvision's `mobilenet_v2(width_mult=0.35).features`. Its channel rounding is
Keras': both apply `_make_divisible(c * alpha, 8)` (Keras to `int(c * alpha)` inside the blocks),
giving 16, 8, 8, 16 channels for the stem and the 16-, 24- and 32-channel stages, and 96 at the
cut, the figure of Edge Impulse's layer table. Where they differ: Keras pads stride-2 convolutions
on the bottom and right only (`correct_pad`, TF 'same'), torchvision on every side, which shifts
each stride-2 layer's sampling grid by half an input pixel (no parameter changes); and
torchvision initialises the trunk with Kaiming-normal weights where Edge Impulse starts from its
own ImageNet-pretrained alpha-0.35 weights (we train from scratch).

Input: RGB in [0, 1], the scaling Edge Impulse's image block hands the network (`features =
np.asarray(im) / 255.0`, github:edgeimpulse/processing-blocks image/dsp.py) and what the step
hands every model; no mean/std normalisation.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import nn

from ..common import YOLOStyleModel, build_model
from ..points import GRID_STRIDE

WIDTHS = {"035": 0.35}
HEAD_CHANNELS = 32
BN_EPS = 1e-3       # Keras BatchNormalization in MobileNetV2
BN_MOMENTUM = 0.1   # Keras momentum 0.9 (the running statistics keep 0.9 of themselves per step)
# The logit biases start at a prior, as Edge Impulse's `set_classifier_biases_from_dataset` sets
# them to logit(class frequency) of the training cells (first batches, Laplace-smoothed); a model
# is built before it sees data, so the prior is fixed: OBJECTS object cells of the 12 x 12 cells of
# the family's 96 px input, shared evenly by the classes, and background the rest.
OBJECTS = 5.0
PRIOR_CELLS = (96 // GRID_STRIDE) ** 2


def trunk(width: float) -> nn.Sequential:
    """MobileNetV2's layers up to `block_6_expand_relu` (module docstring)."""
    import torchvision

    norm = functools.partial(nn.BatchNorm2d, eps=BN_EPS, momentum=BN_MOMENTUM)
    features = torchvision.models.mobilenet_v2(weights=None, width_mult=width, norm_layer=norm).features
    # features[7] is the first inverted residual of the 64-channel stage; conv[0] its expansion.
    return nn.Sequential(*features[:7], features[7].conv[0])


class FOMONet(nn.Module):
    """images [B, 3, S, S] in [0, 1] -> (logits [B, 1 + classes, S/8, S/8],)."""

    def __init__(self, width: float, num_classes: int):
        super().__init__()
        self.trunk = trunk(width)
        self.head = nn.Sequential(nn.Conv2d(self.trunk[-1].out_channels, HEAD_CHANNELS, 1), nn.ReLU(inplace=True))
        self.logits = nn.Conv2d(HEAD_CHANNELS, num_classes + 1, 1)
        with torch.no_grad():
            for conv in (self.head[0], self.logits):  # Keras Conv2D: glorot_uniform kernels, zero biases
                nn.init.xavier_uniform_(conv.weight)
                conv.bias.zero_()
            q = OBJECTS / PRIOR_CELLS
            self.logits.bias[0] = math.log((1 - q) / q)
            self.logits.bias[1:] = math.log((q / num_classes) / (1 - q / num_classes))

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.logits(self.head(self.trunk(images))),)


class FOMO(YOLOStyleModel):
    """Training model (families/base.py contract): the whole network is the capturable region, and
    `predict` is the per-cell softmax, the point task's map (tasks/points.py)."""

    strides = (GRID_STRIDE,)

    def __init__(self, size: str, num_classes: int):
        super().__init__()
        self.net = FOMONet(WIDTHS[size], num_classes)
        self.num_classes = int(num_classes)

    def decode(self, raw: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """[B, 1 + classes, S/8, S/8] probabilities, background first."""
        return raw[0].float().softmax(dim=1)


def build(size: str, num_classes: int) -> FOMO:
    return build_model(FOMO, "FOMO", WIDTHS, size, num_classes)
