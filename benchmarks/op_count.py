"""Operators one training step dispatches, per phase: the launch count a step costs, on any machine.

    python benchmarks/op_count.py [--models yolo9-t yolox-t rtmdet-t] [--batch 8] [--imgsz 256]
                                  [--device cpu] [--json out.json]

On a GPU nearly every operator that is not a view is one kernel launch, and on a slow host each
launch costs ~10 us of CPU (docs/training-performance.md), so these counts say where an eager
step's host time goes without a GPU. The step is the real one (`train_step` on the context
`build_step_context` builds: optimizer, clipping, EMA) on one batch of `shapes`, counted after two
warm-up steps (anchor caches, optimizer state). Views (`view`, `expand`, `unbind`, ...) are
counted apart: they launch nothing; `by_name` in the JSON has every operator's count per phase. On CPU, autocast is off and the optimizer is foreach rather
than fused, so `forward` lacks autocast's casts and `optimizer` differs from a CUDA step; the
loss, backward and EMA counts carry over. Prints a table; `--json` writes the records.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import sys
import tempfile
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from libreyolo import markers

VIEWS = frozenset({"view", "_unsafe_view", "reshape", "expand", "unsqueeze", "squeeze", "unbind", "split",
                   "split_with_sizes", "chunk", "select", "slice", "transpose", "t", "permute", "detach",
                   "alias", "unflatten", "flatten", "as_strided", "view_as", "expand_as", "narrow",
                   "lift_fresh", "_reshape_alias"})
PHASES = ("h2d", "forward", "loss", "backward", "optimizer", "ema")


class PhaseCounter(TorchDispatchMode):
    """Counts the operators dispatched under each step phase (the step's own `phase` markers)."""

    def __init__(self):
        super().__init__()
        self.current = "other"
        self.ops: collections.Counter = collections.Counter()
        self.views: collections.Counter = collections.Counter()
        self.by_name: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)

    @contextlib.contextmanager
    def phase(self, name: str):  # the recorder interface of libreyolo.markers
        outer, self.current = self.current, name
        try:
            yield
        finally:
            self.current = outer

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in VIEWS:
            self.views[self.current] += 1
        else:
            self.ops[self.current] += 1
            self.by_name[self.current][name] += 1
        return func(*args, **(kwargs or {}))


def count(model: str, batch: int, imgsz: int, device: str) -> dict:
    from libreyolo.bench import load_arm, prepare
    from libreyolo.engine.step import train_step

    user = {"model": model, "data": "shapes", "batch": batch, "imgsz": imgsz, "device": device, "nbs": batch}
    with tempfile.TemporaryDirectory() as tmp:
        prepare(user, Path(tmp))
        ctx, one_batch, _ = load_arm(Path(tmp), "eager")
    for _ in range(2):
        train_step(ctx, one_batch, update=True)
    counter = PhaseCounter()
    markers.set_recorder(counter)
    try:
        with counter:
            train_step(ctx, one_batch, update=True)
    finally:
        markers.set_recorder(None)
    return {"model": model, "batch": batch, "imgsz": imgsz, "device": str(ctx.device), "torch": torch.__version__,
            "precision": ctx.precision.describe(),
            "ops": {p: counter.ops[p] for p in PHASES}, "views": {p: counter.views[p] for p in PHASES},
            "total_ops": sum(counter.ops[p] for p in PHASES),
            "by_name": {p: dict(counter.by_name[p].most_common()) for p in PHASES}}


def table(records: list[dict]) -> str:
    head = "| model | " + " | ".join(PHASES) + " | all |"
    rows = [head, "|" + "---|" * (len(PHASES) + 2)]
    rows += [f"| {r['model']} | " + " | ".join(str(r["ops"][p]) for p in PHASES) + f" | {r['total_ops']} |"
             for r in records]
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["yolo9-t", "yolox-t", "rtmdet-t"])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--imgsz", type=int, default=256)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    records = [count(m, args.batch, args.imgsz, args.device) for m in args.models]
    if args.json:
        args.json.write_text(json.dumps(records, indent=1))
    print(table(records))


if __name__ == "__main__":
    sys.exit(main())
