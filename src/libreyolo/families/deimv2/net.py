"""DEIMv2 network (its HGNetv2 sizes): HGNetv2 -> LiteEncoder (or D-FINE's hybrid encoder) ->
query selection -> D-FINE's FDR decoder with DEIMv2's layers.

Sizes (github:Intellindust-AI-Lab/DEIMv2 configs/deimv2/deimv2_hgnetv2_{atto,femto,pico,n}_coco.yml
over configs/base/deimv2.yml; every one 8 heads, reg_max 32, reg_scale 4, eval_idx -1, SiLU in
the decoder and its MLPs, 100 denoising queries, label noise 0.5, box noise 1.0):
  atto:  HGNetv2-Atto, stage 2 (stride 16, 256 ch); LiteEncoder hidden 64; decoder 3 layers,
         FFN 160, 2 levels x (4, 2) points, 100 queries;
  femto: HGNetv2-Femto (512 ch); hidden 96, FFN 256, 150 queries;
  pico:  HGNetv2-Pico (512 ch); hidden 112, FFN 320, 200 queries;
         atto/femto/pico: one corner head shared by the decoder layers (`share_bbox_head`), no
         gate (`use_gateway: False`);
  n:     HGNetv2-B0, stages 2, 3 (strides 16, 32); D-FINE's hybrid encoder, hidden 128, FFN 512,
         expansion 0.34, depth_mult 0.5, the fusion maps summed (`fuse_op: sum`); decoder 3
         layers, FFN 512, 2 levels x (6, 6) points, 300 queries, gated, one corner head per layer.
What DEIMv2's decoder (engine/deim/deim_decoder.py DEIMTransformer) changes against D-FINE's, all
sizes: RMSNorm and SwiGLU in the layers (decoder.py), no Linear + LayerNorm on the memory before
the query-selection heads (`enc_output`), a query position MLP(4, C, C, 3) computed once from the
first references (D-FINE's is recomputed in every layer from the refined boxes).
The larger sizes (S, M, L, X) put a DINOv3-distilled ViT with a spatial tuning adapter in place of
HGNetv2 and are not built here.
Published (DEIMv2 README; GFLOPs at each size's input: atto 320, femto 416, pico and n 640):
atto 0.5M params / 0.8 GFLOPs, femto 1.0M / 1.7, pico 1.5M / 5.2, n 3.6M / 6.8. Measured here
(80 classes; tests/unit/test_deimv2.py): atto 508,983 / 0.75, femto 983,943 / 1.66, pico
1,539,537 / 5.12, n 3,600,419 / 6.85 (FlopCounterMode: 2 FLOPs per multiply-add, grid_sample not
counted): upstream's parameters module for module (its frozen `up`/`reg_scale` scalars are
constants here). With the same weights, the eval boxes and scores of every size agreed with
upstream's to 2e-4 px (n with upstream's transposed AIFI sin-cos embedding swapped for the core's
row-major one, as for D-FINE), checked once against github:Intellindust-AI-Lab/DEIMv2 (not a test:
no upstream code in the tree).

Images are fed in [0, 1] without mean/std normalisation, as upstream's HGNetv2 configs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import nn

from ..common import build_model
from ..detr.layers import MLP
from ..dfine.decoder import FDRDecoder
from ..dfine.encoder import HybridEncoder
from ..dfine.hgnetv2 import HGNetv2
from ..dfine.net import REG_MAX, REG_SCALE, DFINEModel
from .decoder import DecoderLayer
from .encoder import LiteEncoder

log = logging.getLogger("libreyolo")


@dataclass(frozen=True)
class Arch:
    backbone: str
    return_idx: tuple[int, ...]
    hidden: int
    ffn: int                 # the decoder's; the n size's hybrid encoder uses the same width
    layers: int
    points: tuple[int, ...]
    queries: int
    lite: bool               # LiteEncoder (one backbone map) or D-FINE's hybrid encoder
    share_corners: bool      # share_bbox_head
    gateway: bool            # use_gateway
    local_loss: bool         # FGL + DDF and the union set (losses ['mal', 'boxes', 'local'])
    # The matching cost turns to -(class score x IoU^4) at this fraction of the epochs
    # (matcher_change_epoch over the epochs: 450 of 500, 136 of 160).
    iou_matching_from: float
    expansion: float = 0.34
    depth_mult: float = 0.5


ARCHS: dict[str, Arch] = {
    "atto": Arch("Atto", (2,), 64, 160, 3, (4, 2), 100, True, True, False, False, 0.9),
    "femto": Arch("Femto", (2,), 96, 256, 3, (4, 2), 150, True, True, False, False, 0.9),
    "pico": Arch("Pico", (2,), 112, 320, 3, (4, 2), 200, True, True, False, False, 0.9),
    "n": Arch("B0", (2, 3), 128, 512, 3, (6, 6), 300, False, False, True, True, 136 / 160),
}


class Encoder(nn.Module):
    """The captured region: images [B, 3, H, W] in [0, 1] -> encoder maps (finest first)."""

    def __init__(self, arch: Arch):
        super().__init__()
        self.backbone = HGNetv2(arch.backbone, arch.return_idx)
        if arch.lite:
            self.encoder = LiteEncoder(self.backbone.channels[0], arch.hidden, arch.expansion, arch.depth_mult)
            self.strides = (self.backbone.strides[0], 2 * self.backbone.strides[0])
        else:
            self.encoder = HybridEncoder(self.backbone.channels, arch.hidden, arch.ffn, arch.expansion,
                                         arch.depth_mult, fuse_sum=True)
            self.strides = self.backbone.strides

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self.encoder(self.backbone(images)))


class DEIMv2Model(DFINEModel):
    """D-FINE's training model (query selection, denoising, FDR decoding) on DEIMv2's parts; the
    captured region is backbone + encoder. `iou_matching` tells the criterion which matching
    cost the current epoch uses (`set_epoch`)."""

    archs = ARCHS

    def __init__(self, size: str, num_classes: int):
        super().__init__(size, num_classes, nn.SiLU)
        self.arch = ARCHS[size]
        self.iou_matching = False

    def build_net(self, arch: Arch) -> nn.Module:
        return Encoder(arch)

    def build_enc_output(self, dim: int) -> nn.Module:
        return nn.Identity()

    def build_decoder(self, arch: Arch, num_classes: int, act: type[nn.Module]) -> FDRDecoder:
        def layer() -> nn.Module:
            return DecoderLayer(arch.hidden, 8, arch.ffn, arch.points, arch.gateway)
        return FDRDecoder(arch.hidden, 8, arch.ffn, arch.layers, arch.points, num_classes, act, REG_MAX,
                          REG_SCALE, layer=layer, query_pos=MLP(4, arch.hidden, arch.hidden, 3, act=act),
                          static_query_pos=True,
                          share_corners=arch.share_corners)

    def set_epoch(self, epoch: int, cfg) -> str | None:
        """From `iou_matching_from` of the epochs on, the Hungarian cost is -(p x IoU^4) (the
        criterion reads `iou_matching`). The switch's reason re-arms the graphs: cuda_graph=full
        captured the matching with the old cost (cuda_graph=true's encoder re-captures once)."""
        on = epoch >= self.arch.iou_matching_from * cfg.epochs
        changed, self.iou_matching = on != self.iou_matching, on
        if changed:
            return f"DEIMv2 matching by {'class score x IoU^4' if on else 'the focal/L1/GIoU cost'}"
        return None


def build(size: str, num_classes: int) -> DEIMv2Model:
    return build_model(DEIMv2Model, "DEIMv2", ARCHS, size, num_classes)
