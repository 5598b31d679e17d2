"""ECViT's published weights: the distilled backbone an ECDet training run starts from.

EdgeCrafter trains ECDet from an ECViT distilled for detection (`weights_path: ecvits/ecvitt.pth`
in configs/ecdet/ecdet_s.yml; ViTAdapter's `ecvit_url`, released with
github:Intellindust-AI-Lab/EdgeCrafter, Apache-2.0, at capsule2077/edgecrafter releases
`edgecrafterv1`). The files hold upstream's VisionTransformer state dict as released; they are
fetched by that name through the path official weights take (resolve.fetch_weights, which the facade hands down: the cache,
then `$LIBREYOLO_WEIGHTS_URL/<name>`), so a copy of the release under that URL is all it takes.
Without it (offline, or not published there) the ViT trains from random init, said in one line.

Upstream's key layout against ours (vit.py): the patch embedding's conv-BN blocks name their norm
`norm` (ours `bn`), and the RoPE periods are a buffer there (`rope_embed.periods`), computed here:
they are checked against ours, then dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from ...errors import CheckpointError
from ..common import load_published_part
from ..lingbot.rope import BASE

BACKBONE_WEIGHTS = {"s": "ecvitt.pth", "m": "ecvittplus.pth"}
ROPE_KEY = "rope_embed.periods"


def upstream_to_ours(state: dict[str, torch.Tensor], head_dim: int) -> dict[str, torch.Tensor]:
    """Upstream's ECViT state dict -> `ECViT.state_dict()` keys; CheckpointError on RoPE periods
    other than ours (another position scheme: the weights would not mean what they meant)."""
    periods = state.get(ROPE_KEY)
    n = head_dim // 4
    if periods is not None and not torch.allclose(periods.float(), BASE ** (torch.arange(n) / n)):
        raise CheckpointError(f"its RoPE periods are not base-{BASE:g} axial ones of head dimension {head_dim}")
    out = {}
    for key, value in state.items():
        if key == ROPE_KEY or key.endswith("num_batches_tracked"):
            continue
        if key.startswith("patch_embed.convs."):
            key = key.replace(".norm.", ".bn.")
        out[key] = value
    return out


def read_state(path: Path) -> dict[str, torch.Tensor]:
    """A released ECViT file's state dict; CheckpointError in one line on anything else."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a truncated file, an HTML page, a pickle weights_only refuses
        raise CheckpointError(f"'{path}' is not a readable state dict ({type(exc).__name__})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"'{path}' is not a state dict of tensors")
    return state


def load_backbone(model: nn.Module, fetch_weights: Callable) -> str:
    """`FamilySpec.pretrained` of ECDet: the size's ECViT weights into `model`'s ViT, or why not."""
    vit = model.net.backbone.vit
    return load_published_part(vit, f"ECDet-{model.size}'s ViT", BACKBONE_WEIGHTS[model.size], fetch_weights,
                               lambda path: upstream_to_ours(read_state(path), vit.head_dim), "distilled ECViT")
