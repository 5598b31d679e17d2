"""The family contract.

A family is one folder (`families/<name>/`) with its network, loss/assigner and a `spec.py` that
declares a `FamilySpec`; `families/__init__.py` registers it with one line (`register`, below, with
`REGISTRY` and `get_family`: the registry's mechanism lives here, beside the spec it holds, so a
spec can name another family, `inherits`, and look it up without importing the registry's lines). Everything else in
LibreYOLO (trainer, CUDA graphs, profiler, CLI, docs) works from the spec and this contract.

Training model contract (an `nn.Module` returned by `FamilySpec.build`):
- `model.capturable`: `nn.Module` mapping `images [B,3,H,W] -> tuple[Tensor, ...]` with static
  shapes for a static input shape. This is what CUDA graphs capture.
- `model.forward_train(captured, targets) -> preds`: the eager rest (identity for YOLO-style).
- `model.predict(images) -> Tensor`: inference, in the form the task declares
  (`tasks/<task>.py`, `TaskSpec.predicts`; detection: [B, N, 4 + num_classes], boxes xyxy in input
  pixels then per-class scores in [0, 1]); used by validation.
- `model.num_classes` (and `model.strides` for the detectors).
- optionally `model.rows_per_cell` (default 1): a detector's `predict` rows per feature-map cell;
  3 for YOLOv7, whose head predicts one box per anchor and has three anchors per cell.
- optionally `model.end_to_end = True`: `predict` already holds one prediction per object (DETR's
  queries), so validation and predict take the top-k (query, class) scores instead of NMS.
- optionally `model.set_epoch(epoch, cfg) -> reason | None`: an epoch-dependent change of what
  the captured region computes (YOLOX's L1 term); a reason re-arms the CUDA graphs.
- optionally `model.static_shapes = False`: a model that sizes part of its training step by the
  data, with a host read, sets this attribute; set to True (cuda_graph=full does, engine/fullstep.py)
  it sizes that part by the input's shapes alone, the padded Targets' width M included, and masks
  what the data leaves unused, computing the same loss. The DETRs' denoising: 2 max(100, M)
  query slots instead of 2 K G for the largest box count K (families/detr/denoise.py).
- optionally `model.graph_note: str`: how graphed training differs from eager for this model,
  logged once by the graph manager (engine/graphs.py) at the first capture. SegFormer's: its
  drop-path draws random numbers inside the captured region, and a replayed graph draws its own
  stream (statistically, not bitwise, eager's).
The criterion: `loss, loss_items = criterion(preds, targets)` where `loss` is a scalar already
multiplied by the batch size, and `loss_items` a detached 1-D tensor (never `.item()` in the
step) whose entries are named by `criterion.item_names`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import nn

from ..errors import ModelNameError
from ..names import arch_name


class Targets(NamedTuple):
    """Dense, padded targets of one batch.

    boxes  [B, M, 4] float32, xyxy in pixels of the network input;
    labels [B, M]    int64 class ids (0 where padded);
    valid  [B, M]    bool, True for real boxes.
    M = max boxes in the batch rounded up to a multiple of 8 (at least 8).
    """

    boxes: torch.Tensor
    labels: torch.Tensor
    valid: torch.Tensor

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Targets:
        return Targets(*(t.to(device, non_blocking=non_blocking) for t in self))


def backbone_of(model: nn.Module) -> nn.Module:
    """`FamilySpec.backbone` for a family whose model names its backbone `backbone` (the DETRs, the
    segmenters): that sub-module, a DDP wrapper's model's too."""
    return getattr(model, "module", model).backbone


@dataclass(frozen=True)
class CapturePlan:
    """What CUDA graphs may capture for a family: 'network', 'encoder' or 'none' (with a reason).

    `note` is the user-facing remark in the support matrix (docs/training-performance.md).
    `whole`: why `cuda_graph=full` cannot capture the family's whole step (it trains with the
    region above, saying this), or "" when it can; tests/unit/test_fullstep.py runs every family's
    step under the capture check and holds the two to agree."""

    region: str
    reason: str = ""
    note: str = ""
    whole: str = ""


@dataclass(frozen=True)
class FamilySpec:
    """Everything the rest of LibreYOLO needs to know about a family."""

    name: str                                   # registry name, e.g. "yolo9"
    display: str                                # as the literature writes it, e.g. "YOLOv9"
    sizes: tuple[str, ...]                      # e.g. ("t", "s", "m", "c")
    build: Callable[[str, int], nn.Module]      # (size, num_classes) -> training model
    criterion: Callable[[nn.Module, Any], Callable]  # (model, cfg) -> criterion
    weights_prefix: str                         # "LibreYOLO9" -> LibreYOLO9s.pt
    aliases: tuple[str, ...] = ()               # extra arch-name spellings ("yolov9")
    tasks: tuple[str, ...] = ("detect",)          # what it can do (tasks/); the first is its default
    defaults: dict[str, Any] = field(default_factory=dict)  # config overrides for this family
    capture: CapturePlan = CapturePlan("network")
    size_names: dict[str, str] = field(default_factory=dict)  # long spellings: {"tiny": "t"}
    joiner: str = "-"                           # between name and size in the arch name: yolo9-t, resnet18
    # Where a size's published recipe differs from the family's: {"t": {"mixup": 0.0}}.
    size_defaults: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Keys of the recipe (defaults, size_defaults, an inherited family's) tuned for a long COCO
    # schedule: under `recipe=auto` they apply only to runs of over 10,000 optimizer steps, and a
    # shorter run (a fine-tune) trains with their generic defaults (engine/recipe.py).
    long_run: tuple[str, ...] = ()
    # Another family whose recipe this one starts from (RT-DETRv4 trains DEIM's): its family
    # defaults come first, then this family's own, then the size's. The parent's size_defaults are
    # not inherited (sizes are this family's). A registry name, resolved when asked.
    inherits: str = ""
    # The sub-module that trains at `backbone_lr x lr0` (DETR recipes give the backbone a lower
    # learning rate); None: one learning rate for the whole model.
    backbone: Callable[[nn.Module], nn.Module] | None = None
    # Published weights for part of the network (EdgeCrafter's distilled ViT) that training from an
    # architecture name starts from: (model, fetch) -> the one line that says what was loaded, or
    # why that part starts from random init (offline, say). `fetch(name, check)` is the official
    # weights' path (resolve.fetch_weights), handed down by the facade: a part may not import the
    # layers above it. None: a new model is random init throughout.
    pretrained: Callable[[nn.Module, Callable], str] | None = None

    def defaults_for(self, size: str) -> dict[str, Any]:
        """The config overrides a model of this size trains with: family defaults < size defaults."""
        return {key: value for key, (value, _) in self.default_sources(size).items()}

    def default_sources(self, size: str) -> dict[str, tuple[Any, str]]:
        """`defaults_for(size)` with where each value comes from: the family ('yolox'), the family
        it inherits from ('deim' for 'rtdetrv4') or the size ('yolox-t')."""
        sources = {"task": (self.tasks[0], self.name)}  # a model trains its family's first task unless told
        parents, spec = [], self
        while spec.inherits:
            spec = get_family(spec.inherits)
            if spec in parents or spec is self:
                raise ValueError(f"family {self.name} inherits from itself through {spec.name}")
            parents.append(spec)
        for parent in reversed(parents):  # the furthest ancestor first, the nearest overrides it
            sources.update({key: (value, parent.name) for key, value in parent.defaults.items()})
        sources.update({key: (value, self.name) for key, value in self.defaults.items()})
        sources.update({key: (value, arch_name(self, size)) for key, value in self.size_defaults.get(size, {}).items()})
        return sources


# --- the registry: one name, one spec (its lines, one per family, are in families/__init__.py) ----
REGISTRY: dict[str, FamilySpec] = {}


def register(spec: FamilySpec) -> FamilySpec:
    """Add `spec`; a name or alias another family already uses is an error."""
    for name in (spec.name, *spec.aliases):
        taken = _by_name(name)
        if taken is not None:
            raise ValueError(f"family name '{name}' of {spec.name} is already used by {taken.name}")
    REGISTRY[spec.name] = spec
    return spec


def _by_name(name: str) -> FamilySpec | None:
    for spec in REGISTRY.values():
        if name in (spec.name, *spec.aliases):
            return spec
    return None


def get_family(name: str) -> FamilySpec:
    spec = _by_name(name)
    if spec is None:
        raise ModelNameError(f"unknown family '{name}' (known: {', '.join(REGISTRY)})")
    return spec
