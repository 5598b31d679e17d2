"""DEIMv2's decoder layer: D-FINE's data flow with RMSNorm and a SwiGLU feed-forward.

Facts from github:Intellindust-AI-Lab/DEIMv2 engine/deim/deim_decoder.py (TransformerDecoderLayer)
and engine/deim/deim_utils.py (paper: Huang et al., "Real-Time Object Detection Meets DINOv3",
arXiv 2509.20787):
- every LayerNorm of the D-FINE layer is an RMSNorm (eps 1e-6, a learned per-channel scale, the
  statistics taken in float32 and the result cast back to the input's dtype);
- the FFN is SwiGLU: w3(silu(a) * b), (a, b) = w12(x) split in halves, hidden width
  `dim_feedforward // 2`, both linears xavier-uniform with zero bias;
- the gate after the cross-attention is optional (`use_gateway`; its norm an RMSNorm); without
  it the cross-attention output is a residual followed by an RMSNorm, as in RT-DETR;
- the cross-attention samples the encoder memory directly (no value/output projection) and the
  FFN residual is clamped to +-65504 (the largest float16) before the last norm, as in D-FINE.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..detr.layers import MSDeformableAttention
from ..dfine.decoder import FP16_MAX, Gate

RMS_EPS = 1e-6  # deim_utils.RMSNorm


class RMSNorm(nn.Module):
    """x / rms(x) * scale over the last dim, computed in float32 (as upstream), cast back."""

    def __init__(self, dim: int, eps: float = RMS_EPS):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x.float(), self.weight.shape, eps=self.eps).to(x.dtype) * self.weight


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w12 = nn.Linear(dim, 2 * hidden)
        self.w3 = nn.Linear(hidden, dim)
        for linear in (self.w12, self.w3):
            nn.init.xavier_uniform_(linear.weight)
            nn.init.zeros_(linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.w12(x).chunk(2, -1)
        return self.w3(F.silu(a) * b)


class DecoderLayer(nn.Module):
    """Self-attention (post-norm), deformable cross-attention (gated or residual), SwiGLU FFN."""

    def __init__(self, dim: int, heads: int, ffn: int, points: tuple[int, ...], gateway: bool):
        super().__init__()
        self.self_attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm1 = RMSNorm(dim)
        self.cross_attn = MSDeformableAttention(dim, heads, len(points), points)
        self.cross_attn.value_proj = self.cross_attn.output_proj = nn.Identity()
        self.gateway = gateway
        self.norm2 = Gate(dim, RMSNorm) if gateway else RMSNorm(dim)
        self.ffn = SwiGLU(dim, ffn // 2)
        self.norm3 = RMSNorm(dim)

    def forward(self, x: torch.Tensor, ref: torch.Tensor, memory: torch.Tensor,
                shapes: list[tuple[int, int]], attn_mask: torch.Tensor | None = None,
                pos: torch.Tensor | None = None) -> torch.Tensor:
        q = x + pos
        x = self.norm1(x + self.self_attn(q, q, x, attn_mask=attn_mask, need_weights=False)[0])
        y = self.cross_attn(x + pos, ref, memory, shapes)
        x = self.norm2(x, y) if self.gateway else self.norm2(x + y)
        x = x + self.ffn(x)
        return self.norm3(x.clamp(-FP16_MAX, FP16_MAX))
