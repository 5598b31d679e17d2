"""The eager step with gradients handed over by autograd (optim.GradHandoff) against autograd's own
in-place add per parameter: step time and operators dispatched in the backward.

    python benchmarks/grad_handoff.py [--model yolo9-t] [--batch 2] [--imgsz 64] [--steps 30]
                                      [--device cpu] [--json out.json]

Both arms train the same model from the same weights on one batch of random images with boxes,
in one process, alternating arm by arm every step so that the host's drift falls on both; each
arm is its own step context (`build_step_context`, as training builds it), the plain one with
its handoff removed. A small image size makes the step host-bound on a CPU, as an eager step is
on a GPU: the operators saved are launches there. Prints JSON (also written to --json).
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import platform
import statistics
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from libreyolo.config import build_config
from libreyolo.data.loader import Batch, pad_targets
from libreyolo.engine.builder import build_step_context, place_model
from libreyolo.engine.step import train_step
from libreyolo.families import parse_arch


class _Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.__name__] += 1
        return func(*args, **(kwargs or {}))


def _batch(b: int, size: int, boxes: int = 6) -> Batch:
    g = torch.Generator().manual_seed(0)
    xy = torch.rand(b, boxes, 2, generator=g) * size * 0.6
    wh = torch.rand(b, boxes, 2, generator=g) * size * 0.3 + 4
    box_list = [torch.cat([xy[i], xy[i] + wh[i]], -1).numpy() for i in range(b)]
    labels = [torch.randint(0, 3, (boxes,), generator=g).numpy() for _ in range(b)]
    images = torch.randint(0, 255, (b, 3, size, size), dtype=torch.uint8, generator=g)
    return Batch(images, pad_targets(box_list, labels))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="yolo9-t")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--imgsz", type=int, default=64)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json")
    args = ap.parse_args()
    spec, size = parse_arch(args.model)
    device = torch.device(args.device)
    cfg = build_config({"model": args.model, "device": args.device, "batch": args.batch, "imgsz": args.imgsz,
                        "amp": False}, spec.defaults_for(size))
    torch.manual_seed(0)
    model = spec.build(size, 3).train()
    arms = {}
    for name in ("handoff", "plain"):
        ctx = build_step_context(cfg, spec, place_model(copy.deepcopy(model), cfg, device), device)
        if name == "plain":
            ctx.handoff = None
        assert (ctx.handoff is not None) == (name == "handoff"), "graphs are on: no handoff to compare"
        arms[name] = ctx
    batch = _batch(args.batch, args.imgsz)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times = {name: [] for name in arms}
    backward_ops: dict[str, collections.Counter] = {}
    for name, ctx in arms.items():  # warm-up, and the operators of one step
        for _ in range(2):
            train_step(ctx, batch, update=True)
        with _Count() as count:
            train_step(ctx, batch, update=True)
        backward_ops[name] = count.ops
    for _ in range(args.steps):
        for name, ctx in arms.items():
            sync()
            t0 = time.perf_counter()
            train_step(ctx, batch, update=True)
            sync()
            times[name].append((time.perf_counter() - t0) * 1e3)
    same = all(torch.equal(a, b) for a, b in zip(arms["handoff"].params, arms["plain"].params))
    a, b = backward_ops["handoff"], backward_ops["plain"]
    record = {"model": args.model, "batch": args.batch, "imgsz": args.imgsz, "device": str(device),
              "host": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
              "torch": torch.__version__, "steps": args.steps, "weights_identical": same,
              "ops_per_step": {k: sum(v.values()) for k, v in backward_ops.items()},
              # The operators one step dispatches more (+) or fewer (-) with the handoff: detach is a
              # view and new_empty_strided an allocation, neither a kernel launch on a GPU.
              "ops_changed": {k: a[k] - b[k] for k in sorted(set(a) | set(b)) if a[k] != b[k]},
              "step_ms_median": {k: statistics.median(v) for k, v in times.items()},
              "step_ms_min": {k: min(v) for k, v in times.items()}}
    text = json.dumps(record, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
