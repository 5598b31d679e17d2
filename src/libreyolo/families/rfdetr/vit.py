"""RF-DETR's backbone: a DINOv2 ViT-S with windowed attention, and LW-DETR's projector to one map.

Facts from github:roboflow/rf-detr (Apache-2.0), rfdetr/models/backbone/{dinov2.py,
dinov2_with_windowed_attn.py, dinov2_configs/dinov2_small.json, backbone.py, projector.py} and
rfdetr/config.py (encoder `dinov2_windowed_small`: no register tokens):
- ViT-S: width 384, 6 heads, 12 pre-norm blocks (LayerNorm eps 1e-6, q/k/v with bias, exact-GELU
  MLP of ratio 4, LayerScale initialised to 1, no drop-path), one class token, learned absolute
  positions for a `pos_grid` x `pos_grid` patch grid (+1 for the class token), resized bicubically
  (antialiased, in float32) when the input's grid differs; patch embedding a stride-`patch` conv.
- Windows: the patch grid is cut into `windows` x `windows` windows, each with its own copy of the
  class token; the blocks attend inside their window, except blocks 3, 6 and 9 (0-based), which
  attend over every window of the image at once (the class token copies included): upstream's
  window blocks are range(13) minus out_feature_indexes [3, 6, 9, 12], and block i runs full
  attention when i is not one of them; stage i is the output of block i - 1, so each full block
  follows an output.
- The outputs of blocks 2, 5, 8, 11 (stages 3, 6, 9, 12) go through the final LayerNorm, lose
  their class tokens and are laid back out as maps of stride `patch`.
- Init (the HF DINOv2 `_init_weights`): linear and conv weights, the positions and the class token
  truncated normal std 0.02, biases zero.
Upstream also holds DINOv2's `mask_token` (masked-image pretraining only, never read when
detecting); it is left out here, so every parameter trains (DDP without find_unused_parameters).
- Projector (P4 only, `projector_scale: ["P4"]`, layer_norm True): the four maps concatenated
  (4 x 384 channels) -> LW-DETR's C2f (1x1 conv to 2 x 128, three bottlenecks of two 3x3 convs
  without shortcut, 1x1 conv of the five 128-channel parts to 256), every conv without bias and
  followed by a channel LayerNorm (eps 1e-6) and SiLU, then a channel LayerNorm: one 256-channel
  map of stride 16.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

WIDTH, HEADS, DEPTH, MLP_RATIO = 384, 6, 12, 4
NORM_EPS, INIT_STD = 1e-6, 0.02
OUT_BLOCKS = (2, 5, 8, 11)  # out_feature_indexes [3, 6, 9, 12] (stage i = after block i - 1)
FULL_BLOCKS = (3, 6, 9)     # out_feature_indexes below the depth: not window blocks


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)   # upstream's query, key, value, fused
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(b, n, c))


class Block(nn.Module):
    """Pre-norm DINOv2 block with LayerScale; `full` attends over every window of an image."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=NORM_EPS)
        self.attn = Attention(dim, heads)
        self.ls1 = nn.Parameter(torch.ones(dim))
        self.norm2 = nn.LayerNorm(dim, eps=NORM_EPS)
        self.fc1, self.act, self.fc2 = nn.Linear(dim, MLP_RATIO * dim), nn.GELU(), nn.Linear(MLP_RATIO * dim, dim)
        self.ls2 = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor, images: int, full: bool) -> Tensor:
        """x [images * windows^2, tokens, C]: one row per window."""
        y = self.norm1(x)
        if full:  # the image's windows side by side: one sequence per image
            y = self.attn(y.reshape(images, -1, y.shape[-1])).view_as(x)
        else:
            y = self.attn(y)
        x = x + self.ls1 * y
        return x + self.ls2 * self.fc2(self.act(self.fc1(self.norm2(x))))


class WindowedDINOv2(nn.Module):
    """ImageNet-normalised images [B, 3, H, W] (H, W multiples of patch x windows) -> the four
    normed block outputs of `OUT_BLOCKS`, each [B, 384, H / patch, W / patch]."""

    def __init__(self, patch: int, windows: int, pos_grid: int):
        super().__init__()
        self.patch, self.windows, self.pos_grid = patch, windows, pos_grid
        self.patch_embed = nn.Conv2d(3, WIDTH, patch, patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, WIDTH))
        self.pos_embed = nn.Parameter(torch.zeros(1, pos_grid * pos_grid + 1, WIDTH))
        self.blocks = nn.ModuleList(Block(WIDTH, HEADS) for _ in range(DEPTH))
        self.norm = nn.LayerNorm(WIDTH, eps=NORM_EPS)
        self.full = frozenset(FULL_BLOCKS) if windows > 1 else frozenset()
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Conv2d)):
                nn.init.trunc_normal_(m.weight, std=INIT_STD)
                nn.init.zeros_(m.bias)
        nn.init.trunc_normal_(self.pos_embed, std=INIT_STD)
        nn.init.trunc_normal_(self.cls_token, std=INIT_STD)

    def positions(self, h: int, w: int) -> Tensor:
        """[1, 1 + h * w, C]: the class token's position, then the patch grid's, resized to h x w."""
        if (h, w) == (self.pos_grid, self.pos_grid):
            return self.pos_embed
        grid = self.pos_embed[:, 1:].reshape(1, self.pos_grid, self.pos_grid, -1).permute(0, 3, 1, 2)
        grid = F.interpolate(grid.float(), size=(h, w), mode="bicubic", align_corners=False, antialias=True)
        grid = grid.to(self.pos_embed.dtype).flatten(2).transpose(1, 2)
        return torch.cat((self.pos_embed[:, :1], grid), 1)

    def forward(self, x: Tensor) -> list[Tensor]:
        b = x.shape[0]
        x = self.patch_embed(x)
        c, h, w = x.shape[1:]
        n = self.windows
        if h % n or w % n:
            raise ValueError(f"RF-DETR's ViT needs a patch grid divisible by its {n} windows, got {h} x {w} "
                             f"(the input's sides must be multiples of {self.patch * n})")
        pos = self.positions(h, w)
        x = x.flatten(2).transpose(1, 2) + pos[:, 1:]
        # [B, h, w, C] -> one row per window (image-major, then window row, window column)
        x = x.view(b, n, h // n, n, w // n, c).permute(0, 1, 3, 2, 4, 5).reshape(b * n * n, -1, c)
        x = torch.cat(((self.cls_token + pos[:, :1]).expand(b * n * n, -1, -1), x), 1)
        outs = []
        for i, block in enumerate(self.blocks):
            x = block(x, b, i in self.full)
            if i in OUT_BLOCKS:
                t = self.norm(x)[:, 1:].reshape(b, n, n, h // n, w // n, c)
                outs.append(t.permute(0, 5, 1, 3, 2, 4).reshape(b, c, h, w))
        return outs


class LayerNorm2d(nn.Module):
    """LayerNorm over the channels of an NCHW map (eps 1e-6, projector.py's LayerNorm)."""

    def __init__(self, c: int):
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.ones(c)), nn.Parameter(torch.zeros(c))

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x.permute(0, 2, 3, 1), self.weight.shape, self.weight, self.bias, NORM_EPS).permute(0, 3, 1, 2)


class ConvLN(nn.Module):
    """Conv (no bias) -> channel LayerNorm -> SiLU (projector.py ConvX with layer_norm, act silu)."""

    def __init__(self, c_in: int, c_out: int, k: int):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, k, 1, k // 2, bias=False)
        self.norm = LayerNorm2d(c_out)
        self.act = nn.SiLU()

    def forward(self, x: Tensor) -> Tensor:
        return self.act(self.norm(self.conv(x)))


class C2f(nn.Module):
    """LW-DETR's C2f: split in two, `n` bottlenecks (two 3x3 ConvLN, no shortcut) on the second
    half, each output kept, all concatenated, 1x1 to c_out."""

    def __init__(self, c_in: int, c_out: int, n: int = 3):
        super().__init__()
        self.c = c_out // 2
        self.cv1 = ConvLN(c_in, 2 * self.c, 1)
        self.m = nn.ModuleList(nn.Sequential(ConvLN(self.c, self.c, 3), ConvLN(self.c, self.c, 3)) for _ in range(n))
        self.cv2 = ConvLN((2 + n) * self.c, c_out, 1)

    def forward(self, x: Tensor) -> Tensor:
        y = list(self.cv1(x).split(self.c, 1))
        for m in self.m:
            y.append(m(y[-1]))
        return self.cv2(torch.cat(y, 1))


class Projector(nn.Module):
    """The ViT's four maps -> one map of `dim` channels at the same stride (P4)."""

    def __init__(self, c_in: int, levels: int, dim: int):
        super().__init__()
        self.c2f = C2f(c_in * levels, dim)
        self.norm = LayerNorm2d(dim)

    def forward(self, feats: list[Tensor]) -> Tensor:
        return self.norm(self.c2f(torch.cat(feats, 1)))
