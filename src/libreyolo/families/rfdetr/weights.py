"""RF-DETR's published weights for its ViT: the backbone an RF-DETR training run starts from.

The published sizes' ViT is DINOv2-S re-cut to patch 16 and a 24 / 32 / 36 grid of positions,
so DINOv2's own release does not fit it (upstream's DinoV2 declines to load it whenever the patch
size is not 14 or the grid differs from 37: rfdetr/models/backbone/dinov2.py): the trained ViT
exists only inside the released RF-DETR checkpoints, `rf-detr-{nano,small,medium}.pth`
(rfdetr/config.py `pretrain_weights`, hosted by Roboflow; Apache-2.0 per the RF-DETR README's model
table, which licenses XL and 2XL under PML 1.0 instead: those are not built here). Those files are a
training checkpoint, `{"model": state dict, "args": argparse.Namespace, ...}`; the ViT's tensors
are under `backbone.0.encoder.encoder.` in Hugging Face's DINOv2 names. They are fetched by that
name through the path official weights take (resolve.fetch_weights, which the facade hands down:
the cache, then `$LIBREYOLO_WEIGHTS_URL/<name>`), so a copy under that URL is all it takes; without
it (offline) the ViT trains from random init, said in one line.

Upstream's names against ours (vit.py): separate query/key/value linears (ours one fused `qkv`),
`layer_scale{1,2}.lambda1` (ours `ls1`/`ls2`), `embeddings.*`, `encoder.layer.N.*`, `layernorm`;
DINOv2's `mask_token` (masked pretraining only) is dropped.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from ...errors import CheckpointError
from ..common import load_published_part

BACKBONE_WEIGHTS = {"n": "rf-detr-nano.pth", "s": "rf-detr-small.pth", "m": "rf-detr-medium.pth"}
PREFIX = "backbone.0.encoder.encoder."
_RENAME = {"embeddings.cls_token": "cls_token", "embeddings.position_embeddings": "pos_embed",
           "embeddings.patch_embeddings.projection.weight": "patch_embed.weight",
           "embeddings.patch_embeddings.projection.bias": "patch_embed.bias",
           "layernorm.weight": "norm.weight", "layernorm.bias": "norm.bias"}
_BLOCK = {"norm1": "norm1", "norm2": "norm2", "attention.output.dense": "attn.proj", "mlp.fc1": "fc1",
          "mlp.fc2": "fc2"}


def upstream_to_ours(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The ViT part of an RF-DETR state dict -> `WindowedDINOv2.state_dict()` keys."""
    vit = {k[len(PREFIX):]: v for k, v in state.items() if k.startswith(PREFIX)}
    out = {ours: vit[theirs] for theirs, ours in _RENAME.items() if theirs in vit}
    blocks = sorted({int(k.split(".")[2]) for k in vit if k.startswith("encoder.layer.")})
    for i in blocks:
        src, dst = f"encoder.layer.{i}.", f"blocks.{i}."
        for part, ours in _BLOCK.items():
            for kind in ("weight", "bias"):
                if f"{src}{part}.{kind}" in vit:
                    out[f"{dst}{ours}.{kind}"] = vit[f"{src}{part}.{kind}"]
        for n in (1, 2):
            if f"{src}layer_scale{n}.lambda1" in vit:
                out[f"{dst}ls{n}"] = vit[f"{src}layer_scale{n}.lambda1"]
        for kind in ("weight", "bias"):
            qkv = [vit.get(f"{src}attention.attention.{p}.{kind}") for p in ("query", "key", "value")]
            if all(t is not None for t in qkv):
                out[f"{dst}attn.qkv.{kind}"] = torch.cat(qkv)
    return out


def read_state(path: Path) -> dict[str, torch.Tensor]:
    """The model state dict of a released RF-DETR file (its `model` entry, or the file itself);
    CheckpointError in one line on anything else."""
    try:
        # weights_only, with the one class upstream pickles besides tensors: its argparse args
        with torch.serialization.safe_globals([argparse.Namespace]):
            ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a truncated file, an HTML page, a pickle weights_only refuses
        raise CheckpointError(f"'{path}' is not a readable RF-DETR checkpoint ({type(exc).__name__})") from None
    state = ckpt.get("model", ckpt) if isinstance(ckpt, dict) else None
    if not isinstance(state, dict) or not state or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"'{path}' holds no state dict of tensors")
    return state


def load_backbone(model: nn.Module, fetch_weights: Callable) -> str:
    """`FamilySpec.pretrained` of RF-DETR: the size's released ViT weights into `model`'s ViT, or
    why not."""
    return load_published_part(model.net.backbone, f"RF-DETR-{model.size}'s ViT", BACKBONE_WEIGHTS[model.size],
                               fetch_weights, lambda path: upstream_to_ours(read_state(path)), "released")
