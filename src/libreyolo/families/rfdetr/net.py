"""RF-DETR (Robinson et al., "RF-DETR: Neural Architecture Search for Real-Time Detection
Transformers", arXiv 2511.09554): a windowed DINOv2 ViT-S and LW-DETR's projector (vit.py), two-stage
query selection per query group, and LW-DETR's decoder with one deformable level.

Sizes (github:roboflow/rf-detr rfdetr/config.py RFDETR{Nano,Small,Medium}Config over
RFDETRBaseConfig; every one ViT-S `dinov2_windowed_small`, patch 16, 2 x 2 windows, out blocks
[3, 6, 9, 12], projector P4, hidden 256, 300 queries, 13 query groups in training, self-attention
8 heads, cross-attention 16 heads x 2 points on the one level, FFN 2048 (main.py dim_feedforward),
ReLU, dropout 0, two_stage, bbox_reparam, lite_refpoint_refine, decoder norm LN):
  n: 384 px, positions for a 24 x 24 grid, 2 decoder layers;
  s: 512 px, 32 x 32, 3 layers;
  m: 576 px, 36 x 36, 4 layers.
Published (RF-DETR README, COCO): N 30.5M params, S 32.1M, M 33.7M. Measured here (80 classes;
tests/unit/test_rfdetr.py): see that test for the counts and GFLOPs.

The data flow (rfdetr/models/{transformer.py, lwdetr.py}), every box cxcywh normalised by the input:
- memory: the projector's map, flattened; proposals per cell: centre ((x + 0.5) / w, (y + 0.5) / h),
  size 0.05; a proposal with any coordinate outside (0.01, 0.99) is zero and so is its memory
  (gen_encoder_output_proposals, unsigmoid False);
- per group g (13 in training, the first only in eval): Linear + LayerNorm on the memory, a class
  head and a 3-layer box MLP of the group's own; a cell's box is `reparam(proposal, delta)`:
  centre + delta_xy * size, size * exp(delta_wh); the k = min(300, cells) cells with the best max
  class logit, in score order, are the group's encoder outputs (boxes with their gradient) and, detached,
  its reference boxes;
- the queries: the group's learned content embeddings (query_feat) and learned box deltas
  (refpoint_embed, zero-init) applied to those references: ref = reparam(reference, delta);
- decoder (post-norm layers): self-attention within each group (training runs the groups side by
  side, one attention per group), deformable cross-attention (sampling around the reference box,
  offsets / points x wh x 0.5), FFN; the query position is MLP(sine(ref)) (512 -> 256 -> 256,
  sine of (y, x, w, h), 128 frequencies each, temperature 10000, scale 2 pi), computed once
  (lite_refpoint_refine: the reference boxes are not refined between layers);
- every layer's output goes through the shared decoder LayerNorm, then the shared class head
  (bias prior 0.01) and box MLP (last layer zero-init): box = reparam(ref, delta).
Init as upstream: xavier-uniform on every matrix of the decoder and the groups' encoder
projections (Transformer._reset_parameters), the deformable attention's own init after it;
the groups' encoder heads start as copies of the decoder's heads (copy.deepcopy in LWDETR).
Upstream takes the first k rows of all groups' query embeddings when an input has fewer cells
than 300 (misaligning the groups and leaving the other queries on zero-size boxes); here each
group uses its own first k, the same at every size's resolution (576 cells and more).

The captured region is everything but the matching and the loss: without denoising queries
every shape is fixed by the input's.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import init

from ..base import Targets
from ..common import build_model
from ..detr.layers import MLP, MSDeformableAttention
from ..detr.model import DETRModel
from ..detr.output import INPUT_WH, DETROutput, input_wh
from ..detr.queries import take
from ..detr.topk import decode
from .vit import OUT_BLOCKS, WIDTH, Projector, WindowedDINOv2

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
HIDDEN, FFN, SA_HEADS, CA_HEADS, POINTS = 256, 2048, 8, 16, 2
PROPOSAL_SIZE, PROPOSAL_EPS = 0.05, 0.01
PRIOR = -math.log((1 - 0.01) / 0.01)  # class bias for a prior probability of 0.01


@dataclass(frozen=True)
class Arch:
    imgsz: int          # resolution
    pos_grid: int       # positional_encoding_size
    layers: int         # dec_layers
    patch: int = 16
    windows: int = 2
    queries: int = 300
    groups: int = 13    # group_detr


ARCHS: dict[str, Arch] = {
    "n": Arch(384, 24, 2),
    "s": Arch(512, 32, 3),
    "m": Arch(576, 36, 4),
}
STRIDE = 16


def reparam(ref: Tensor, delta: Tensor) -> Tensor:
    """bbox_reparam: centre + delta_xy * size, size * exp(delta_wh) (cxcywh, normalised)."""
    return torch.cat((ref[..., :2] + delta[..., :2] * ref[..., 2:], ref[..., 2:] * delta[..., 2:].exp()), -1)


def sine_embed(box: Tensor, dim: int = HIDDEN // 2, temperature: float = 10000.0) -> Tensor:
    """[..., 4] cxcywh -> [..., 4 * dim]: per coordinate (y, x, w, h) `dim` features, sin on the
    even and cos on the odd ones of 2 pi v / T^(2 floor(i / 2) / dim) (gen_sineembed_for_position)."""
    i = torch.arange(dim, device=box.device, dtype=torch.float32)
    freq = temperature ** (2 * torch.div(i, 2, rounding_mode="floor") / dim)
    # (y, x, w, h): slices, not a list index (a CPU index tensor, copied to the device every step:
    # a host sync, and a copy CUDA graph capture refuses)
    yxwh = torch.cat((box[..., 1:2], box[..., 0:1], box[..., 2:4]), -1)
    v = yxwh.float().unsqueeze(-1) * (2 * math.pi) / freq  # [..., 4, dim]
    out = torch.stack((v[..., 0::2].sin(), v[..., 1::2].cos()), -1).flatten(-2)
    return out.flatten(-2).to(box.dtype)


def proposals(h: int, w: int, memory: Tensor) -> tuple[Tensor, Tensor]:
    """(proposals [1, h * w, 4], valid [1, h * w, 1]) of a one-level map, zero where invalid."""
    ys, xs = torch.meshgrid(torch.arange(h, device=memory.device, dtype=torch.float32),
                            torch.arange(w, device=memory.device, dtype=torch.float32), indexing="ij")
    xy = torch.stack(((xs + 0.5) / w, (ys + 0.5) / h), -1).reshape(1, -1, 2)
    p = torch.cat((xy, torch.full_like(xy, PROPOSAL_SIZE)), -1)
    valid = ((p > PROPOSAL_EPS) & (p < 1 - PROPOSAL_EPS)).all(-1, keepdim=True)
    return torch.where(valid, p, 0.0).to(memory.dtype), valid


class DecoderLayer(nn.Module):
    """LW-DETR's post-norm decoder layer; in training the queries are `groups` groups that attend
    only within their group (TransformerDecoderLayer.forward_post)."""

    def __init__(self):
        super().__init__()
        self.self_attn = nn.MultiheadAttention(HIDDEN, SA_HEADS, batch_first=True)
        self.norm1 = nn.LayerNorm(HIDDEN)
        self.cross_attn = MSDeformableAttention(HIDDEN, CA_HEADS, 1, POINTS)
        self.norm2 = nn.LayerNorm(HIDDEN)
        self.linear1, self.act, self.linear2 = nn.Linear(HIDDEN, FFN), nn.ReLU(), nn.Linear(FFN, HIDDEN)
        self.norm3 = nn.LayerNorm(HIDDEN)

    def forward(self, x: Tensor, pos: Tensor, ref: Tensor, memory: Tensor, shapes, groups: int) -> Tensor:
        b, q, c = x.shape
        qk = (x + pos).reshape(b * groups, q // groups, c)
        sa = self.self_attn(qk, qk, x.reshape(b * groups, q // groups, c), need_weights=False)[0]
        x = self.norm1(x + sa.reshape(b, q, c))
        x = self.norm2(x + self.cross_attn(x + pos, ref.unsqueeze(2), memory, shapes))
        return self.norm3(x + self.linear2(self.act(self.linear1(x))))


class Network(nn.Module):
    """The captured region: images [B, 3, H, W] in [0, 1] -> (logits [B, L, G k, C], boxes
    [B, L, G k, 4], enc_logits [B, G, k, C], enc_boxes [B, G, k, 4], input_wh [B, 2]); G groups
    in training, 1 in eval; k = min(queries, cells)."""

    def __init__(self, arch: Arch, num_classes: int):
        super().__init__()
        self.arch = arch
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)
        self.backbone = WindowedDINOv2(arch.patch, arch.windows, arch.pos_grid)
        self.projector = Projector(WIDTH, len(OUT_BLOCKS), HIDDEN)
        g = arch.groups
        self.enc_output = nn.ModuleList(nn.Linear(HIDDEN, HIDDEN) for _ in range(g))
        self.enc_output_norm = nn.ModuleList(nn.LayerNorm(HIDDEN) for _ in range(g))
        self.layers = nn.ModuleList(DecoderLayer() for _ in range(arch.layers))
        self.ref_point_head = MLP(2 * HIDDEN, HIDDEN, HIDDEN, 2)
        self.decoder_norm = nn.LayerNorm(HIDDEN)
        for p in [*self.enc_output.parameters(), *self.layers.parameters(), *self.ref_point_head.parameters()]:
            if p.dim() > 1:
                init.xavier_uniform_(p)
        for layer in self.layers:
            layer.cross_attn._reset_parameters()
        self.class_embed = nn.Linear(HIDDEN, num_classes)
        init.constant_(self.class_embed.bias, PRIOR)
        self.bbox_embed = MLP(HIDDEN, HIDDEN, 4, 3)
        init.zeros_(self.bbox_embed.layers[-1].weight)
        init.zeros_(self.bbox_embed.layers[-1].bias)
        self.enc_class = nn.ModuleList(copy.deepcopy(self.class_embed) for _ in range(g))
        self.enc_bbox = nn.ModuleList(copy.deepcopy(self.bbox_embed) for _ in range(g))
        self.query_feat = nn.Embedding(arch.queries * g, HIDDEN)
        self.refpoint_embed = nn.Embedding(arch.queries * g, 4)
        init.zeros_(self.refpoint_embed.weight)

    def forward(self, images: Tensor) -> tuple[Tensor, ...]:
        b, _, ih, iw = images.shape
        feat = self.projector(self.backbone((images - self.mean) / self.std))
        h, w = feat.shape[2:]
        memory = feat.flatten(2).transpose(1, 2)  # [B, S, C]
        prop, valid = proposals(h, w, memory)
        masked = memory * valid.to(memory.dtype)
        groups = self.arch.groups if self.training else 1
        k = min(self.arch.queries, h * w)
        enc_logits, enc_boxes, content, deltas = [], [], [], []
        for g in range(groups):
            out = self.enc_output_norm[g](self.enc_output[g](masked))
            logits = self.enc_class[g](out)
            boxes = reparam(prop, self.enc_bbox[g](out))
            top = logits.max(-1).values.topk(k, dim=1).indices  # score order: query i takes the i-th best
            enc_logits.append(take(logits, top))
            enc_boxes.append(take(boxes, top))
            rows = slice(g * self.arch.queries, g * self.arch.queries + k)
            content.append(self.query_feat.weight[rows])
            deltas.append(self.refpoint_embed.weight[rows])
        enc_logits, enc_boxes = torch.stack(enc_logits, 1), torch.stack(enc_boxes, 1)  # [B, G, k, *]
        ref = reparam(enc_boxes.detach().flatten(1, 2), torch.cat(deltas).to(memory.dtype))  # [B, G k, 4]
        x = torch.cat(content).to(memory.dtype).expand(b, -1, -1)
        pos = self.ref_point_head(sine_embed(ref))
        hs = []
        for layer in self.layers:
            x = layer(x, pos, ref, memory, [(h, w)], groups)
            hs.append(self.decoder_norm(x))
        hs = torch.stack(hs, 1)  # [B, L, G k, C]
        boxes = reparam(ref.unsqueeze(1), self.bbox_embed(hs))
        return self.class_embed(hs), boxes, enc_logits, enc_boxes, input_wh(b, ih, iw, images.device)


class RFDETRModel(DETRModel):
    """Training model (families/base.py; docs/architecture.md, "DETR families"): `capturable` is the
    whole network up to the loss (no denoising: static shapes); `forward_train` only names its
    outputs. Host syncs per step: the matcher's alone (detr/matcher.py), no denoising read."""

    denoising = False

    def __init__(self, size: str, num_classes: int):
        super().__init__()
        self.size, self.num_classes, self.strides = size, num_classes, (STRIDE,)
        self.arch = ARCHS[size]
        self.num_queries = self.arch.queries
        self.net = Network(self.arch, num_classes)

    def forward_train(self, captured: tuple[Tensor, ...], targets: Targets | None = None) -> DETROutput:
        logits, boxes, enc_logits, enc_boxes, wh = captured
        b, dev = logits.shape[0], logits.device
        empty = logits.new_zeros(b, logits.shape[1], 0, logits.shape[-1])
        return DETROutput(logits, boxes, enc_logits, enc_boxes, empty, boxes.new_zeros(b, logits.shape[1], 0, 4),
                          torch.full((b, 0), -1, dtype=torch.long, device=dev), torch.ones(b, device=dev),
                          {INPUT_WH: wh})

    def predict(self, images: Tensor) -> Tensor:
        """[B, Q, 4 + C]: xyxy input pixels, then sigmoid scores (float32); the last layer only."""
        logits, boxes = self.net(images)[:2]
        with torch.autocast(images.device.type, enabled=False):
            return decode(logits[:, -1], boxes[:, -1], tuple(images.shape[2:]))


def build(size: str, num_classes: int) -> RFDETRModel:
    return build_model(RFDETRModel, "RF-DETR", ARCHS, size, num_classes)
