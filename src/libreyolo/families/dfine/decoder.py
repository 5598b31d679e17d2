"""D-FINE's decoder: fine-grained distribution refinement (FDR) of the boxes, layer by layer.

Facts from github:Peterande/D-FINE src/zoo/dfine/dfine_decoder.py and dfine_utils.py (paper:
Peng et al., "D-FINE: Redefine Regression Task in DETRs as Fine-grained Distribution
Refinement", ICLR 2025):
- Each box edge is a distribution over reg_max + 1 = 33 bins; its value is the Integral
  sum_n softmax(corners)_n * W(n) with the non-uniform weighting function W (reg_scale 4,
  up 0.5): W(0) = -2 a, W(32) = 2 a, W(16) = 0 and step^i - 1 in between (step = (a + 1)^(2/30),
  a = up * reg_scale), fine near 0 and coarse at the ends.
- Edge distances are in units of the reference box's w (or h) / reg_scale, offset by half the
  reference: x1 = cx - (reg_scale / 2 + d_left) * w / reg_scale (d = 0 gives the reference).
- Layer 0 also predicts a plain box (`pre_bbox_head`, as RT-DETR: sigmoid(MLP + logit(ref)));
  that "pre" box is the fixed reference of every later layer's distance decode. Each layer adds
  its corner logits to the previous layer's (the residual the name "refinement" means), and its
  bbox head sees output_i + output_{i-1}.detach().
- Decoder layer: self-attention (post-norm), multi-scale deformable cross-attention with
  per-level point counts and no value/output projections, a gate (sigmoid of a linear on both
  inputs, init 0.5/0.5) instead of the residual add, FFN, and a clamp to +-65504 (the largest
  float16) before the last norm.
- LQE: the class logits get an additive quality term from an MLP(20, 64, 1) on each edge's
  top-4 bin probabilities and their mean.
- Per-layer (not shared) class and corner heads; query position MLP(4, 2C, C) clamped to +-10.
- DEIM keeps the network and switches the decoder activations to SiLU (configs/base/deim.yml:
  `activation: silu`, `mlp_act: silu`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from ..detr import layers
from ..detr.boxes import inverse_sigmoid, xyxy_to_cxcywh
from ..detr.layers import MLP

FP16_MAX = 65504.0  # the decoder's clamp before the last LayerNorm (upstream, every layer)


def weighting_function(reg_max: int, up: float, reg_scale: float) -> torch.Tensor:
    """W(n), n = 0..reg_max: the bin values the Integral weights (dfine_utils.weighting_function)."""
    a = abs(up) * abs(reg_scale)
    step = (a + 1) ** (2 / (reg_max - 2))
    half = reg_max // 2
    left = [-(step ** i) + 1 for i in range(half - 1, 0, -1)]
    right = [step ** i - 1 for i in range(1, half)]
    return torch.tensor([-2 * a, *left, 0.0, *right, 2 * a], dtype=torch.float32)


def distance_to_box(ref: torch.Tensor, dist: torch.Tensor, reg_scale: float) -> torch.Tensor:
    """Edge distances [..., 4] (l, t, r, b in reference w/h / reg_scale) around reference boxes
    cxcywh [..., 4] -> boxes cxcywh."""
    cx, cy, w, h = ref.unbind(-1)
    half = 0.5 * reg_scale
    sx, sy = w / reg_scale, h / reg_scale
    x1 = cx - (half + dist[..., 0]) * sx
    y1 = cy - (half + dist[..., 1]) * sy
    x2 = cx + (half + dist[..., 2]) * sx
    y2 = cy + (half + dist[..., 3]) * sy
    return xyxy_to_cxcywh(torch.stack((x1, y1, x2, y2), -1))


def box_to_distance(ref: torch.Tensor, boxes_xyxy: torch.Tensor, reg_scale: float) -> torch.Tensor:
    """The inverse of `distance_to_box`: target boxes xyxy around references cxcywh -> distances."""
    cx, cy, w, h = ref.unbind(-1)
    sx, sy = w / reg_scale + 1e-16, h / reg_scale + 1e-16
    x1, y1, x2, y2 = boxes_xyxy.unbind(-1)
    half = 0.5 * reg_scale
    return torch.stack(((cx - x1) / sx - half, (cy - y1) / sy - half,
                        (x2 - cx) / sx - half, (y2 - cy) / sy - half), -1)


def prior_logit(p: float) -> float:
    return -math.log((1 - p) / p)


class Gate(nn.Module):
    """norm(g1 * x + g2 * y), (g1, g2) = sigmoid(linear([x, y])); starts at g1 = g2 = 0.5.
    `norm`: LayerNorm (D-FINE) or DEIMv2's RMSNorm."""

    def __init__(self, dim: int, norm: type[nn.Module] = nn.LayerNorm):
        super().__init__()
        self.gate = nn.Linear(2 * dim, 2 * dim)
        nn.init.zeros_(self.gate.weight)
        nn.init.zeros_(self.gate.bias)  # logit(0.5)
        self.norm = norm(dim)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        g1, g2 = self.gate(torch.cat((x, y), -1)).sigmoid().chunk(2, -1)
        return self.norm(g1 * x + g2 * y)


class LQE(nn.Module):
    """Localization quality estimation: logits + MLP(top-k bin probabilities and their mean)."""

    def __init__(self, reg_max: int, act: type[nn.Module], k: int = 4, hidden: int = 64):
        super().__init__()
        self.k, self.bins = k, reg_max + 1
        self.mlp = MLP(4 * (k + 1), hidden, 1, 2, act=act)
        nn.init.zeros_(self.mlp.layers[-1].weight)
        nn.init.zeros_(self.mlp.layers[-1].bias)

    def forward(self, logits: torch.Tensor, corners: torch.Tensor) -> torch.Tensor:
        prob = corners.unflatten(-1, (4, self.bins)).softmax(-1)
        top = prob.topk(self.k, -1).values
        stat = torch.cat((top, top.mean(-1, keepdim=True)), -1).flatten(-2)
        return logits + self.mlp(stat)


class DecoderLayer(layers.DecoderLayer):
    """The core's decoder layer in D-FINE's form: cross-attention without value/output
    projections (D-FINE samples the encoder memory directly), a `Gate` in place of the
    cross-attention residual + norm2, the FFN activation of the recipe, the float16 clamp.
    EdgeCrafter's ECDet keeps torch's default FFN init (`xavier_ffn=False`)."""

    def __init__(self, dim: int, heads: int, ffn: int, points: tuple[int, ...], act: type[nn.Module],
                 xavier_ffn: bool = True):
        super().__init__(dim, heads, ffn, 0.0, len(points), points, xavier_ffn=xavier_ffn, clamp_fp16=True)
        self.cross_attn.value_proj = self.cross_attn.output_proj = nn.Identity()
        self.norm2 = Gate(dim)
        self.act = act()

    def forward(self, x: torch.Tensor, ref: torch.Tensor, memory: torch.Tensor,
                shapes: list[tuple[int, int]], attn_mask: torch.Tensor | None = None,
                pos: torch.Tensor | None = None) -> torch.Tensor:
        q = x + pos
        x = self.norm1(x + self.self_attn(q, q, x, attn_mask=attn_mask, need_weights=False)[0])
        x = self.norm2(x, self.cross_attn(x + pos, ref, memory, shapes))
        x = x + self.linear2(self.act(self.linear1(x)))
        return self.norm3(x.clamp(-FP16_MAX, FP16_MAX))


class FDRDecoder(nn.Module):
    """Queries + references -> per-layer logits, boxes, corner logits and the references used.

    D-FINE's by default. DEIMv2 and EdgeCrafter's ECDet change four parts, passed in: `layer`
    builds one decoder layer (DEIMv2's RMSNorm/SwiGLU form), `query_pos` is the query position
    MLP (theirs: MLP(4, C, C, 3), every layer xavier-initialised as upstream's `_reset_parameters`
    does) and `static_query_pos` embeds only the first references (their TransformerDecoder
    computes `query_pos_embed` once, before the layers; D-FINE's again in every layer, from the
    refined boxes), and `share_corners` gives every layer one corner head (`share_bbox_head`)."""

    def __init__(self, dim: int, heads: int, ffn: int, layers: int, points: tuple[int, ...],
                 num_classes: int, act: type[nn.Module], reg_max: int = 32, reg_scale: float = 4.0,
                 up: float = 0.5, *, layer: Callable[[], nn.Module] | None = None,
                 query_pos: MLP | None = None, static_query_pos: bool = False, share_corners: bool = False):
        super().__init__()
        self.reg_max, self.reg_scale = reg_max, reg_scale
        self.static_query_pos = static_query_pos
        self.register_buffer("project", weighting_function(reg_max, up, reg_scale), persistent=False)
        if layer is None:
            def layer() -> nn.Module:
                return DecoderLayer(dim, heads, ffn, points, act)
        self.layers = nn.ModuleList(layer() for _ in range(layers))
        self.lqe = nn.ModuleList(LQE(reg_max, act) for _ in range(layers))
        self.query_pos = MLP(4, 2 * dim, dim, 2, act=act) if query_pos is None else query_pos
        for linear in self.query_pos.layers:
            nn.init.xavier_uniform_(linear.weight)
        self.pre_bbox = MLP(dim, dim, 4, 3, act=act)
        self.score = nn.ModuleList(nn.Linear(dim, num_classes) for _ in range(layers))
        self.corners = nn.ModuleList(MLP(dim, dim, 4 * (reg_max + 1), 3, act=act)
                                     for _ in range(1 if share_corners else layers))
        for head in (self.pre_bbox, *self.corners):
            nn.init.zeros_(head.layers[-1].weight)
            nn.init.zeros_(head.layers[-1].bias)
        for head in self.score:
            nn.init.constant_(head.bias, prior_logit(0.01))

    def integral(self, corners: torch.Tensor) -> torch.Tensor:
        """Corner logits [..., 4 * (reg_max + 1)] -> expected edge distances [..., 4]."""
        return corners.unflatten(-1, (4, self.reg_max + 1)).softmax(-1) @ self.project.to(corners.dtype)

    def forward(self, x: torch.Tensor, ref_logit: torch.Tensor, value: torch.Tensor,
                shapes: list[tuple[int, int]], mask: torch.Tensor | None, last_only: bool = False
                ) -> dict[str, torch.Tensor]:
        ref = ref_logit.sigmoid()
        logits, boxes, corners_out, refs = [], [], [], []
        prev_x = prev_corners = 0
        pos = self.query_pos(ref).clamp(-10, 10)
        for i, layer in enumerate(self.layers):
            if i > 0 and not self.static_query_pos:
                pos = self.query_pos(ref).clamp(-10, 10)
            x = layer(x, ref.unsqueeze(2), value, shapes, mask, pos)
            if i == 0:
                pre_boxes = (self.pre_bbox(x) + inverse_sigmoid(ref)).sigmoid()
                pre_logits = self.score[0](x)
                ref0 = pre_boxes.detach()
            corners = self.corners[min(i, len(self.corners) - 1)](x + prev_x) + prev_corners
            box = distance_to_box(ref0, self.integral(corners), self.reg_scale)
            if not last_only or i == len(self.layers) - 1:
                logits.append(self.lqe[i](self.score[i](x), corners))
                boxes.append(box)
                corners_out.append(corners)
                refs.append(ref0)
            prev_corners, prev_x, ref = corners, x.detach(), box.detach()
        return {"logits": torch.stack(logits, 1), "boxes": torch.stack(boxes, 1),
                "corners": torch.stack(corners_out, 1), "refs": torch.stack(refs, 1),
                "pre_logits": pre_logits, "pre_boxes": pre_boxes}

