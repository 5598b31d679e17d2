"""`DETROutput`: what a DETR-style `forward_train` returns, batch-first so one image slices out.

Layout (B images, L decoder layers, Q matching queries, D denoising queries, C classes, E
encoder/query-selection heads):
  logits     [B, L, Q, C]  raw logits per decoder layer, the last is the final prediction
  boxes      [B, L, Q, 4]  cxcywh normalised by the input (w, h)
  enc_logits [B, E, Q, C]  the query-selection head(s) on the encoder memory
  enc_boxes  [B, E, Q, 4]
  dn_logits  [B, L, D, C]  denoising queries through every layer (D = 0: none)
  dn_boxes   [B, L, D, 4]
  dn_target  [B, D] long   index into the targets' M that a dn query reconstructs; -1 for the
                           negatives and the padding
  dn_groups  [B] float     the denoising group count (the dn loss divides by it); a tensor, not an
                           int, so slicing keeps it
  extra      dict          family extras, every value batch-first (D-FINE: corners, refs, ...);
                           always `extra["input_wh"]` [B, 2] float, the input (w, h) in pixels,
                           which the criterion needs to normalise the pixel targets
                           and, with dn queries, `extra["dn_live"]` [B, D] bool: False on the dead
                           slots of a static-shape denoising (denoise.py), which the loss leaves out
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

INPUT_WH = "input_wh"
DN_LIVE = "dn_live"


def input_wh(batch: int, h: int, w: int, device: torch.device) -> Tensor:
    """The `extra[INPUT_WH]` entry: [B, 2] (w, h) of the network input. Built with fills, not
    `torch.tensor` (a CPU->CUDA copy that would synchronise the stream every step)."""
    return torch.stack((torch.full((batch,), float(w), device=device), torch.full((batch,), float(h), device=device)), 1)


class DETROutput(NamedTuple):
    logits: Tensor
    boxes: Tensor
    enc_logits: Tensor
    enc_boxes: Tensor
    dn_logits: Tensor
    dn_boxes: Tensor
    dn_target: Tensor
    dn_groups: Tensor
    extra: dict[str, Tensor] = {}

    def slice(self, i: int) -> DETROutput:
        """Image i as a batch of one (every tensor and every `extra` value cut at [i:i+1])."""
        cut = slice(i, i + 1)
        return DETROutput(*(t[cut] for t in self[:-1]), {k: v[cut] for k, v in self.extra.items()})

    def to(self, dtype: torch.dtype) -> DETROutput:
        """Floating tensors cast to `dtype` (the criterion's float32 entry); indices stay long."""
        def cast(t: Tensor) -> Tensor:
            return t.to(dtype) if t.is_floating_point() else t
        return DETROutput(*(cast(t) for t in self[:-1]), {k: cast(v) for k, v in self.extra.items()})

    @property
    def device(self) -> torch.device:
        return self.logits.device
