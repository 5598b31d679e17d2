"""Transformer layers shared by RT-DETR v1/v2 and D-FINE, in plain PyTorch (no custom CUDA op).

Facts (constants, inits, layouts) from rtdetrv2_pytorch/src/zoo/rtdetr/{hybrid_encoder.py,
rtdetr_decoder.py, rtdetrv2_decoder.py, utils.py} and rtdetr_pytorch/src/zoo/rtdetr/rtdetr_decoder.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn import init


class MLP(nn.Module):
    """`layers` Linear layers with ReLU between them (DETR's box head / query_pos_head)."""

    def __init__(self, c_in: int, hidden: int, c_out: int, layers: int, act: type[nn.Module] = nn.ReLU):
        super().__init__()
        dims = [c_in] + [hidden] * (layers - 1)
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims, dims[1:] + [c_out]))
        self.act = act()

    def forward(self, x: Tensor) -> Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x) if i == len(self.layers) - 1 else self.act(layer(x))
        return x


def sincos_pos_embed_2d(h: int, w: int, dim: int = 256, temperature: float = 10000.0,
                        device: torch.device | None = None, dtype: torch.dtype = torch.float32) -> Tensor:
    """[1, h * w, dim] fixed 2D sine-cosine embedding for row-major tokens (AIFI, RT-DETR).

    Upstream (HybridEncoder.build_2d_sincos_position_embedding, temperature 10000) concatenates
    [sin(x w), cos(x w), sin(y w), cos(y w)], w_k = 1 / T^(k / (dim / 4)). Its meshgrid is
    x-major while the tokens are row-major, which hands a square map the transposed positions
    and a rectangular one mismatched ones; here token (y, x) gets the embedding of (x, y)."""
    if dim % 4:
        raise ValueError("the 2D sin-cos position embedding needs dim divisible by 4")
    quarter = dim // 4
    omega = 1.0 / temperature ** (torch.arange(quarter, device=device, dtype=torch.float32) / quarter)
    ys, xs = torch.meshgrid(torch.arange(h, device=device, dtype=torch.float32),
                            torch.arange(w, device=device, dtype=torch.float32), indexing="ij")
    ox = xs.reshape(-1, 1) * omega
    oy = ys.reshape(-1, 1) * omega
    return torch.cat((ox.sin(), ox.cos(), oy.sin(), oy.cos()), 1).unsqueeze(0).to(dtype)


class EncoderLayer(nn.Module):
    """AIFI's transformer layer (post-norm): self-attention with the position embedding added to
    queries and keys, then a GELU FFN. RT-DETR r18: 8 heads, FFN 1024, dropout 0, enc_act gelu
    (configs/rtdetrv2/include/rtdetrv2_r50vd.yml HybridEncoder); EdgeCrafter's is SiLU (`act`)."""

    def __init__(self, dim: int = 256, heads: int = 8, ffn: int = 1024, dropout: float = 0.0,
                 act: type[nn.Module] = nn.GELU):
        super().__init__()
        self.self_attn = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.linear1, self.linear2 = nn.Linear(dim, ffn), nn.Linear(ffn, dim)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.drop, self.drop1, self.drop2 = nn.Dropout(dropout), nn.Dropout(dropout), nn.Dropout(dropout)
        self.act = act()

    def forward(self, x: Tensor, pos: Tensor | None = None) -> Tensor:
        q = x if pos is None else x + pos
        x = self.norm1(x + self.drop1(self.self_attn(q, q, x, need_weights=False)[0]))
        return self.norm2(x + self.drop2(self.linear2(self.drop(self.act(self.linear1(x))))))


class HybridEncoder(nn.Module):
    """The hybrid encoder's data flow, shared by RT-DETR and D-FINE (their blocks differ): input
    projections, AIFI (one transformer layer with the 2D sin-cos position) on the coarsest map,
    then CCFF: a top-down FPN (lateral conv, nearest 2x upsampling, fusion block) and a bottom-up
    PAN (downsampling conv, fusion block). Subclasses set `input_proj`, `aifi`, `lateral`, `fpn`,
    `down` and `pan` (one entry per level, per level pair for the last four). The two maps a
    fusion block takes are concatenated, or added where `fuse_sum` is set (DEIM's `fuse_op: sum`,
    which DEIMv2 uses: the fusion blocks then take `hidden` channels, not 2 x `hidden`)."""

    input_proj: nn.ModuleList
    aifi: nn.Module
    lateral: nn.ModuleList
    fpn: nn.ModuleList
    down: nn.ModuleList
    pan: nn.ModuleList
    fuse_sum = False

    def fuse(self, a: Tensor, b: Tensor) -> Tensor:
        return a + b if self.fuse_sum else torch.cat((a, b), 1)

    def forward(self, feats: Sequence[Tensor]) -> tuple[Tensor, ...]:
        x = [proj(f) for proj, f in zip(self.input_proj, feats)]
        b, c, h, w = x[-1].shape
        tokens = x[-1].flatten(2).transpose(1, 2)
        pos = sincos_pos_embed_2d(h, w, c, device=tokens.device, dtype=tokens.dtype)
        x[-1] = self.aifi(tokens, pos).transpose(1, 2).reshape(b, c, h, w)
        # top-down: inner[0] is the finest so far; the lateral conv also replaces the coarser map
        inner = [x[-1]]
        for j, i in enumerate(range(len(x) - 1, 0, -1)):
            high = self.lateral[j](inner[0])
            inner[0] = high
            up = F.interpolate(high, scale_factor=2.0, mode="nearest")
            inner.insert(0, self.fpn[j](self.fuse(up, x[i - 1])))
        outs = [inner[0]]
        for j in range(len(x) - 1):
            outs.append(self.pan[j](self.fuse(self.down[j](outs[-1]), inner[j + 1])))
        return tuple(outs)


class MSDeformableAttention(nn.Module):
    """Multi-scale deformable attention (Deformable DETR, Zhu et al., 2021) via `F.grid_sample`.

    `points` an int: RT-DETR v1's form, the same count on every level; a sequence: RT-DETRv2's
    per-level counts. For equal counts both are the same computation (v1 lays its offsets out
    [heads, levels, points, 2], v2 [heads, sum(points), 2] level-major: the same memory order,
    and both softmax over all of a head's points), so one class serves both.
    Boxes as references (last dim 4): location = centre + offset / n_points_of_level * wh * 0.5
    (offset_scale 0.5); points as references (last dim 2): location = point + offset / (w, h).
    `method` (RT-DETRv2 cross_attn_method): "default" samples bilinearly (grid_sample, zeros
    outside, align_corners False); "discrete" reads one cell, index floor(loc * size + 0.5)
    clamped into the map, as upstream: the nearest cell when cell i sits at i / size (corner
    convention, half a cell from grid_sample's centres). No grad reaches the locations, so upstream freezes
    `sampling_offsets`; upstream clamps x as well as y to h - 1, a bug on non-square maps that
    this clamps per axis instead).
    Init as upstream: offsets' weight 0, bias = head direction (cos, sin) scaled to the unit
    square's border times the point number 1..n; attention weights 0 (uniform softmax);
    value/output projections xavier-uniform with zero bias.
    """

    def __init__(self, dim: int = 256, heads: int = 8, levels: int = 3, points: int | Sequence[int] = 4,
                 method: str = "default", offset_scale: float = 0.5):
        super().__init__()
        if method not in ("default", "discrete"):
            raise ValueError(f"method must be default or discrete, got {method!r}")
        self.points = [points] * levels if isinstance(points, int) else list(points)
        if len(self.points) != levels:
            raise ValueError("one point count per level")
        self.dim, self.heads, self.levels, self.method = dim, heads, levels, method
        self.head_dim = dim // heads
        self.offset_scale = offset_scale
        total = sum(self.points)
        # Per point: 1 / its level's point count, and its level (buffers: no host->device copy in
        # forward; a CPU->CUDA torch.tensor would synchronise the stream every step).
        self.register_buffer("point_scale", torch.tensor([1.0 / n for n in self.points for _ in range(n)]),
                             persistent=False)
        self.register_buffer("point_level", torch.tensor([lv for lv, n in enumerate(self.points) for _ in range(n)]),
                             persistent=False)
        self.sampling_offsets = nn.Linear(dim, heads * total * 2)
        self.attention_weights = nn.Linear(dim, heads * total)
        self.value_proj, self.output_proj = nn.Linear(dim, dim), nn.Linear(dim, dim)
        self._reset_parameters()
        if method == "discrete":
            self.sampling_offsets.requires_grad_(False)

    @torch.no_grad()
    def _reset_parameters(self) -> None:
        init.zeros_(self.sampling_offsets.weight)
        theta = torch.arange(self.heads, dtype=torch.float32) * (2.0 * math.pi / self.heads)
        direction = torch.stack((theta.cos(), theta.sin()), -1)
        direction = direction / direction.abs().amax(-1, keepdim=True)
        scale = torch.cat([torch.arange(1, n + 1, dtype=torch.float32) for n in self.points])
        self.sampling_offsets.bias.copy_((direction[:, None, :] * scale[None, :, None]).flatten())
        init.zeros_(self.attention_weights.weight)
        init.zeros_(self.attention_weights.bias)
        for lin in (self.value_proj, self.output_proj):
            init.xavier_uniform_(lin.weight)
            init.zeros_(lin.bias)

    def forward(self, query: Tensor, ref: Tensor, value: Tensor, shapes: Sequence[tuple[int, int]],
                value_mask: Tensor | None = None) -> Tensor:
        """query [B, Lq, C]; ref [B, Lq, 1 or levels, 4] cxcywh or [B, Lq, levels, 2] points, in
        [0, 1]; value [B, Lv, C] (levels flattened row-major, in order); shapes [(h, w)] per
        level -> [B, Lq, C]."""
        b, lq, _ = query.shape
        total = sum(self.points)
        value = self.value_proj(value)
        if value_mask is not None:
            value = value * value_mask.to(value.dtype).unsqueeze(-1)
        off = self.sampling_offsets(query).view(b, lq, self.heads, total, 2)
        attn = self.attention_weights(query).view(b, lq, self.heads, total).softmax(-1)
        if ref.shape[-1] == 4:
            ref = self._per_point(ref)  # [B, Lq, 1, 1 or total, 4]
            loc = ref[..., :2] + off * self.point_scale.to(off.dtype)[:, None] * ref[..., 2:] * self.offset_scale
        elif ref.shape[-1] == 2:  # offsets in cells of their level: / (w, h)
            off = torch.cat([torch.cat((o[..., :1] / w, o[..., 1:] / h), -1)
                             for (h, w), o in zip(shapes, off.split(self.points, 3))], 3)
            loc = self._per_point(ref) + off
        else:
            raise ValueError("reference points end in 4 (boxes) or 2 (points)")
        out = self._sample(value, shapes, loc, attn)
        return self.output_proj(out)

    def _per_point(self, ref: Tensor) -> Tensor:
        """[B, Lq, 1 or levels, k] -> [B, Lq, 1 (heads), 1 or sum(points), k]: each point gets its
        level's ref."""
        if ref.shape[2] == 1:
            return ref.unsqueeze(2)
        return ref.index_select(2, self.point_level).unsqueeze(2)

    def _sample(self, value: Tensor, shapes: Sequence[tuple[int, int]], loc: Tensor, attn: Tensor) -> Tensor:
        """value [B, Lv, C], loc [B, Lq, H, P, 2] in [0, 1], attn [B, Lq, H, P] -> [B, Lq, C]."""
        b, lq, heads, total, _ = loc.shape
        hd = self.head_dim
        # [B, Lv, H, hd] -> [B * H, hd, Lv] once, then split per level.
        v = value.view(b, -1, heads, hd).permute(0, 2, 3, 1).reshape(b * heads, hd, -1)
        v_levels = v.split([h * w for h, w in shapes], -1)
        loc = loc.permute(0, 2, 1, 3, 4).reshape(b * heads, lq, total, 2)
        samples = []
        for (h, w), v_l, loc_l in zip(shapes, v_levels, loc.split(self.points, 2)):
            if self.method == "default":
                samples.append(F.grid_sample(v_l.view(b * heads, hd, h, w), 2 * loc_l - 1, mode="bilinear",
                                             padding_mode="zeros", align_corners=False))
            else:
                x = torch.floor(loc_l[..., 0] * w + 0.5).long().clamp(0, w - 1)
                y = torch.floor(loc_l[..., 1] * h + 0.5).long().clamp(0, h - 1)
                idx = (y * w + x).reshape(b * heads, 1, -1).expand(-1, hd, -1)
                samples.append(v_l.gather(2, idx).view(b * heads, hd, lq, -1))
        sampled = torch.cat(samples, -1)  # [B * H, hd, Lq, P]
        weights = attn.permute(0, 2, 1, 3).reshape(b * heads, 1, lq, total)
        out = (sampled * weights).sum(-1).view(b, heads * hd, lq)
        return out.transpose(1, 2)


class DecoderLayer(nn.Module):
    """RT-DETR's decoder layer (post-norm): self-attention over the queries (dn mask applied),
    deformable cross-attention into the encoder memory, ReLU FFN; linear1/linear2 xavier-uniform
    (rtdetrv2_decoder.py TransformerDecoderLayer; r18: 8 heads, FFN 1024, dropout 0).
    RT-DETR v1 (rtdetr_decoder.py) differs in two details: torch's default FFN init
    (`xavier_ffn=False`) and a clamp of the FFN residual to the float16 range before the last
    norm (`clamp_fp16=True`)."""

    def __init__(self, dim: int = 256, heads: int = 8, ffn: int = 1024, dropout: float = 0.0, levels: int = 3,
                 points: int | Sequence[int] = 4, method: str = "default", xavier_ffn: bool = True,
                 clamp_fp16: bool = False):
        super().__init__()
        self.self_attn = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.cross_attn = MSDeformableAttention(dim, heads, levels, points, method)
        self.linear1, self.linear2 = nn.Linear(dim, ffn), nn.Linear(ffn, dim)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.drop1, self.drop2, self.drop3, self.drop4 = (nn.Dropout(dropout) for _ in range(4))
        self.act = nn.ReLU()
        self.clamp_fp16 = clamp_fp16
        if xavier_ffn:
            init.xavier_uniform_(self.linear1.weight)
            init.xavier_uniform_(self.linear2.weight)

    def forward(self, x: Tensor, ref: Tensor, memory: Tensor, shapes: Sequence[tuple[int, int]],
                attn_mask: Tensor | None = None, pos: Tensor | None = None) -> Tensor:
        q = x if pos is None else x + pos
        x = self.norm1(x + self.drop1(self.self_attn(q, q, x, attn_mask=attn_mask, need_weights=False)[0]))
        q = x if pos is None else x + pos
        x = self.norm2(x + self.drop2(self.cross_attn(q, ref, memory, shapes)))
        x = x + self.drop4(self.linear2(self.drop3(self.act(self.linear1(x)))))
        return self.norm3(x.clamp(-65504.0, 65504.0) if self.clamp_fp16 else x)
