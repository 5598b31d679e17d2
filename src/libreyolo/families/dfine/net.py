"""D-FINE network (also DEIM's and RT-DETRv4's): HGNetv2 -> hybrid encoder -> query selection ->
FDR decoder.

Sizes (github:Peterande/D-FINE configs/dfine/dfine_hgnetv2_{n,s}_coco.yml over
include/dfine_hgnetv2.yml; DEIM's configs/deim_dfine/ and RT-DETRv4's configs/dfine/ include the
same files):
  n: HGNetv2-B0, stages [2, 3] (strides 16, 32), hidden 128, encoder FFN 512, expansion 0.34,
     depth_mult 0.5; decoder 3 layers, FFN 512, 2 levels x 6 points.
  s: HGNetv2-B0, stages [1, 2, 3] (strides 8, 16, 32), hidden 256, FFN 1024, expansion 0.5,
     depth_mult 0.34; decoder 3 layers, FFN 1024, 3 levels x (3, 6, 3) points.
  Both: 8 heads, 300 queries, 100 denoising queries (label noise 0.5, box noise 1.0), reg_max
  32, reg_scale 4, eval_idx -1 (the last layer predicts), layer_scale 1, default (bilinear)
  cross-attention sampling, default query selection (top-300 by max class logit).
Published size (D-FINE README, 640 px): n 4M params / 7 GFLOPs, s 10M / 25 GFLOPs.
Measured here (80 classes; tests/unit/test_dfine_net.py): n 3,782,691 / 7.11 GFLOPs, s 10,321,875
/ 25.23 GFLOPs (FlopCounterMode: 2 FLOPs per multiply-add, grid_sample not counted). The
parameter counts are upstream's module for module (its two frozen `up`/`reg_scale` scalars are
constants here); with the same weights, backbone + encoder outputs agree with upstream's to
~1e-7 (upstream's transposed sin-cos embedding swapped for the core's row-major one,
detr/layers.py) and the decoder's boxes and scores (a query permutation aside) to ~3e-7, checked once
against github:Peterande/D-FINE and github:ShihuaHuang95/DEIM (not a test: no upstream code
in the tree).

Images are fed in [0, 1] without mean/std normalisation, as upstream (ConvertPILImage scale
True, no Normalize in the D-FINE/DEIM transforms).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..common import build_model
from ..detr.criterion import normalise_targets
from ..detr.denoise import denoising_group, keep_in_graph
from ..detr.layers import MLP
from ..detr.model import DETRModel
from ..detr.output import DN_LIVE, INPUT_WH, DETROutput, input_wh
from ..detr.queries import QueryAnchors, take, topk_cells
from ..detr.topk import decode
from .decoder import FDRDecoder, prior_logit
from .encoder import HybridEncoder
from .hgnetv2 import HGNetv2

NUM_QUERIES = 300      # include/dfine_hgnetv2.yml DFINETransformer.num_queries
NUM_DENOISING = 100    # num_denoising, label_noise_ratio 0.5, box_noise_scale 1.0
LABEL_NOISE, BOX_NOISE = 0.5, 1.0
REG_MAX, REG_SCALE = 32, 4.0


@dataclass(frozen=True)
class Arch:
    backbone: str
    return_idx: tuple[int, ...]
    hidden: int
    ffn: int
    expansion: float
    depth_mult: float
    layers: int
    points: tuple[int, ...]
    queries: int = NUM_QUERIES


ARCHS: dict[str, Arch] = {
    "n": Arch("B0", (2, 3), 128, 512, 0.34, 0.5, 3, (6, 6)),
    "s": Arch("B0", (1, 2, 3), 256, 1024, 0.5, 0.34, 3, (3, 6, 3)),
}


class Encoder(nn.Module):
    """The captured region: images [B, 3, H, W] in [0, 1] -> encoder maps (finest first)."""

    def __init__(self, arch: Arch):
        super().__init__()
        self.backbone = HGNetv2(arch.backbone, arch.return_idx)
        self.encoder = HybridEncoder(self.backbone.channels, arch.hidden, arch.ffn, arch.expansion, arch.depth_mult)

    @property
    def strides(self) -> tuple[int, ...]:
        return self.backbone.strides

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.encoder(self.backbone(images))


class DFINEModel(DETRModel):
    """Training model (families/base.py; docs/architecture.md, "DETR families"): `capturable` is backbone
    + hybrid encoder; `forward_train` is query selection, denoising and the decoder (eager).

    A family on this model (DEIMv2) sets its own `archs` and builds its own parts through
    `build_net`, `build_enc_output` and `build_decoder`; the query selection, denoising and
    decoding around them are this class's."""

    archs: dict = ARCHS

    def __init__(self, size: str, num_classes: int, act: type[nn.Module] = nn.ReLU):
        super().__init__()
        arch = self.archs[size]
        self.size, self.num_classes, self.num_queries = size, num_classes, arch.queries
        self.net = self.build_net(arch)
        self.strides = self.net.strides
        dim = arch.hidden
        self.enc_output = self.build_enc_output(dim)
        self.enc_score = nn.Linear(dim, num_classes)
        nn.init.constant_(self.enc_score.bias, prior_logit(0.01))
        self.enc_bbox = MLP(dim, dim, 4, 3, act=act)
        nn.init.zeros_(self.enc_bbox.layers[-1].weight)
        nn.init.zeros_(self.enc_bbox.layers[-1].bias)
        # class num_classes is the padding row: the label of padded dn slots
        self.dn_embed = nn.Embedding(num_classes + 1, dim, padding_idx=num_classes)
        nn.init.normal_(self.dn_embed.weight[:-1])
        self.decoder = self.build_decoder(arch, num_classes, act)
        self.anchors = QueryAnchors()  # eps 0.01, size 0.05 * 2^level (DFINETransformer)
        self.num_denoising = NUM_DENOISING

    def build_net(self, arch: Arch) -> nn.Module:
        """The captured region: images -> encoder maps; it has `backbone` and `strides`."""
        return Encoder(arch)

    def build_enc_output(self, dim: int) -> nn.Module:
        """The memory's projection before the query-selection heads (Linear + LayerNorm)."""
        enc_output = nn.Sequential(nn.Linear(dim, dim), nn.LayerNorm(dim))
        nn.init.xavier_uniform_(enc_output[0].weight)
        return enc_output

    def build_decoder(self, arch: Arch, num_classes: int, act: type[nn.Module]) -> FDRDecoder:
        return FDRDecoder(arch.hidden, 8, arch.ffn, arch.layers, arch.points, num_classes, act, REG_MAX, REG_SCALE)

    def _select(self, feats: tuple[torch.Tensor, ...]):
        """Flattened memory, level shapes, and the top-k encoder proposals (query selection)."""
        shapes = [(int(f.shape[-2]), int(f.shape[-1])) for f in feats]
        memory = torch.cat([f.flatten(2) for f in feats], 2).transpose(1, 2)  # [B, S, C]
        anchors, valid = self.anchors(shapes, memory)
        out_memory = self.enc_output(valid.to(memory.dtype) * memory)
        enc_logits = self.enc_score(out_memory)
        idx = topk_cells(enc_logits, self.num_queries)
        top_memory = take(out_memory, idx)
        ref_logit = self.enc_bbox(top_memory) + take(anchors.expand(memory.shape[0], -1, -1), idx)
        return memory, shapes, top_memory, take(enc_logits, idx), ref_logit

    def forward_train(self, captured: tuple[torch.Tensor, ...], targets=None) -> DETROutput:
        memory, shapes, top_memory, top_logits, ref_logit = self._select(captured)
        b, q, _ = top_memory.shape
        h, w = shapes[0][0] * self.strides[0], shapes[0][1] * self.strides[0]
        wh = input_wh(b, h, w, memory.device)
        content, ref = top_memory.detach(), ref_logit.detach()
        dn = None
        if self.training and targets is not None:
            tg = normalise_targets(targets, wh)
            dn = denoising_group(tg.labels, tg.boxes, tg.valid, self.num_classes, q, self.dn_embed,
                                 self.num_denoising, LABEL_NOISE, BOX_NOISE, static=self.static_shapes)
        if dn is not None:
            content = torch.cat((dn.queries.to(content.dtype), content), 1)
            ref = torch.cat((dn.boxes_unact.to(ref.dtype), ref), 1)
        elif self.training:
            content = keep_in_graph(content, self.dn_embed)
        out = self.decoder(content, ref, memory, shapes, None if dn is None else dn.attn_mask)
        d = 0 if dn is None else dn.num_queries

        def split(key: str, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
            t = out[key]
            return t.narrow(dim, 0, d), t.narrow(dim, d, t.shape[dim] - d)

        (dn_logits, logits), (dn_boxes, boxes) = split("logits", 2), split("boxes", 2)
        (dn_corners, corners), (dn_refs, refs) = split("corners", 2), split("refs", 2)
        (dn_pre_logits, pre_logits), (dn_pre_boxes, pre_boxes) = split("pre_logits", 1), split("pre_boxes", 1)
        dev = memory.device
        return DETROutput(
            logits=logits, boxes=boxes,
            enc_logits=top_logits.unsqueeze(1), enc_boxes=ref_logit.sigmoid().unsqueeze(1),
            dn_logits=dn_logits, dn_boxes=dn_boxes,
            dn_target=dn.target if dn is not None else torch.full((b, 0), -1, dtype=torch.long, device=dev),
            dn_groups=dn.groups if dn is not None else torch.ones(b, device=dev),
            extra={INPUT_WH: wh, "corners": corners, "refs": refs, "pre_logits": pre_logits,
                   "pre_boxes": pre_boxes, "dn_corners": dn_corners, "dn_refs": dn_refs,
                   "dn_pre_logits": dn_pre_logits, "dn_pre_boxes": dn_pre_boxes,
                   **({} if dn is None else {DN_LIVE: dn.live.expand(b, -1)})},
        )

    def predict(self, images: torch.Tensor) -> torch.Tensor:
        """[B, Q, 4 + C]: xyxy boxes in input pixels, then per-class sigmoid scores (last layer)."""
        memory, shapes, top_memory, _, ref_logit = self._select(self.net(images))
        out = self.decoder(top_memory, ref_logit, memory, shapes, None, last_only=True)
        with torch.autocast(images.device.type, enabled=False):
            return decode(out["logits"][:, -1], out["boxes"][:, -1], tuple(images.shape[-2:]))


class DEIMModel(DFINEModel):
    """DEIM's network: D-FINE's with SiLU in the decoder's FFNs, LQE and box/position MLPs
    (github:ShihuaHuang95/DEIM configs/base/deim.yml `activation: silu`, `mlp_act: silu`)."""

    def __init__(self, size: str, num_classes: int):
        super().__init__(size, num_classes, nn.SiLU)


def build(size: str, num_classes: int) -> DFINEModel:
    return build_model(DFINEModel, "D-FINE", ARCHS, size, num_classes)


def build_deim(size: str, num_classes: int) -> DEIMModel:
    return build_model(DEIMModel, "DEIM", ARCHS, size, num_classes)
