"""EdgeCrafter's ECDet: ECViT + adapter -> D-FINE's hybrid encoder (summing, no input
projections, SiLU AIFI) -> query selection -> D-FINE's FDR decoder.

Sizes (github:Intellindust-AI-Lab/EdgeCrafter ecdetseg/configs/ecdet/ecdet_{s,m}.yml over
ecdet.yml; both 8 heads in the encoder and decoder, 300 queries, 4 decoder layers, 3 levels x
(3, 6, 3) points, SiLU in the decoder and its MLPs, reg_max 32, reg_scale 4, 100 denoising
queries, label noise 0.5, box noise 1.0):
  s: ECViT-T (192 wide, 3 heads); encoder hidden 192, FFN 512, expansion 0.34, depth_mult 0.67;
     decoder FFN 512;
  m: ECViT-T+ (256 wide, 4 heads); encoder hidden 256, FFN 512, expansion 0.75, depth_mult 0.67;
     decoder FFN 1024.
Against D-FINE's decoder (ecdetseg/engine/edgecrafter/decoder.py ECTransformer): no Linear +
LayerNorm on the memory before query selection, a query position MLP(4, C, C, 3) computed once
from the first references, torch's default init of the decoder FFNs.
Published (EdgeCrafter README, 640 px): ECDet-S 10M params / 26 GFLOPs, ECDet-M 18M / 53.
Measured here (80 classes; tests/unit/test_ec.py): s 9,969,332 / 26.0, m 18,277,508 / 52.3
(FlopCounterMode: 2 FLOPs per multiply-add, grid_sample not counted).

Images come in [0, 1]; the captured region normalises them with ImageNet's mean and std, as
upstream's transforms do (`Normalize` after `ConvertPILImage`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..common import build_model
from ..detr.layers import MLP
from ..dfine.decoder import DecoderLayer, FDRDecoder
from ..dfine.encoder import HybridEncoder
from ..dfine.net import REG_MAX, REG_SCALE, DFINEModel
from .vit import ViTAdapter

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class Arch:
    width: int        # the ViT's and the encoder's
    vit_heads: int
    encoder_ffn: int
    expansion: float
    depth_mult: float
    ffn: int          # the decoder's
    layers: int = 4
    points: tuple[int, ...] = (3, 6, 3)
    queries: int = 300

    @property
    def hidden(self) -> int:
        return self.width


ARCHS: dict[str, Arch] = {
    "s": Arch(192, 3, 512, 0.34, 0.67, 512),
    "m": Arch(256, 4, 512, 0.75, 0.67, 1024),
}


class Encoder(nn.Module):
    """The captured region: images [B, 3, H, W] in [0, 1] -> encoder maps (strides 8, 16, 32)."""

    def __init__(self, arch: Arch):
        super().__init__()
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)
        self.backbone = ViTAdapter(arch.width, arch.vit_heads)
        self.strides = self.backbone.strides
        self.encoder = HybridEncoder((arch.width,) * 3, arch.width, arch.encoder_ffn, arch.expansion,
                                     arch.depth_mult, fuse_sum=True, input_proj=False, aifi_act=nn.SiLU,
                                     branch_conv=False)

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.encoder(self.backbone((images - self.mean) / self.std))


class ECModel(DFINEModel):
    """D-FINE's training model (query selection, denoising, FDR decoding) on ECDet's parts; the
    captured region is normalisation + ViT + adapter + hybrid encoder."""

    archs = ARCHS

    def __init__(self, size: str, num_classes: int):
        super().__init__(size, num_classes, nn.SiLU)

    def build_net(self, arch: Arch) -> nn.Module:
        return Encoder(arch)

    def build_enc_output(self, dim: int) -> nn.Module:
        return nn.Identity()

    def build_decoder(self, arch: Arch, num_classes: int, act: type[nn.Module]) -> FDRDecoder:
        def layer() -> nn.Module:
            return DecoderLayer(arch.hidden, 8, arch.ffn, arch.points, act, xavier_ffn=False)
        return FDRDecoder(arch.hidden, 8, arch.ffn, arch.layers, arch.points, num_classes, act, REG_MAX,
                          REG_SCALE, layer=layer, query_pos=MLP(4, arch.hidden, arch.hidden, 3, act=act),
                          static_query_pos=True)


def build(size: str, num_classes: int) -> ECModel:
    return build_model(ECModel, "ECDet", ARCHS, size, num_classes)
