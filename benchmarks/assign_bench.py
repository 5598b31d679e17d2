"""Hungarian matching for the DETR families: which exact solver, and what it costs per step.

    python benchmarks/assign_bench.py [--device cuda] [--repeat 30] [--out assign.json]

A DETR step matches every output set (decoder layers, the encoder's proposals, D-FINE's pre-head)
of every image to its targets: N = images x sets cost matrices of targets M x queries Q. This
times one solve of the whole stack with each backend, from a cost tensor on `--device` to the
matched query index per target back on it, and counts the host syncs each one makes (torch's
sync debug mode: every synchronizing call warns once). Backends:
  scipy  one device->host copy, `scipy.optimize.linear_sum_assignment` per matrix, one copy back;
  lap    the same with `lap.lapjv` (Jonker-Volgenant, extend_cost for rectangular matrices);
  tla    `torch_linear_assignment.batch_linear_assignment`: one Triton program per matrix on
         CUDA (compute capability >= 8), SciPy on the CPU.
Every backend's total cost is checked against scipy's (exact solvers agree on the optimum).
Costs are the DETR matching cost of random boxes (focal class cost 2, L1 5, GIoU 2), not
uniform noise: the solvers' work depends on the structure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch


def detr_cost(n: int, m: int, q: int, classes: int, device: torch.device, seed: int) -> torch.Tensor:
    """[n, m, q] matching costs of random predictions against random targets."""
    from torchvision.ops import generalized_box_iou

    gen = torch.Generator().manual_seed(seed)

    def boxes(k: int) -> torch.Tensor:  # cxcywh in [0, 1]
        c = torch.rand(n, k, 2, generator=gen) * 0.8 + 0.1
        wh = torch.rand(n, k, 2, generator=gen) * 0.3 + 0.02
        return torch.cat([c, wh], -1)

    pred, gt = boxes(q), boxes(m)
    prob = torch.rand(n, q, classes, generator=gen).pow(3)
    labels = torch.randint(classes, (n, m), generator=gen)
    alpha, gamma = 0.25, 2.0
    neg = (1 - alpha) * prob.pow(gamma) * -(1 - prob + 1e-8).log()
    pos = alpha * (1 - prob).pow(gamma) * -(prob + 1e-8).log()
    cls = (pos - neg).gather(2, labels.unsqueeze(1).expand(-1, q, -1))  # [n, q, m]
    l1 = torch.cdist(pred, gt, p=1)
    xyxy = lambda b: torch.cat([b[..., :2] - b[..., 2:] / 2, b[..., :2] + b[..., 2:] / 2], -1)  # noqa: E731
    giou = torch.stack([generalized_box_iou(xyxy(pred[i]), xyxy(gt[i])) for i in range(n)])
    cost = 2 * cls + 5 * l1 - 2 * giou
    return cost.transpose(1, 2).contiguous().to(device)  # rows = targets


def solve_scipy(cost: torch.Tensor) -> torch.Tensor:
    from scipy.optimize import linear_sum_assignment

    host = cost.detach().to("cpu", torch.float64).numpy()
    out = np.empty(host.shape[:2], dtype=np.int64)
    for i, c in enumerate(host):
        rows, cols = linear_sum_assignment(c)
        out[i, rows] = cols
    return torch.from_numpy(out).to(cost.device)


def solve_lap(cost: torch.Tensor) -> torch.Tensor:
    import lap

    host = cost.detach().to("cpu", torch.float64).numpy()
    out = np.empty(host.shape[:2], dtype=np.int64)
    for i, c in enumerate(host):
        _, x, _ = lap.lapjv(c, extend_cost=True)
        out[i] = x
    return torch.from_numpy(out).to(cost.device)


def solve_tla(cost: torch.Tensor) -> torch.Tensor:
    from torch_linear_assignment import batch_linear_assignment

    return batch_linear_assignment(cost)


BACKENDS = {"scipy": solve_scipy, "lap": solve_lap, "tla": solve_tla}


def total(cost: torch.Tensor, assign: torch.Tensor) -> float:
    return float(cost.double().gather(2, assign.unsqueeze(-1)).sum())


def count_syncs(fn, cost: torch.Tensor) -> int | None:
    if cost.device.type != "cuda":
        return None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn(cost)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    # One warning per synchronising call (torch also warns once that the mode is a prototype).
    return sum("called a synchronizing CUDA operation" in str(w.message) for w in caught)


def bench(name: str, cost: torch.Tensor, repeat: int) -> dict:
    fn = BACKENDS[name]
    fn(cost)  # warm-up: imports, Triton compilation
    times = []
    for _ in range(repeat):
        if cost.is_cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        assign = fn(cost)
        if cost.is_cuda:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return {"backend": name, "ms_median": statistics.median(times), "ms_p10": times[len(times) // 10],
            "ms_p90": times[(9 * len(times)) // 10], "host_syncs": count_syncs(fn, cost),
            "total_cost": total(cost, assign)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--images", type=int, default=8)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--boxes", default="10,100", help="targets per image, comma-separated")
    ap.add_argument("--sets", default="1,7", help="output sets matched per step (1; RT-DETR r18: 3 layers + "
                    "encoder = 4; D-FINE: layers + pre + encoder), comma-separated")
    ap.add_argument("--backends", default="scipy,lap,tla")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    records = []
    for sets in map(int, args.sets.split(",")):
        for m in map(int, args.boxes.split(",")):
            n = args.images * sets
            cost = detr_cost(n, m, args.queries, 80, device, seed=m + sets)
            row = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                   "matrices": n, "images": args.images, "sets": sets, "targets": m, "queries": args.queries}
            results = []
            for name in args.backends.split(","):
                try:
                    results.append(bench(name, cost, args.repeat))
                except ImportError as exc:
                    results.append({"backend": name, "error": f"not installed ({exc.name})"})
            ref = next((r["total_cost"] for r in results if r["backend"] == "scipy" and "total_cost" in r), None)
            for r in results:
                if ref is not None and "total_cost" in r:
                    r["optimal"] = abs(r["total_cost"] - ref) <= 1e-6 * max(1.0, abs(ref))
                records.append({**row, **r})
                print(json.dumps(records[-1]), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"torch": torch.__version__, "records": records}, indent=1) + "\n")
    return 0 if all(r.get("optimal", True) for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
