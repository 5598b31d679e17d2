"""Operators one call of a family's loss runs, forward and autograd backward apart.

    python benchmarks/loss_ops.py --model fomo-035 [--batch 8] [--imgsz 96] [--json out.json]

`benchmarks/op_count.py` counts a whole step per phase, but its backward is the network's and
the loss's together, and an operator whose kernel calls other operators (e.g.
`binary_cross_entropy_with_logits`) counts once there however many kernels it launches. Here the
loss runs on the real criterion and one real batch of the built-in data (as op_count.py builds
them), on the network's outputs detached into leaves, under torch.profiler (CPU, shapes off):

- `top`: aten operators called from Python (the loss's own code), views included;
- `kernels`: what would each launch a kernel on CUDA: an operator counts once, or as its parts
  where it calls two or more operators that compute (so `binary_cross_entropy_with_logits` counts
  as its nine); views, allocations, conversions that return their input and the CPU's wrapping of
  Python scalar arguments count nothing. An estimate from the CPU trace, not a CUDA trace;
- `nodes`: the autograd nodes of the loss's graph (backward only), each one call of the engine.

Counted on the third call (the first two fill any per-device cache).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

# Operators that launch nothing on CUDA: views and allocations.
NO_KERNEL = frozenset({"view", "_unsafe_view", "reshape", "expand", "unsqueeze", "squeeze", "unbind", "split",
                       "split_with_sizes", "chunk", "select", "slice", "transpose", "t", "permute", "detach",
                       "alias", "unflatten", "flatten", "as_strided", "view_as", "expand_as", "narrow",
                       "lift_fresh", "_reshape_alias", "empty", "empty_like", "empty_strided", "new_empty", "resize_",
                       "result_type", "contiguous"})
CONVERSIONS = ("to", "_to_copy")


def profile_counts(fn) -> tuple[dict, object]:
    """Run `fn()` under the CPU profiler: ({"top", "kernels", "nodes", "by_name"} of what it ran,
    what it returned)."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=False) as prof:
        value = fn()
    events = prof.events()
    top = [e for e in events if e.name.startswith("aten::") and not _aten_parent(e)]
    kernels: collections.Counter = collections.Counter()
    for e in top:
        _kernels(e, kernels)
    # The leaves' gradient accumulation is the benchmark's (in a step the network's backward follows).
    nodes = sum(e.name.startswith("autograd::engine::evaluate_function:") and not e.name.endswith("AccumulateGrad")
                for e in events)
    counts = {"top": len(top), "kernels": sum(kernels.values()), "nodes": nodes, "by_name": dict(kernels.most_common())}
    return counts, value


def _aten_parent(event) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("aten::"):
            return True
        parent = parent.cpu_parent
    return False


def _kernels(event, out: collections.Counter) -> None:
    """Add `event`'s kernels to `out`: itself, or its parts where it calls two or more operators
    that compute. A conversion (`to`) copies only where it has a `copy_` inside (else it returns
    its input); one inside another operator is the CPU's wrapping of a Python scalar argument
    (on CUDA a scalar argument launches nothing) and is skipped."""
    name = event.name[6:]
    if name in NO_KERNEL or (name in CONVERSIONS and not _copies(event)):
        return
    parts = [c for c in event.cpu_children if c.name.startswith("aten::") and _computes(c, name)]
    if len(parts) < 2:
        out[name] += 1
        return
    for c in parts:
        _kernels(c, out)


def _computes(event, parent: str) -> bool:
    name = event.name[6:]
    if name in CONVERSIONS:
        return parent in CONVERSIONS and _copies(event)
    return name not in NO_KERNEL


def _copies(event) -> bool:
    return any(c.name == "aten::copy_" or (c.name[6:] in CONVERSIONS and _copies(c)) for c in event.cpu_children)


def loss_counts(criterion, outs: tuple, targets) -> dict:
    """{"forward", "backward"} counts (`profile_counts`) of `criterion(outs, targets)` and of its
    loss's gradient wrt the floating-point tensors of `outs` (detached into leaves), on the third
    call (the first two fill any per-device cache)."""
    leaves = tuple(t.detach().requires_grad_() if torch.is_tensor(t) and t.is_floating_point() else t for t in outs)
    inputs = [t for t in leaves if torch.is_tensor(t) and t.requires_grad]
    for _ in range(3):
        fwd, (loss, _) = profile_counts(lambda: criterion(leaves, targets))
        bwd, _ = profile_counts(lambda: torch.autograd.grad(loss, inputs, allow_unused=True))  # noqa: B023
    return {"forward": fwd, "backward": bwd}


def count(model: str, batch: int, imgsz: int) -> dict:
    from libreyolo.bench import load_arm, prepare

    user = {"model": model, "batch": batch, "imgsz": imgsz, "device": "cpu", "nbs": batch}
    with tempfile.TemporaryDirectory() as tmp:
        prepare(user, Path(tmp))
        ctx, one_batch, _ = load_arm(Path(tmp), "eager")
    images, targets = one_batch.images.float().div(255.0), one_batch.targets
    with torch.no_grad():
        outs = ctx.model.forward_train(ctx.capturable(images), targets)
    return {"model": model, "batch": batch, "imgsz": imgsz, "torch": torch.__version__,
            **loss_counts(ctx.criterion, outs, targets)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="fomo-035")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--imgsz", type=int, default=96)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(1)
    r = count(args.model, args.batch, args.imgsz)
    if args.json:
        args.json.write_text(json.dumps(r, indent=1))
    print(f"{r['model']} b{r['batch']} {r['imgsz']} px, torch {r['torch']}")
    for phase in ("forward", "backward"):
        c = r[phase]
        print(f"  {phase:8s} top-level aten {c['top']:4d}  kernels {c['kernels']:4d}  autograd nodes {c['nodes']:3d}")
        print("           " + ", ".join(f"{k} {v}" for k, v in c["by_name"].items()))


if __name__ == "__main__":
    sys.exit(main())
