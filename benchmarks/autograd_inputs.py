"""Host cost of an autograd node by how many differentiable inputs it takes.

    python benchmarks/autograd_inputs.py [--params 61 190 675] [--out result.json]

The graphed region (engine/graphs.py, `_GraphedRegion`) is one autograd node whose backward
replays a CUDA graph that writes the parameters' gradients itself. It used to take every
parameter as an input; it now takes one anchor scalar. This times, on the CPU, one forward and
backward through a node of the same shape (identity forward, backward returning None for every
input) both ways, for the parameter counts of FOMO-0.35 (61), LingBot-Vision-s (190) and
YOLOv9-t (675): the host time per training step that the change removes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch


class _Node(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, *inputs):
        ctx.n = len(inputs)
        return x.clone()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        return (None,) * (1 + ctx.n)


def time_us(inputs: list[torch.Tensor], iters: int) -> float:
    x = torch.zeros(4)
    for _ in range(20):
        _Node.apply(x, *inputs).sum().backward()
    t0 = time.perf_counter()
    for _ in range(iters):
        _Node.apply(x, *inputs).sum().backward()
    return (time.perf_counter() - t0) / iters * 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--params", type=int, nargs="+", default=[61, 190, 675])
    p.add_argument("--iters", type=int, default=300)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    torch.set_num_threads(1)
    anchor = [torch.zeros((), requires_grad=True)]
    rows = []
    for n in args.params:
        params = [torch.zeros(3, requires_grad=True) for _ in range(n)]
        rows.append({"params": n, "every_param_us": time_us(params, args.iters),
                     "anchor_us": time_us(anchor, args.iters)})
    print("| parameters | every parameter an input, us | one anchor, us |\n|---|---|---|")
    for r in rows:
        print(f"| {r['params']} | {r['every_param_us']:.0f} | {r['anchor_us']:.0f} |")
    if args.out:
        args.out.write_text(json.dumps({"torch": torch.__version__, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
