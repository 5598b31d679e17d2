"""Hungarian matching of DETR output sets to targets: one batched cost, one solve call.

Cost (rtdetrv2_pytorch/src/zoo/rtdetr/matcher.py HungarianMatcher with the r18 configs'
`weight_dict: {cost_class: 2, cost_bbox: 5, cost_giou: 2}`, `alpha 0.25, gamma 2`):
  class: focal form on p = sigmoid(logit) at the target's class,
         alpha (1 - p)^gamma (-log(p + 1e-8)) - (1 - alpha) p^gamma (-log(1 - p + 1e-8))
  L1   : sum |pred - target| over cxcywh, both normalised by the input size
  GIoU : -GIoU of the xyxy forms
  C = 2 class + 5 L1 + 2 GIoU
Every output set of a step (decoder layers, encoder heads; N = images x sets) is stacked into one
[N, M, Q] cost, rows = targets padded to M, and solved by ONE call.

Padded target rows get the constant cost 0. Why the real rows' optimum is unchanged (Q >= M):
an assignment gives every row a distinct column. Whatever columns the padded rows take, they add
exactly P * 0 = 0, so the total equals the real rows' cost. And every injective map of the R
real rows into the Q columns extends to a full assignment (Q - R >= M - R free columns are left
for the P = M - R padded rows). So the minimisers, restricted to the real rows, are exactly the
minimisers of the real-row problem.

More targets than queries (Q < M): the columns are padded with M - Q dummy queries. The real rows' costs are
shifted to >= 0 (minus the matrix minimum), a real row costs K = max * M + 1 on a dummy (more
than any real-row total) and a padded row 0. An optimum then first keeps as few real rows as
possible on dummies (max(0, R - Q)); with that count fixed the shift is a constant, so it
minimises the real cost: the rectangular optimum upstream's scipy call finds.
Targets left on a dummy are unmatched. That case solves in float64 (K is large).

Host syncs per call (the solve is the only one):
  on CUDA with Triton (compute capability >= 8): none. torch-linear-assignment's Triton solve
      runs without its two input checks (`validation="off"`), each a host read: a NaN/-inf
      check, exact here because `solve` maps NaN and +-inf to finite costs first, and an
      infeasibility flag, which cannot be raised on a finite matrix with rows <= columns (every
      row's search then reaches an unassigned column), the shape `solve` always hands over.
      So the solve can live inside a CUDA graph (cuda_graph=full);
  otherwise ("scipy", or a torch-linear-assignment without that switch): the device->host copy
      of the [N, M, Q] cost (none on CPU tensors), the solve on the host, and the host->device
      copy of the indices (from pageable memory: benchmarks/assign_bench.py counted 2 syncs for
      the pair on the H200). `markers.host_work` tells the capture check, which cannot see a
      host solve on CPU tensors otherwise.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from ... import markers
from .boxes import cxcywh_to_xyxy, pairwise_giou

# rtdetrv2 configs/rtdetrv2/include/rtdetrv2_r50vd.yml (the r18 config inherits it).
COST_CLASS, COST_BBOX, COST_GIOU = 2.0, 5.0, 2.0
FOCAL_ALPHA, FOCAL_GAMMA = 0.25, 2.0

@functools.cache
def _unchecked_triton() -> Callable[[Tensor], Tensor] | None:
    """torch-linear-assignment's Triton solve without its host-read input checks (module
    docstring), or None where the package, Triton or that switch is missing. The switch lives in
    the package's private module (0.1.0: `_triton.batch_linear_assignment(cost, validation=...)`),
    so its signature is checked, not assumed: without it the solve keeps its checks."""
    if _tla() is None:
        return None
    try:
        from torch_linear_assignment import _triton
    except ImportError:  # pragma: no cover - no Triton (a CPU-only torch)
        return None
    fn = getattr(_triton, "batch_linear_assignment", None)
    try:
        takes_switch = fn is not None and "validation" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # pragma: no cover
        takes_switch = False
    return functools.partial(fn, validation="off") if takes_switch else None


def _device_solver(cost: Tensor) -> Callable[[Tensor], Tensor] | None:
    """The solve that stays on the device for this cost, or None (a host solve, or one with host
    reads). The package's own Triton floor: a CUDA tensor on compute capability >= 8."""
    if not cost.is_cuda or torch.cuda.get_device_capability(cost.device) < (8, 0):
        return None
    return _unchecked_triton()


def host_syncs(device: torch.device) -> int:
    """Host syncs of one `solve` on `device` in a training step (module docstring)."""
    if device.type != "cuda":
        return 0
    on_device = torch.cuda.get_device_capability(device) >= (8, 0) and _unchecked_triton() is not None
    return 0 if on_device else 2


@functools.cache
def _tla() -> Callable[[Tensor], Tensor] | None:
    """The Triton solver, or None where torch-linear-assignment is not installed. Imported on the
    first match, not with the module: it imports scipy.optimize (0.7 s on a 2-core machine), which
    every `libreyolo` command would pay, DETR or not, since the registry imports every family."""
    try:
        from torch_linear_assignment import batch_linear_assignment
    except ImportError:  # pragma: no cover - depends on the environment
        return None
    return batch_linear_assignment


class Match(NamedTuple):
    """Per target its matched query: `query [N, M]` long (garbage where `matched` is False) and
    `matched [N, M]` bool = valid target that got a query."""

    query: Tensor
    matched: Tensor


def match_cost(logits: Tensor, boxes: Tensor, labels: Tensor, tgt_boxes: Tensor,
               weights: tuple[float, float, float] = (COST_CLASS, COST_BBOX, COST_GIOU),
               alpha: float = FOCAL_ALPHA, gamma: float = FOCAL_GAMMA) -> Tensor:
    """Upstream's cost for N stacked output sets: logits [N, Q, C], boxes [N, Q, 4] cxcywh,
    labels [N, M], tgt_boxes [N, M, 4] cxcywh (normalised) -> [N, M, Q] float32 (rows: targets)."""
    w_cls, w_l1, w_giou = weights
    logits, boxes, tgt_boxes = logits.float(), boxes.float(), tgt_boxes.float()
    q = logits.shape[1]
    # Only the target classes' logits are needed: gather [N, Q, M] instead of a [N, Q, C] sigmoid.
    p = logits.gather(2, labels.unsqueeze(1).expand(-1, q, -1)).sigmoid()
    pos = alpha * (1 - p).pow(gamma) * -(p + 1e-8).log()
    neg = (1 - alpha) * p.pow(gamma) * -(1 - p + 1e-8).log()
    l1 = torch.cdist(boxes, tgt_boxes, p=1)  # [N, Q, M]
    g = pairwise_giou(cxcywh_to_xyxy(boxes), cxcywh_to_xyxy(tgt_boxes))
    cost = w_cls * (pos - neg) + w_l1 * l1 - w_giou * g
    return cost.transpose(1, 2)


def resolve_backend(backend: str) -> str:
    if backend == "auto":
        return "tla" if _tla() is not None else "scipy"
    if backend not in ("tla", "scipy"):
        raise ValueError(f"matcher backend must be auto, tla or scipy, got {backend!r}")
    if backend == "tla" and _tla() is None:
        raise ImportError("backend 'tla' needs the torch-linear-assignment package")
    return backend


@torch.no_grad()
def solve(cost: Tensor, valid: Tensor, backend: str = "auto") -> Match:
    """Min-cost assignment of the rows (targets) of each [M, Q] matrix in `cost [N, M, Q]`;
    `valid [N, M]` marks the real rows. One solver call for all N matrices."""
    n, m, q = cost.shape
    device = cost.device
    # nan_to_num: a diverged logit must not crash the solver (both backends reject NaN).
    cost = torch.nan_to_num(cost.float(), nan=1e4, posinf=1e4, neginf=-1e4)
    cost = torch.where(valid.unsqueeze(-1), cost, torch.zeros((), device=device))
    if q < m:  # dummy queries, see the module docstring
        cost = cost.double()
        real = valid.unsqueeze(-1)
        lo = torch.where(real, cost, torch.inf).amin((1, 2), keepdim=True)
        lo = torch.where(torch.isfinite(lo), lo, 0.0)  # a matrix without real rows
        cost = torch.where(real, cost - lo, 0.0)  # real rows now cost >= 0
        k = cost.amax((1, 2), keepdim=True) * m + 1  # > any real total, [N, 1, 1]
        dummy = torch.where(real, k, 0.0).expand(n, m, m - q)
        cost = torch.cat((cost, dummy), 2)
    if n == 0 or m == 0:
        col = torch.zeros(n, m, dtype=torch.long, device=device)
    elif resolve_backend(backend) == "tla" and (on_device := _device_solver(cost)) is not None:
        col = on_device(cost.contiguous())
    elif resolve_backend(backend) == "tla":
        markers.host_work("the Hungarian matcher's checked solve (torch-linear-assignment: two host reads on "
                          "CUDA, SciPy on a CPU)")
        col = _tla()(cost.contiguous())
    else:
        markers.host_work("the Hungarian matcher's SciPy solve on the host")
        col = _scipy_solve(cost).to(device, non_blocking=True)
    matched = valid & (col >= 0) & (col < q)
    return Match(col.clamp(0, q - 1) if q > 0 else col.clamp(min=0), matched)


def _scipy_solve(cost: Tensor) -> Tensor:
    """One device->host copy, then scipy's LSAP per matrix (rows <= columns here)."""
    from scipy.optimize import linear_sum_assignment

    host = cost.cpu().numpy()
    col = np.full(host.shape[:2], -1, dtype=np.int64)
    for i, c in enumerate(host):
        rows, cols = linear_sum_assignment(c)
        col[i, rows] = cols
    return torch.from_numpy(col)


@torch.no_grad()
def hungarian_match(logits: Tensor, boxes: Tensor, labels: Tensor, tgt_boxes: Tensor, valid: Tensor,
                    backend: str = "auto", **cost_kw) -> Match:
    """Match N stacked output sets (logits [N, Q, C], boxes [N, Q, 4] cxcywh) to their targets
    (labels [N, M], tgt_boxes [N, M, 4] cxcywh normalised, valid [N, M]) in one solve."""
    return solve(match_cost(logits, boxes, labels, tgt_boxes, **cost_kw), valid, backend)
