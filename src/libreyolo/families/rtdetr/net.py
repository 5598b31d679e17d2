"""RT-DETR (Zhao et al., "DETRs Beat YOLOs on Real-time Object Detection", CVPR 2024) and
RT-DETRv2 (Lv et al., 2024) with the ResNet-18-vd backbone, written from the facts of
github.com/lyuwenyu/RT-DETR (rtdetr_pytorch/ for v1, rtdetrv2_pytorch/ for v2):
src/nn/backbone/presnet.py, src/zoo/rtdetr/{hybrid_encoder,rtdetr_decoder,rtdetrv2_decoder}.py,
configs rtdetr/rtdetr_r18vd_6x_coco.yml and rtdetrv2/rtdetrv2_r18vd_120e_coco.yml.

Split (families/base.py): `capturable` = backbone + hybrid encoder + the decoder's input
projections (convs and BatchNorm only: static shapes, no host sync); `forward_train` = query
selection, contrastive denoising, the decoder (eager: the dn query count follows the batch's
largest box count). The images are fed in [0, 1] without mean/std, as upstream.

v1 and v2 at r18 differ only in the decoder: v2's deformable attention takes per-level point
counts ([4, 4, 4] here, the same computation as v1's 4) and a `discrete` sampling option, and
v2 xavier-initialises the decoder FFN and input projections (v1 keeps torch's defaults); v1
clamps the FFN output to the float16 range before the last norm.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn import init

from ..base import Targets
from ..common import build_model, fold_bn
from ..detr import layers
from ..detr.boxes import inverse_sigmoid
from ..detr.criterion import normalise_targets
from ..detr.denoise import denoising_group, keep_in_graph
from ..detr.layers import MLP, DecoderLayer, EncoderLayer
from ..detr.model import DETRModel
from ..detr.output import DN_LIVE, DETROutput, input_wh
from ..detr.queries import QueryAnchors, take, topk_cells
from ..detr.topk import decode

SIZES = ("r18",)
STRIDES = (8, 16, 32)
HIDDEN = 256


# --------------------------------------------------------------------------- blocks
class ConvNorm(nn.Module):
    """Conv2d (no bias) -> BatchNorm (torch defaults eps 1e-5, momentum 0.1, as upstream's
    ConvNormLayer) -> act; `fuse_()` folds the norm into the conv."""

    def __init__(self, c_in: int, c_out: int, k: int, s: int = 1, act: type[nn.Module] | None = None):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, k, s, (k - 1) // 2, bias=False)
        self.norm: nn.Module = nn.BatchNorm2d(c_out)
        self.act: nn.Module = nn.Identity() if act is None else act()

    def forward(self, x: Tensor) -> Tensor:
        return self.act(self.norm(self.conv(x)))

    @torch.no_grad()
    def fuse_(self) -> None:
        if isinstance(self.norm, nn.Identity):
            return
        weight, bias = fold_bn(self.conv.weight, self.norm)
        c = self.conv
        self.conv = nn.Conv2d(c.in_channels, c.out_channels, c.kernel_size, c.stride, c.padding, bias=True).to(weight)
        self.conv.weight.copy_(weight)
        self.conv.bias.copy_(bias)
        self.norm = nn.Identity()


class BasicBlock(nn.Module):
    """ResNet basic block, variant d: a stride-2 shortcut average-pools (2x2, ceil) then 1x1-convs
    instead of a strided 1x1 (He et al., "Bag of Tricks", 2019). The first block of every stage
    has a projection shortcut, even at stride 1 (upstream Blocks: shortcut=False for i == 0)."""

    def __init__(self, c_in: int, c_out: int, stride: int, project: bool):
        super().__init__()
        self.branch2a = ConvNorm(c_in, c_out, 3, stride, nn.ReLU)
        self.branch2b = ConvNorm(c_out, c_out, 3, 1)
        self.short: nn.Module
        if not project:
            self.short = nn.Identity()
        elif stride == 2:
            self.short = nn.Sequential(nn.AvgPool2d(2, 2, 0, ceil_mode=True), ConvNorm(c_in, c_out, 1, 1))
        else:
            self.short = ConvNorm(c_in, c_out, 1, stride)

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(self.branch2b(self.branch2a(x)) + self.short(x))


class PResNet18vd(nn.Module):
    """ResNet-18-vd: 3-conv deep stem 32-32-64 (stride 2), max-pool, stages of 2 basic blocks at
    64/128/256/512 channels; returns stages 2-4 (strides 8, 16, 32; 128/256/512 channels).
    BatchNorm trains: the r18 configs set freeze_at -1 and freeze_norm False, and we train from
    scratch anyway (upstream's r50+ configs freeze the norms of an ImageNet-pretrained backbone)."""

    channels = (128, 256, 512)

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(ConvNorm(3, 32, 3, 2, nn.ReLU), ConvNorm(32, 32, 3, 1, nn.ReLU),
                                  ConvNorm(32, 64, 3, 1, nn.ReLU))
        stages, c_in = [], 64
        for i, c in enumerate((64, 128, 256, 512)):
            stride = 1 if i == 0 else 2
            stages.append(nn.Sequential(BasicBlock(c_in, c, stride, True), BasicBlock(c, c, 1, False)))
            c_in = c
        self.stages = nn.ModuleList(stages)

    def forward(self, x: Tensor) -> tuple[Tensor, ...]:
        x = F.max_pool2d(self.stem(x), 3, 2, 1)
        outs = []
        for i, stage in enumerate(self.stages):
            x = stage(x)
            if i > 0:
                outs.append(x)
        return tuple(outs)


class RepVGGBlock(nn.Module):
    """3x3 conv-BN + 1x1 conv-BN, summed, then SiLU (Ding et al., RepVGG, 2021); `fuse_()` merges
    both branches into one 3x3 conv with bias (the 1x1 kernel padded to the 3x3 centre)."""

    def __init__(self, c: int):
        super().__init__()
        self.conv1 = ConvNorm(c, c, 3)
        self.conv2 = ConvNorm(c, c, 1)
        self.conv: nn.Conv2d | None = None
        self.act = nn.SiLU()

    def forward(self, x: Tensor) -> Tensor:
        return self.act(self.conv(x) if self.conv is not None else self.conv1(x) + self.conv2(x))

    @torch.no_grad()
    def fuse_(self) -> None:
        if self.conv is not None:
            return
        w3, b3 = fold_bn(self.conv1.conv.weight, self.conv1.norm)
        w1, b1 = fold_bn(self.conv2.conv.weight, self.conv2.norm)
        c = w3.shape[0]
        self.conv = nn.Conv2d(c, c, 3, 1, 1, bias=True).to(w3)
        self.conv.weight.copy_(w3 + F.pad(w1, [1, 1, 1, 1]))
        self.conv.bias.copy_(b3 + b1)
        del self.conv1, self.conv2


class CSPRepLayer(nn.Module):
    """CCFF's fusion block: two 1x1 branches (SiLU) of width expansion x c_out, one through
    `blocks` RepVGG blocks, summed, then a 1x1 back to c_out when the widths differ."""

    def __init__(self, c_in: int, c_out: int, blocks: int = 3, expansion: float = 0.5):
        super().__init__()
        hidden = int(c_out * expansion)
        self.conv1 = ConvNorm(c_in, hidden, 1, 1, nn.SiLU)
        self.conv2 = ConvNorm(c_in, hidden, 1, 1, nn.SiLU)
        self.bottlenecks = nn.Sequential(*(RepVGGBlock(hidden) for _ in range(blocks)))
        self.conv3 = ConvNorm(hidden, c_out, 1, 1, nn.SiLU) if hidden != c_out else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        return self.conv3(self.bottlenecks(self.conv1(x)) + self.conv2(x))


class HybridEncoder(layers.HybridEncoder):
    """Input projections (1x1 conv + BN) to 256, AIFI (one transformer layer, 8 heads, FFN 1024,
    dropout 0, GELU) on the stride-32 map, then CCFF: a top-down FPN (1x1 lateral conv, nearest
    2x upsampling, CSPRepLayer) and a bottom-up PAN (3x3 stride-2 conv, CSPRepLayer).
    r18: expansion 0.5, depth_mult 1 (3 RepVGG blocks), act SiLU (rtdetr*_r18vd configs)."""

    def __init__(self, in_channels: Sequence[int], hidden: int = HIDDEN, expansion: float = 0.5, blocks: int = 3):
        super().__init__()
        self.hidden = hidden
        self.input_proj = nn.ModuleList(ConvNorm(c, hidden, 1) for c in in_channels)
        self.aifi = EncoderLayer(hidden, 8, 1024, 0.0)
        n = len(in_channels)
        self.lateral = nn.ModuleList(ConvNorm(hidden, hidden, 1, 1, nn.SiLU) for _ in range(n - 1))
        self.fpn = nn.ModuleList(CSPRepLayer(2 * hidden, hidden, blocks, expansion) for _ in range(n - 1))
        self.down = nn.ModuleList(ConvNorm(hidden, hidden, 3, 2, nn.SiLU) for _ in range(n - 1))
        self.pan = nn.ModuleList(CSPRepLayer(2 * hidden, hidden, blocks, expansion) for _ in range(n - 1))


class Capturable(nn.Module):
    """images -> the decoder's projected encoder maps [B, 256, H/s, W/s], s = 8, 16, 32."""

    def __init__(self, xavier_proj: bool):
        super().__init__()
        self.backbone = PResNet18vd()
        self.encoder = HybridEncoder(PResNet18vd.channels)
        # The decoder's own input projections (1x1 conv + BN, 256 -> 256): static, so captured.
        self.decoder_proj = nn.ModuleList(ConvNorm(HIDDEN, HIDDEN, 1) for _ in STRIDES)
        if xavier_proj:  # rtdetrv2_decoder.py _reset_parameters
            for p in self.decoder_proj:
                init.xavier_uniform_(p.conv.weight)

    def forward(self, images: Tensor) -> tuple[Tensor, ...]:
        return tuple(p(f) for p, f in zip(self.decoder_proj, self.encoder(self.backbone(images))))


# --------------------------------------------------------------------------- decoder
class RTDETRDecoder(nn.Module):
    """Query selection + contrastive denoising + deformable decoder with iterative refinement.

    Query selection (both versions): memory = encoder tokens zeroed where the anchor is invalid,
    enc_output (Linear + LayerNorm), enc_score_head (Linear -> classes, bias prior 0.01),
    enc_bbox_head (MLP 3 layers, last zero-init) + anchor logits; the top-300 tokens by their
    max class score give the content queries (detached memory: learn_query_content False) and
    the reference boxes (detached). Anchors: cell centres, wh 0.05 x 2^level, invalid when any
    coordinate is outside (0.01, 0.99) (eps 1e-2), logit form, +inf where invalid.
    Decoder (r18: 3 layers, 8 heads, 4 points, 3 levels, FFN 1024): per layer the query position
    is query_pos_head(ref) (MLP 4 -> 512 -> 256), the refined box sigmoid(bbox_head(x) +
    logit(ref)); the next layer's ref is that box detached, while the box that layer i > 0 is
    supervised with adds its delta to the previous layer's undetached box (upstream's
    look-forward-twice). Denoising: num_denoising 100, label noise 0.5, box noise 1.0, class
    embedding of num_classes + 1 with padding_idx num_classes.
    """

    def __init__(self, num_classes: int, version: str, cross_attn_method: str = "default",
                 num_queries: int = 300, layers: int = 3, num_denoising: int = 100):
        super().__init__()
        self.num_classes, self.num_queries, self.version = num_classes, num_queries, version
        self.num_denoising = num_denoising
        points = 4 if version == "v1" else [4, 4, 4]
        v1 = version == "v1"
        self.layers = nn.ModuleList(DecoderLayer(HIDDEN, 8, 1024, 0.0, len(STRIDES), points, cross_attn_method,
                                                 xavier_ffn=not v1, clamp_fp16=v1) for _ in range(layers))
        self.denoising_class_embed = nn.Embedding(num_classes + 1, HIDDEN, padding_idx=num_classes)
        self.query_pos_head = MLP(4, 2 * HIDDEN, HIDDEN, 2)
        self.enc_output = nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.LayerNorm(HIDDEN))
        self.enc_score_head = nn.Linear(HIDDEN, num_classes)
        self.enc_bbox_head = MLP(HIDDEN, HIDDEN, 4, 3)
        self.dec_score_head = nn.ModuleList(nn.Linear(HIDDEN, num_classes) for _ in range(layers))
        self.dec_bbox_head = nn.ModuleList(MLP(HIDDEN, HIDDEN, 4, 3) for _ in range(layers))
        self.anchors = QueryAnchors()  # eps 0.01, size 0.05 * 2^level
        self._reset_parameters()

    @torch.no_grad()
    def _reset_parameters(self) -> None:
        bias = -4.59511985013459  # bias_init_with_prob(0.01) = -log((1 - 0.01) / 0.01)
        init.constant_(self.enc_score_head.bias, bias)
        for head in (self.enc_bbox_head, *self.dec_bbox_head):
            init.zeros_(head.layers[-1].weight)
            init.zeros_(head.layers[-1].bias)
        for head in self.dec_score_head:
            init.constant_(head.bias, bias)
        init.xavier_uniform_(self.enc_output[0].weight)
        init.xavier_uniform_(self.query_pos_head.layers[0].weight)
        init.xavier_uniform_(self.query_pos_head.layers[1].weight)

    def forward(self, feats: Sequence[Tensor], targets: Targets | None, input_hw: tuple[int, int],
                static: bool = False) -> DETROutput:
        b = feats[0].shape[0]
        shapes = [(int(f.shape[2]), int(f.shape[3])) for f in feats]
        memory = torch.cat([f.flatten(2).transpose(1, 2) for f in feats], 1)  # [B, A, 256]
        anchors, valid = self.anchors(shapes, memory)
        # The proposals see invalid (border) cells as zeros; the decoder's cross-attention samples
        # the unmasked memory (upstream masks inside _get_decoder_input only).
        out_memory = self.enc_output(memory * valid.to(memory.dtype))
        enc_logits_all = self.enc_score_head(out_memory)
        enc_coord_all = self.enc_bbox_head(out_memory) + anchors
        index = topk_cells(enc_logits_all, self.num_queries)  # [B, Q]; fewer cells than 300: all
        q = index.shape[1]
        enc_logits, enc_coord = take(enc_logits_all, index), take(enc_coord_all, index)
        content, ref_unact = take(out_memory, index).detach(), enc_coord.detach()

        dn = None
        wh = input_wh(b, *input_hw, memory.device)
        if self.training and targets is not None and self.num_denoising > 0:
            tg = normalise_targets(targets, wh)
            dn = denoising_group(tg.labels, tg.boxes, tg.valid, self.num_classes, q,
                                 self.denoising_class_embed, self.num_denoising, static=static)
        d = 0 if dn is None else dn.num_queries
        attn_mask = None
        if dn is not None:
            content = torch.cat((dn.queries.to(content.dtype), content), 1)
            ref_unact = torch.cat((dn.boxes_unact.to(ref_unact.dtype), ref_unact), 1)
            attn_mask = dn.attn_mask
        elif self.training:
            content = keep_in_graph(content, self.denoising_class_embed)

        logits, boxes = self._decode(content, ref_unact, memory, shapes, attn_mask)
        empty = torch.zeros(b, 0, dtype=torch.long, device=memory.device)
        return DETROutput(
            logits[:, :, d:], boxes[:, :, d:], enc_logits.unsqueeze(1), enc_coord.sigmoid().unsqueeze(1),
            logits[:, :, :d], boxes[:, :, :d],
            empty if dn is None else dn.target,
            torch.ones(b, device=memory.device) if dn is None else dn.groups,
            {"input_wh": wh, **({} if dn is None else {DN_LIVE: dn.live.expand(b, -1)})})

    def _decode(self, x: Tensor, ref_unact: Tensor, memory: Tensor, shapes, attn_mask) -> tuple[Tensor, Tensor]:
        """-> (logits [B, L, D + Q, C], boxes [B, L, D + Q, 4]); eval mode: the last layer only."""
        ref = ref_unact.sigmoid()  # detached reference of the current layer
        prev = None                # the previous layer's box with its graph
        logits, boxes = [], []
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x = layer(x, ref.unsqueeze(2), memory, shapes, attn_mask, self.query_pos_head(ref))
            delta = self.dec_bbox_head[i](x)
            box = (delta + inverse_sigmoid(ref)).sigmoid()
            if self.training:
                logits.append(self.dec_score_head[i](x))
                boxes.append(box if prev is None else (delta + inverse_sigmoid(prev)).sigmoid())
            elif i == last:
                logits.append(self.dec_score_head[i](x))
                boxes.append(box)
            prev, ref = box, box.detach()
        return torch.stack(logits, 1), torch.stack(boxes, 1)


# --------------------------------------------------------------------------- the model
class RTDETRModel(DETRModel):
    """Training model (families/base.py; docs/architecture.md, "DETR families"): `capturable` = backbone +
    encoder (+ the decoder's input projections), `forward_train` the eager decoder."""

    version = "v1"

    def __init__(self, size: str, num_classes: int, cross_attn_method: str = "default"):
        super().__init__()
        self.size, self.num_classes, self.strides = size, num_classes, STRIDES
        self.net = Capturable(xavier_proj=self.version == "v2")
        self.decoder = RTDETRDecoder(num_classes, self.version, cross_attn_method)

    def forward_train(self, captured: tuple[Tensor, ...], targets: Targets | None = None) -> DETROutput:
        h, w = captured[0].shape[2] * STRIDES[0], captured[0].shape[3] * STRIDES[0]
        return self.decoder(captured, targets, (h, w), static=self.static_shapes)

    def predict(self, images: Tensor) -> Tensor:
        """[B, Q, 4 + C]: xyxy input pixels, then sigmoid scores (float32); the last layer only."""
        out = self.forward_train(self.net(images), None)
        with torch.autocast(images.device.type, enabled=False):
            return decode(out.logits[:, -1], out.boxes[:, -1], tuple(images.shape[2:]))


class RTDETRv2Model(RTDETRModel):
    version = "v2"


def build(size: str, num_classes: int) -> RTDETRModel:
    return build_model(RTDETRModel, "RT-DETR", SIZES, size, num_classes)


def build_v2(size: str, num_classes: int) -> RTDETRv2Model:
    return build_model(RTDETRv2Model, "RT-DETRv2", SIZES, size, num_classes)
