"""SegFormer (Xie et al., "SegFormer: Simple and Efficient Design for Semantic Segmentation with
Transformers", NeurIPS 2021, arXiv 2105.15203): the Mix Transformer (MiT) encoder and the all-MLP
decoder, as the authors' code defines them (NVlabs/SegFormer: mmseg/models/backbones/
mix_transformer.py `mit_b0`, mmseg/models/decode_heads/segformer_head.py, local_configs/segformer/
B0/segformer.b0.512x512.ade.160k.py). Every constant below is from those files and the paper's
section 3 and Table 6 (the MiT-B0 column).

Encoder: four stages at strides 4, 8, 16, 32, each an overlapping patch embedding (a strided
conv, kernel 7 stride 4 padding 3 for the first, kernel 3 stride 2 padding 1 after; then
LayerNorm) and `depths` transformer blocks: x + DropPath(EfficientAttention(LN(x))), then
x + DropPath(MixFFN(LN(x))). Efficient self-attention shortens the keys and values by the stage's
spatial-reduction ratio R (a conv with kernel = stride = R, then LayerNorm) before ordinary
multi-head attention; Mix-FFN is Linear(C, 4C) -> 3x3 depthwise conv -> GELU -> Linear(4C, C),
the depthwise conv standing in for positional encodings. Each stage ends in a LayerNorm.
Drop-path rates rise linearly over the 8 blocks from 0 to 0.1 (torch.linspace), as published;
torchvision's StochasticDepth in "row" mode (one draw per image) is timm's DropPath.

Decoder: each stage's features through a Linear to 256 channels, upsampled (bilinear,
align_corners=False) to stride 4, concatenated (stage 4 first, as the authors' head), fused by a
1x1 conv + BatchNorm + ReLU, Dropout2d(0.1), and a 1x1 conv to the class logits at stride 4.

Tokens stay [B, N, C] through a stage; the depthwise conv and the reductions see them as a
[B, C, H, W] view without a copy (channels_last strides), so the network runs in either memory
format.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import StochasticDepth

from ..common import build_model
from ..segment import SegmentationModel

# mit_b0 in NVlabs/SegFormer mix_transformer.py; paper Table 6 (MiT-B0).
EMBED_DIMS = (32, 64, 160, 256)
DEPTHS = (2, 2, 2, 2)
HEADS = (1, 2, 5, 8)
SR_RATIOS = (8, 4, 2, 1)
MLP_RATIO = 4
DROP_PATH = 0.1
PATCH = ((7, 4), (3, 2), (3, 2), (3, 2))  # (kernel, stride) of each overlapping patch embedding
BLOCK_LN_EPS = 1e-6   # mit_b0's norm_layer=partial(nn.LayerNorm, eps=1e-6): the blocks' and stages' norms
# segformer.b0.512x512.ade.160k.py: decoder_params embed_dim 256, dropout_ratio 0.1.
DECODER_DIM = 256
DECODER_DROPOUT = 0.1
SIZES = {"b0": (EMBED_DIMS, DEPTHS, HEADS, SR_RATIOS)}


def _init_(m: nn.Module) -> None:
    """The authors' initialisation (every MiT module's `_init_weights`): Linear weights truncated
    normal std 0.02 and zero bias, LayerNorm 1 and 0, conv weights normal with std sqrt(2 / fan_out),
    fan_out = k * k * out_channels / groups, zero bias."""
    if isinstance(m, nn.Linear):
        nn.init.trunc_normal_(m.weight, std=0.02)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif isinstance(m, nn.LayerNorm):
        nn.init.ones_(m.weight)
        nn.init.zeros_(m.bias)
    elif isinstance(m, nn.Conv2d):
        fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels // m.groups
        nn.init.normal_(m.weight, 0.0, math.sqrt(2.0 / fan_out))
        if m.bias is not None:
            nn.init.zeros_(m.bias)


def _as_map(tokens: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """[B, N, C] tokens as a [B, C, h, w] map: a view (channels_last strides), no copy."""
    return tokens.transpose(1, 2).unflatten(2, (h, w))


class OverlapPatchEmbed(nn.Module):
    """Strided conv with padding k // 2 (patches overlap), then LayerNorm (torch's eps, as published)."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int):
        super().__init__()
        self.proj = nn.Conv2d(c_in, c_out, kernel, stride, kernel // 2)
        self.norm = nn.LayerNorm(c_out)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, int, int]:
        x = self.proj(x)
        h, w = x.shape[-2:]
        return self.norm(x.flatten(2).transpose(1, 2)), h, w


class EfficientAttention(nn.Module):
    """Multi-head attention whose keys and values come from the map reduced R x R (sequence
    reduction, paper eq. 2): cost N^2 / R^2 instead of N^2. q and kv carry biases (qkv_bias=True)."""

    def __init__(self, dim: int, heads: int, sr_ratio: int):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.proj = nn.Linear(dim, dim)
        self.sr_ratio = sr_ratio
        if sr_ratio > 1:
            self.sr = nn.Conv2d(dim, dim, sr_ratio, sr_ratio)
            self.norm = nn.LayerNorm(dim)  # torch's eps here, as the authors' Attention

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        b, n, c = x.shape
        q = self.q(x).unflatten(2, (self.heads, -1)).transpose(1, 2)  # [B, heads, N, d]
        kv = x if self.sr_ratio == 1 else self.norm(self.sr(_as_map(x, h, w)).flatten(2).transpose(1, 2))
        k, v = self.kv(kv).unflatten(2, (2, self.heads, -1)).permute(2, 0, 3, 1, 4)  # [B, heads, M, d] each
        out = F.scaled_dot_product_attention(q, k, v)  # scale d^-0.5, as the authors' qk_scale=None
        return self.proj(out.transpose(1, 2).reshape(b, n, c))


class MixFFN(nn.Module):
    """Linear -> 3x3 depthwise conv (with bias) -> GELU -> Linear (paper eq. 3)."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.dwconv = nn.Conv2d(hidden, hidden, 3, 1, 1, groups=hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        x = self.dwconv(_as_map(self.fc1(x), h, w)).flatten(2).transpose(1, 2)
        return self.fc2(self.act(x))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, sr_ratio: int, drop_path: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=BLOCK_LN_EPS)
        self.attn = EfficientAttention(dim, heads, sr_ratio)
        self.norm2 = nn.LayerNorm(dim, eps=BLOCK_LN_EPS)
        self.mlp = MixFFN(dim, dim * MLP_RATIO)
        self.drop_path = StochasticDepth(drop_path, "row")

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x), h, w))
        return x + self.drop_path(self.mlp(self.norm2(x), h, w))


class Stage(nn.Module):
    def __init__(self, c_in: int, dim: int, patch: tuple[int, int], depth: int, heads: int, sr_ratio: int,
                 drop_paths: list[float]):
        super().__init__()
        self.embed = OverlapPatchEmbed(c_in, dim, *patch)
        self.blocks = nn.ModuleList(Block(dim, heads, sr_ratio, p) for p in drop_paths[:depth])
        self.norm = nn.LayerNorm(dim, eps=BLOCK_LN_EPS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, h, w = self.embed(x)
        for block in self.blocks:
            x = block(x, h, w)
        return _as_map(self.norm(x), h, w)


class MixTransformer(nn.Module):
    """The MiT encoder: images -> four maps at strides 4, 8, 16, 32."""

    def __init__(self, dims, depths, heads, sr_ratios, drop_path: float = DROP_PATH):
        super().__init__()
        rates = torch.linspace(0, drop_path, sum(depths)).tolist()  # the authors' stochastic-depth rule
        starts = [sum(depths[:i]) for i in range(len(depths))]
        self.stages = nn.ModuleList(
            Stage(3 if i == 0 else dims[i - 1], dims[i], PATCH[i], depths[i], heads[i], sr_ratios[i],
                  rates[starts[i]:starts[i] + depths[i]]) for i in range(len(dims)))
        self.apply(_init_)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        out = []
        for stage in self.stages:
            x = stage(x)
            out.append(x)
        return out


class AllMLPDecoder(nn.Module):
    """Per-stage Linear to `dim`, upsample to stride 4, concat (deepest first), 1x1 conv + BN + ReLU,
    Dropout2d, 1x1 conv to the classes (NVlabs segformer_head.py). Torch's default initialisation
    for the Linears and the classifier, mmcv ConvModule's for the fuse conv (Kaiming normal,
    fan_out, ReLU)."""

    def __init__(self, in_dims, num_classes: int, dim: int = DECODER_DIM, dropout: float = DECODER_DROPOUT):
        super().__init__()
        self.linears = nn.ModuleList(nn.Linear(c, dim) for c in in_dims)
        self.fuse = nn.Conv2d(dim * len(in_dims), dim, 1, bias=False)
        nn.init.kaiming_normal_(self.fuse.weight, mode="fan_out", nonlinearity="relu")
        self.bn = nn.BatchNorm2d(dim)  # torch's eps 1e-5 and momentum 0.1, as the recipe's SyncBN (mmcv)
        self.act = nn.ReLU(inplace=True)
        self.dropout = nn.Dropout2d(dropout)
        self.pred = nn.Conv2d(dim, num_classes, 1)

    def forward(self, feats: list[torch.Tensor]) -> torch.Tensor:
        size = feats[0].shape[-2:]
        maps = []
        for linear, f in zip(self.linears, feats):
            x = _as_map(linear(f.flatten(2).transpose(1, 2)), *f.shape[-2:])
            maps.append(x if x.shape[-2:] == size else F.interpolate(x, size=size, mode="bilinear", align_corners=False))
        x = self.act(self.bn(self.fuse(torch.cat(maps[::-1], dim=1))))
        return self.pred(self.dropout(x))


class SegFormerNet(nn.Module):
    """Normalised images [B, 3, S, S] -> logits [B, classes, S / 4, S / 4]."""

    def __init__(self, size: str, num_classes: int):
        super().__init__()
        dims, depths, heads, sr_ratios = SIZES[size]
        self.encoder = MixTransformer(dims, depths, heads, sr_ratios)
        self.decoder = AllMLPDecoder(dims, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.encoder(x))


class SegFormer(SegmentationModel):
    """The training model: SegFormerNet behind the input normalisation (families/segment.py)."""

    # What engine/graphs.py says once at capture (families/base.py, `graph_note`).
    graph_note = ("SegFormer's drop-path (and the decoder's Dropout2d) draw random numbers inside the captured "
                  "graph: each replay draws its own stream, so graphed training equals eager statistically, "
                  "not bitwise")

    def __init__(self, size: str, num_classes: int):
        super().__init__(SegFormerNet(size, num_classes), num_classes)

    @property
    def backbone(self) -> nn.Module:
        """The MiT encoder: FamilySpec.backbone, trained at backbone_lr x lr0."""
        return self.net.net.encoder


def build(size: str, num_classes: int) -> SegFormer:
    return build_model(SegFormer, "SegFormer", SIZES, size, num_classes)
