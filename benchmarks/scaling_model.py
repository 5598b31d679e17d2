"""Predicted training images/s on 1 to 64 GPUs under DDP, from the measured one-GPU step.

    python3 benchmarks/scaling_model.py --models yolo9-t,yolo9-s,rtdetr-r18 --gpus 1,2,4,8,16,32,64 --json out.json
    python3 benchmarks/scaling_model.py --check ddp_scaling.json   # against a measured 1- vs 2-GPU run

Inputs:
- The one-GPU step: `bench step` records (`--steps`, default the H200 files in benchmarks/results/h200/),
  the eager arm of one precision (`--arm float16`). DDP trains eager (CUDA graphs are single-process),
  so N GPUs run the eager step; the graphed arm is the one-GPU figure to beat. From each record: the
  median step, the kernel busy time, and the backward's share of the synchronised phase breakdown.
- What DDP moves, from the model the registry builds (on the meta device: shapes, no weights):
  the gradient of every trainable parameter, in fp32 whatever autocast computes in (the parameters
  are fp32 views of one flat fp32 tensor per optimizer group, engine/optim.py, and DDP all-reduces
  their `.grad` without a compression hook, engine/distributed.py), in DDP's buckets; the module
  buffers (BatchNorm statistics) that DDP broadcasts from rank 0 before the first forward after an
  all-reduce; and the loss's all-reduce of a few floats every micro-batch (GlobalLoss).

One collective on NCCL's ring. nccl-tests (doc/PERFORMANCE.md) defines the bus bandwidth so that an
all-reduce of S bytes over n ranks takes 2(n-1)/n x S / busbw; NCCL's own tuning model
(src/graph/tuning.cc) adds a base latency and one link latency per ring step, of which 2(nodes-1)
cross a node boundary:
    all-reduce  base + (2(n-1) - 2(m-1)) x intra_lat + 2(m-1) x inter_lat + 2(n-1)/n x S / busbw
    broadcast   base + ((n-1) - (m-1)) x intra_lat + (m-1) x inter_lat + S / busbw
with m nodes of `gpus_per_node`. busbw is NVLink's within a node; across nodes every ring also
crosses the network, and the slowest link bounds it: min(NVLink, the node's NICs x their rate).

One optimizer step on N GPUs, per-GPU batch b, accumulating A = round(nbs / (N b)) micro-batches
(engine/optim.py's rule): compute A x step; DDP's own host work, two copies per parameter tensor
(gradient_as_bucket_view=False: into the bucket, back into our flat `.grad`); communication: the
buckets' all-reduces, A loss all-reduces and one buffer broadcast. Two bounds:
- no overlap: compute + DDP host work + every collective, one after the other;
- full overlap: the host and the GPU work side by side and the slower sets the step: the host
  issues A eager steps and DDP's copies; the GPU runs A x kernel busy, the loss all-reduces, the
  broadcast and what of the gradient all-reduce the backward cannot hide. DDP starts a bucket's
  all-reduce as soon as its gradients are ready, but the last bucket (the first layers, whose
  gradients come last) only after the backward: at least that one stays exposed.
`--overlap F` also reports the step F of the way from the first bound to the second.
What the model leaves out: the loader (each process has its own workers), stragglers, SyncBatchNorm's
per-layer collectives (`sync_bn=true`; the recipes of these three models leave it off), NCCL's
other algorithms (tree, NVLS), and the bench step's optimizer update on every micro-batch (an
accumulation micro-batch has none: the compute of A > 1 is slightly over-counted).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from libreyolo.engine.optim import accumulate_steps
from libreyolo.errors import ConfigError, LibreYOLOError

RESULTS = Path(__file__).resolve().parent / "results" / "h200"
DEFAULT_STEPS = sorted(RESULTS.glob("step_*.json")) + sorted((RESULTS / "detr").glob("step_*.json"))

# DDP's bucket sizes at torch's defaults (nn.parallel.DistributedDataParallel bucket_cap_mb=25, and
# dist._DEFAULT_FIRST_BUCKET_BYTES for the first bucket), used from the second step on, when DDP has
# rebuilt its buckets in the order the gradients became ready.
FIRST_BUCKET_BYTES = 1 << 20
BUCKET_BYTES = 25 << 20
# Host time of one small op issued on the H200 host (x.add_(1): 10.42 us, benchmarks/results/h200/
# host_diag.txt); DDP's two copies per parameter tensor are counted at this price. An estimate:
# `--check` reports the price a measured two-GPU run implies.
OP_US = 10.4


@dataclass(frozen=True)
class Fabric:
    """The links a ring crosses. Defaults: an HGX/DGX H200 node and NDR InfiniBand."""

    # NVLink 4 on the H200: 900 GB/s per GPU in both directions together (NVIDIA's H200 product page,
    # nvidia.com/en-us/data-center/h200), 450 GB/s each way; nccl-tests' busbw counts one direction.
    intra_gbs: float = 450.0
    # NDR InfiniBand, 400 Gb/s a port; a DGX H200 has eight such ConnectX-7 ports for the compute
    # fabric, one per GPU (NVIDIA DGX BasePOD deployment guide, "DGX H200/H100 System Network Ports").
    nic_gbit: float = 400.0
    nics: int = 8
    # NCCL's default tuning constants for Ring/Simple, the protocol of large all-reduces
    # (src/graph/tuning.cc, ncclTunerConstantsDefaults): base 8.4 us, NVLink 3.4 us, network 14 us.
    base_lat_us: float = 8.4
    intra_lat_us: float = 3.4
    inter_lat_us: float = 14.0
    gpus_per_node: int = 8

    def nodes(self, n: int) -> int:
        return -(-n // self.gpus_per_node)

    def inter_gbs(self) -> float:
        return self.nics * self.nic_gbit / 8

    def bus_gbs(self, n: int) -> float:
        """busbw of a ring over n GPUs: NVLink's inside one node, the slowest link beyond. NCCL runs
        several rings side by side, each crossing a node boundary through its own NIC, so across
        nodes the rings together get the node's NICs."""
        return self.intra_gbs if self.nodes(n) == 1 else min(self.intra_gbs, self.inter_gbs())


def _latency_s(fabric: Fabric, steps: int, inter_steps: int) -> float:
    us = fabric.base_lat_us + (steps - inter_steps) * fabric.intra_lat_us + inter_steps * fabric.inter_lat_us
    return us * 1e-6


def allreduce(nbytes: float, n: int, fabric: Fabric) -> tuple[float, float]:
    """A ring all-reduce of `nbytes` over n GPUs: (latency s, bytes over the bus)."""
    if n == 1:
        return 0.0, 0.0
    return _latency_s(fabric, 2 * (n - 1), 2 * (fabric.nodes(n) - 1)), 2 * (n - 1) / n * nbytes


def broadcast(nbytes: float, n: int, fabric: Fabric) -> tuple[float, float]:
    """A pipelined ring broadcast of `nbytes` from one GPU: (latency s, bytes over the bus)."""
    if n == 1:
        return 0.0, 0.0
    return _latency_s(fabric, n - 1, fabric.nodes(n) - 1), float(nbytes)


def seconds(cost: tuple[float, float], n: int, fabric: Fabric) -> float:
    latency, volume = cost
    return latency + volume / (fabric.bus_gbs(n) * 1e9)


@dataclass(frozen=True)
class Grads:
    """What DDP moves for one model: bytes per bucket in all-reduce order, buffers, tensor count."""

    tensors: int
    buckets: tuple[int, ...]
    buffer_bytes: int
    dtype: str = "torch.float32"

    @property
    def grad_bytes(self) -> int:
        return sum(self.buckets)


def buckets(sizes: list[int]) -> tuple[int, ...]:
    """DDP's buckets for gradients of `sizes` bytes in ready order: a bucket closes once it holds
    at least its cap (1 MiB for the first, 25 MiB after), as torch's bucket assignment does."""
    out: list[int] = []
    current = 0
    for nbytes in sizes:
        current += nbytes
        if current >= (FIRST_BUCKET_BYTES if not out else BUCKET_BYTES):
            out.append(current)
            current = 0
    return tuple(out + [current] * (current > 0))


def grads_of(arch: str, classes: int) -> Grads:
    """Grads of `arch` built by the registry on the meta device. The gradients become ready in
    about the reverse of the parameter order (the head's first, the stem's last), which is the order
    DDP's rebuilt buckets follow."""
    import torch

    from libreyolo.families import parse_arch

    found = parse_arch(arch)
    if found is None:
        raise ConfigError(f"unknown model '{arch}' (an architecture name such as yolo9-t or rtdetr-r18)")
    spec, size = found
    with torch.device("meta"):
        model = spec.build(size, classes)
    params = [p for p in model.parameters() if p.requires_grad]
    return Grads(tensors=len(params), buckets=buckets([p.numel() * p.element_size() for p in reversed(params)]),
                 buffer_bytes=sum(b.numel() * b.element_size() for b in model.buffers()),
                 dtype=",".join(sorted({str(p.dtype) for p in params})))


@dataclass(frozen=True)
class Step:
    """One GPU's measured training step at per-GPU batch `batch`, in seconds."""

    batch: int
    step_s: float            # the median step (eager: the host's pace)
    busy_s: float            # kernel busy time within it
    backward_s: float        # the backward's part of it (its share of the synchronised breakdown)
    graphed_s: float | None  # the graphed arm's median step, where measured
    source: str


def load_records(paths: list[Path]) -> list[dict]:
    """Every `bench step` record of `paths`, each with the file it came from (as the docs name it)."""
    records = []
    for path in map(Path, paths):
        try:
            rows = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(f"--steps {path}: not a readable bench step JSON ({e})") from None
        full = path.resolve()
        shown = str(full.relative_to(RESULTS.parent) if full.is_relative_to(RESULTS.parent) else path)
        records += [{**r, "file": shown} for r in rows]
    return records


def _step(eager: dict, graphed: dict | None) -> Step:
    if eager.get("kernel_busy_ms") is None:
        raise ConfigError(f"{eager['file']}: {eager['arch']} b{eager['batch']} has no kernel busy time (a CPU run?)")
    synced = eager["synced_ms"]
    step_s = eager["step_ms_median"] / 1e3
    return Step(batch=eager["batch"], step_s=step_s, busy_s=eager["kernel_busy_ms"] / 1e3,
                backward_s=step_s * synced["backward"] / sum(synced.values()),
                graphed_s=graphed["step_ms_median"] / 1e3 if graphed else None, source=eager["file"])


def measured_steps(records: list[dict], arch: str, arm: str, imgsz: int) -> dict[int, Step]:
    """Per benched batch, the Step of `arch`'s eager `arm` at `imgsz` (a later file overrides)."""
    def arm_rows(name):
        return {r["batch"]: r for r in records if r["arch"] == arch and r["arm"] == name and r["imgsz"] == imgsz}

    eager, graphed = arm_rows(arm), arm_rows(f"{arm}+graph")
    if not eager:
        raise ConfigError(f"no bench step record of {arch} arm {arm} at {imgsz} px in --steps")
    return {b: _step(r, graphed.get(b)) for b, r in sorted(eager.items())}


def step_at(steps: dict[int, Step], batch: int) -> Step:
    """The Step at `batch`: measured, or interpolated linearly between the benched batches around it."""
    if batch in steps:
        return steps[batch]
    below, above = [b for b in steps if b < batch], [b for b in steps if b > batch]
    if not below or not above:
        raise ConfigError(f"batch {batch} is outside the benched batches {sorted(steps)}: nothing to interpolate from")
    lo, hi = steps[max(below)], steps[min(above)]
    w = (batch - lo.batch) / (hi.batch - lo.batch)
    mix = lambda a, b: None if a is None or b is None else a + w * (b - a)
    return Step(batch, mix(lo.step_s, hi.step_s), mix(lo.busy_s, hi.busy_s), mix(lo.backward_s, hi.backward_s),
                mix(lo.graphed_s, hi.graphed_s), f"interpolated between b{lo.batch} and b{hi.batch}")


def update_costs(grads: Grads, n: int, fabric: Fabric, accumulate: int) -> dict[str, list[tuple[float, float]]]:
    """The collectives of one optimizer step on n GPUs, each as (latency s, bytes over the bus)."""
    return {"gradients": [allreduce(b, n, fabric) for b in grads.buckets],  # in all-reduce order
            "loss": [allreduce(0, n, fabric)] * accumulate,  # K + 2 floats a micro-batch: latency alone
            "buffers": [broadcast(grads.buffer_bytes, n, fabric)]}


def predict(step: Step, grads: Grads, n: int, fabric: Fabric, nbs: int, overlap: float | None = None,
            op_us: float = OP_US) -> dict:
    """One optimizer step on n GPUs: its time under both bounds, images/s, efficiency, comm share."""
    acc = accumulate_steps(n * step.batch, nbs)
    compute = acc * step.step_s
    costs = update_costs(grads, n, fabric, acc)
    grad, loss, bcast = (sum(seconds(c, n, fabric) for c in costs[k]) for k in ("gradients", "loss", "buffers"))
    last = seconds(costs["gradients"][-1], n, fabric)
    comm = grad + loss + bcast
    ddp_host = 2 * grads.tensors * op_us * 1e-6 if n > 1 else 0.0
    serial = compute + ddp_host + comm
    exposed = max(last, grad - step.backward_s)  # the backward hides what it can, never the last bucket
    overlapped = max(compute + ddp_host, acc * step.busy_s + loss + bcast + exposed)
    times = {"none": serial, "full": overlapped}
    if overlap is not None:
        times["at_overlap"] = serial - overlap * (serial - overlapped)
    images = n * acc * step.batch
    one_gpu = step.batch / step.step_s
    row = {"gpus": n, "nodes": fabric.nodes(n), "batch_per_gpu": step.batch, "global_batch": n * step.batch,
           "accumulate": acc, "compute_ms": compute * 1e3, "comm_ms": comm * 1e3, "ddp_host_ms": ddp_host * 1e3,
           "comm_over_compute": comm / compute, "comm_share": comm / serial, "bus_gbs": fabric.bus_gbs(n)}
    for name, t in times.items():
        row[f"img_s_{name}"] = images / t
        row[f"efficiency_{name}"] = images / t / (n * one_gpu)
        if step.graphed_s is not None:
            row[f"vs_graphed_{name}"] = images / t / (step.batch / step.graphed_s)
    return row


def crossover_gbs(step: Step, grads: Grads, n: int, fabric: Fabric, nbs: int) -> float | None:
    """The node bandwidth (GB/s of NICs) below which communication takes longer than compute on n GPUs
    spread over several nodes (no overlap); None when the latencies alone already exceed compute."""
    acc = accumulate_steps(n * step.batch, nbs)
    costs = [c for kind in update_costs(grads, n, fabric, acc).values() for c in kind]
    latency, volume = sum(c[0] for c in costs), sum(c[1] for c in costs)
    spare = acc * step.step_s - latency
    return volume / spare / 1e9 if spare > 0 else None


def model_report(arch: str, steps: dict[int, Step], grads: Grads, gpus: list[int], fabric: Fabric, nbs: int,
                 overlap: float | None) -> dict:
    report = {"model": arch, "param_tensors": grads.tensors, "grad_bytes": grads.grad_bytes, "grad_dtype": grads.dtype,
              "buckets_bytes": list(grads.buckets), "buffer_bytes": grads.buffer_bytes, "batches": []}
    multi_node = max(gpus) if fabric.nodes(max(gpus)) > 1 else None
    for step in steps.values():
        rows = [predict(step, grads, n, fabric, nbs, overlap) for n in gpus]
        beats = [r["gpus"] for r in rows if r.get("vs_graphed_none", 0) >= 1]
        report["batches"].append({
            "batch_per_gpu": step.batch, "source": step.source, "step_ms": step.step_s * 1e3,
            "busy_ms": step.busy_s * 1e3, "graphed_step_ms": step.graphed_s * 1e3 if step.graphed_s else None,
            "comm_overtakes_compute_at": next((r["gpus"] for r in rows if r["comm_over_compute"] > 1), None),
            "gpus_to_beat_one_graphed": beats[0] if beats else None,
            "crossover_node_gbs": crossover_gbs(step, grads, multi_node, fabric, nbs) if multi_node else None,
            "crossover_at_gpus": multi_node, "rows": rows})
    return report


def table(reports: list[dict], overlap: float | None) -> str:
    at = overlap is not None
    head = ("| model | batch/GPU | GPUs | nodes | accumulate | comm ms | DDP host ms | comm / compute | "
            "img/s (no / full overlap) | efficiency (no / full) |" + (f" img/s, eff. at overlap {overlap:g} |" if at else "")
            + " x one graphed GPU (no overlap) |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for rep in reports:
        for b in rep["batches"]:
            for r in b["rows"]:
                lines.append(
                    f"| {rep['model']} | {r['batch_per_gpu']} | {r['gpus']} | {r['nodes']} | {r['accumulate']} | "
                    f"{r['comm_ms']:.2f} | {r['ddp_host_ms']:.1f} | {r['comm_over_compute']:.3f} | "
                    f"{r['img_s_none']:.0f} / {r['img_s_full']:.0f} | {r['efficiency_none']:.3f} / {r['efficiency_full']:.3f} |"
                    + (f" {r['img_s_at_overlap']:.0f}, {r['efficiency_at_overlap']:.3f} |" if at else "")
                    + (f" {r['vs_graphed_none']:.2f} |" if "vs_graphed_none" in r else " - |"))
    return "\n".join(lines)


def check(path: Path, records: list[dict], fabric: Fabric, nbs: int, overlap: float | None, op_us: float) -> dict:
    """The model against a measured 1- vs N-GPU run of benchmarks/ddp_scaling.py. The one-GPU step is
    the measured run's own (its images/s, loader and all); kernel busy time and the backward's share
    come from the bench step records at that batch."""
    try:
        doc = json.loads(Path(path).read_text())
        setup, summary = doc["setup"], doc["summary"]
        arch, batch, gpus, classes = setup["model"], int(setup["batch_per_gpu"]), int(setup["gpus"]), int(setup["classes"])
        one, many = float(summary["img_s_1gpu"]), float(summary["img_s_2gpu"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"--check {path}: not a ddp_scaling.py result with a setup and both arms' images/s "
                          f"({type(e).__name__}: {e})") from None
    bench = step_at(measured_steps(records, arch, setup["amp_dtype"], int(setup["imgsz"])), batch)
    step_s = batch / one
    step = dataclasses.replace(bench, step_s=step_s, backward_s=bench.backward_s * step_s / bench.step_s,
                               source=f"{path} (one GPU: {one:.1f} img/s); busy and backward share: bench step, "
                                      f"{bench.source}")
    grads = grads_of(arch, classes)
    row = predict(step, grads, gpus, fabric, nbs, overlap, op_us)
    per_update = row["accumulate"] * row["global_batch"]  # images of one optimizer step, all GPUs
    measured, serial, full = per_update / many, per_update / row["img_s_none"], per_update / row["img_s_full"]
    # What the measurement implies for the two uncertain terms, each with the other at its bound.
    copies = 2 * grads.tensors
    implied_op_us = (measured - (row["compute_ms"] + row["comm_ms"]) / 1e3) / copies * 1e6
    if measured > serial:
        verdict = f"below the no-overlap bound: {(measured - serial) * 1e3:.1f} ms per update the model does not count"
    elif measured < full:
        verdict = f"above the full-overlap bound by {(full - measured) * 1e3:.1f} ms per update: the model over-counts"
    else:
        verdict = "within the bounds" + (f", overlap {(serial - measured) / (serial - full):.2f}" if serial > full else "")
    result = {"check": str(path), "model": arch, "batch_per_gpu": batch, "gpus": gpus, "source": step.source,
              "measured_img_s": many, "measured_efficiency": many / (gpus * one), "verdict": verdict,
              "implied_op_us": implied_op_us, "prediction": row}
    print(f"check {path}: {arch}, {batch} images per GPU, {gpus} GPUs, accumulate {row['accumulate']}, "
          f"one-GPU step {step_s * 1e3:.1f} ms ({one:.1f} img/s measured)")
    print(f"measured efficiency {result['measured_efficiency']:.3f} ({many:.1f} img/s); predicted "
          f"{row['efficiency_none']:.3f} (no overlap) to {row['efficiency_full']:.3f} (full overlap)"
          + (f", {row['efficiency_at_overlap']:.3f} at overlap {overlap:g}" if overlap is not None else "")
          + f": {verdict}")
    print(f"per update: compute {row['compute_ms']:.1f} ms, communication {row['comm_ms']:.2f} ms, DDP host work "
          f"{row['ddp_host_ms']:.1f} ms ({copies} copies at {op_us:g} us); the measurement implies "
          f"{implied_op_us:.1f} us a copy with no overlap")
    return result


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of integers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"'{text}': every value must be at least 1")
    return values


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not in [0, 1]")
    return value


def main() -> int:
    from libreyolo.config import TrainConfig

    nbs_default = next(f.default for f in dataclasses.fields(TrainConfig) if f.name == "nbs")
    d = Fabric()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--models", default="yolo9-t,yolo9-s,rtdetr-r18", help="comma-separated architecture names")
    p.add_argument("--gpus", type=_ints, default=[1, 2, 4, 8, 16, 32, 64], help="GPU counts, e.g. 1,2,4,8")
    p.add_argument("--batches", type=_ints, help="per-GPU batches (default: every benched batch)")
    p.add_argument("--arm", default="float16", help="the eager bench arm (precision) DDP trains with")
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--steps", type=Path, nargs="+", default=DEFAULT_STEPS, help="bench step JSON files")
    p.add_argument("--classes", type=int, default=80, help="class count of the model whose gradients move (--check: the run's)")
    p.add_argument("--nbs", type=int, default=nbs_default, help="nominal batch: accumulate round(nbs / global batch)")
    p.add_argument("--overlap", type=_fraction, help="also report the step this fraction of the way to full overlap")
    p.add_argument("--nvlink-gbs", type=float, default=d.intra_gbs, help="NVLink bus bandwidth, GB/s each way")
    p.add_argument("--nic-gbit", type=float, default=d.nic_gbit, help="one inter-node NIC's rate, Gb/s")
    p.add_argument("--nics", type=int, default=d.nics, help="inter-node NICs per node")
    p.add_argument("--gpus-per-node", type=int, default=d.gpus_per_node)
    p.add_argument("--base-lat-us", type=float, default=d.base_lat_us, help="per collective")
    p.add_argument("--nvlink-lat-us", type=float, default=d.intra_lat_us, help="per ring step inside a node")
    p.add_argument("--ib-lat-us", type=float, default=d.inter_lat_us, help="per ring step across nodes")
    p.add_argument("--op-us", type=float, default=OP_US, help="host time of one of DDP's per-parameter copies")
    p.add_argument("--json", type=Path, help="write the predictions here")
    p.add_argument("--check", type=Path, metavar="RESULT.json", help="a ddp_scaling.py result to check the model against")
    args = p.parse_args()
    fabric = Fabric(intra_gbs=args.nvlink_gbs, nic_gbit=args.nic_gbit, nics=args.nics, base_lat_us=args.base_lat_us,
                    intra_lat_us=args.nvlink_lat_us, inter_lat_us=args.ib_lat_us, gpus_per_node=args.gpus_per_node)
    inputs = {"fabric": dataclasses.asdict(fabric), "nbs": args.nbs, "classes": args.classes, "arm": args.arm,
              "imgsz": args.imgsz, "overlap": args.overlap, "op_us": args.op_us}
    try:
        if min(args.nvlink_gbs, args.nic_gbit, args.nics, args.gpus_per_node, args.nbs, args.classes) <= 0:
            raise ConfigError("bandwidths, --nics, --gpus-per-node, --nbs and --classes must be positive")
        records = load_records(args.steps)
        if args.check:
            doc = {"inputs": inputs, **check(args.check, records, fabric, args.nbs, args.overlap, args.op_us)}
        else:
            reports = []
            for arch in (m.strip() for m in args.models.split(",")):
                steps = measured_steps(records, arch, args.arm, args.imgsz)
                if args.batches:
                    steps = {b: step_at(steps, b) for b in args.batches}
                reports.append(model_report(arch, steps, grads_of(arch, args.classes), args.gpus, fabric, args.nbs,
                                            args.overlap))
            print(table(reports, args.overlap))
            doc = {"inputs": inputs, "models": reports}
    except LibreYOLOError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
