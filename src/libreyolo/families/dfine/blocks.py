"""Conv blocks of D-FINE's backbone (HGNetv2) and hybrid encoder, with their deploy folds.

Upstream (github:Peterande/D-FINE src/nn/backbone/hgnetv2.py, src/zoo/dfine/hybrid_encoder.py)
builds every conv as conv (no bias) -> BatchNorm (torch defaults: eps 1e-5, momentum 0.1) ->
activation; HGNetv2 adds a "learnable affine block" (one scalar scale and bias, `use_lab: True`
in every D-FINE config) after each activated conv. `ConvNorm` is `common.ConvBNAct` with those
norms, any activation and any padding, so `fuse_()` is the shared one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..common import ConvBNAct


class LearnableAffine(nn.Module):
    """y = a * x + b with scalar a (init 1) and b (init 0): HGNetv2's `use_lab` block. It gives
    each ReLU output a trainable gain/offset without a BatchNorm's per-channel cost."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale + self.bias


class ConvNorm(ConvBNAct):
    """conv -> BatchNorm(eps 1e-5, momentum 0.1) -> `act` (a module, or None for none).

    `pad` defaults to (k - 1) // 2 as upstream; HGNetv2's 2x2 stem convs use 0 (they pad the
    input by one on the right/bottom instead)."""

    def __init__(self, c_in: int, c_out: int, k: int = 1, s: int = 1, g: int = 1,
                 act: nn.Module | None = None, pad: int | None = None):
        super().__init__(c_in, c_out, k, s, g, act=False)
        p = (k - 1) // 2 if pad is None else pad
        self.conv.padding = (p, p)
        self.bn = nn.BatchNorm2d(c_out)
        self.act = nn.Identity() if act is None else act


def hg_conv(c_in: int, c_out: int, k: int = 1, s: int = 1, g: int = 1, act: bool = True,
            pad: int | None = None) -> ConvNorm:
    """HGNetv2's conv: ReLU then the learnable affine where activated (upstream ConvBNAct)."""
    return ConvNorm(c_in, c_out, k, s, g, nn.Sequential(nn.ReLU(), LearnableAffine()) if act else None, pad)


class RepConv(nn.Module):
    """RepVGG block of the encoder (upstream VGGBlock): SiLU(BN(conv3x3) + BN(conv1x1)), folded
    by `fuse_()` into one biased 3x3 conv (the 1x1 kernel padded to 3x3)."""

    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.conv3 = ConvNorm(c_in, c_out, 3)
        self.conv1 = ConvNorm(c_in, c_out, 1)
        self.fused: nn.Conv2d | None = None
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fused(x) if self.fused is not None else self.conv3(x) + self.conv1(x))

    @torch.no_grad()
    def fuse_(self) -> None:
        if self.fused is not None:
            return
        self.conv3.fuse_()  # each branch folds its own BN first (a no-op if already done)
        self.conv1.fuse_()
        c3, c1 = self.conv3.conv, self.conv1.conv
        conv = nn.Conv2d(c3.in_channels, c3.out_channels, 3, 1, 1, bias=True).to(c3.weight)  # device and dtype
        conv.weight.copy_(c3.weight + F.pad(c1.weight, (1, 1, 1, 1)))
        conv.bias.copy_(c3.bias + c1.bias)
        self.fused = conv
        del self.conv3, self.conv1
