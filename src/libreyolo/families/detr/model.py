"""`DETRModel`: what the DETR families' training models share (the contract: families/base.py).

`net` is the backbone + hybrid encoder, the region CUDA graphs capture; a subclass defines
`forward_train(captured, targets) -> DETROutput` (query selection, denoising, the decoder) and
`predict(images)` ([B, Q, 4 + C], top-k instead of NMS: `end_to_end`).
"""

from __future__ import annotations

from torch import Tensor, nn

from ..base import Targets
from ..common import fuse_model_
from . import DENOISING_HOST_SYNCS, matcher


class DETRModel(nn.Module):
    end_to_end = True              # validation and predict take the top-k (query, class) scores
    net: nn.Module                 # .backbone, then the hybrid encoder
    # The family contract's `static_shapes` (families/base.py): the denoising sizes its queries by
    # the targets' padded width, not by a host read of the largest box count (denoise.py).
    static_shapes = False
    denoising = True               # RF-DETR has none

    @property
    def host_syncs(self) -> int:
        """Host syncs of a training step on CUDA, by design (families/detr/__init__.py)."""
        device = next(self.parameters()).device
        denoising = DENOISING_HOST_SYNCS if self.denoising and not self.static_shapes else 0
        return denoising + matcher.host_syncs(device)

    @property
    def capturable(self) -> nn.Module:
        return self.net

    @property
    def backbone(self) -> nn.Module:
        """What trains at `backbone_lr x lr0` (FamilySpec.backbone)."""
        return self.net.backbone

    def forward(self, images: Tensor, targets: Targets | None = None):
        return self.forward_train(self.net(images), targets) if self.training else self.predict(images)

    def fuse(self) -> DETRModel:
        """Deploy form, in place: BN folded into convs, RepVGG branches merged (eval mode)."""
        fuse_model_(self.eval().net)
        return self
