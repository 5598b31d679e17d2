"""`libreyolo bench step`: time the real training step, one arm per process.

Method (what every figure in docs/training-performance.md means):
- the dataloader is left out: one real batch (augmented, from the dataset) is saved and replayed;
- every arm runs in its own process from the same saved initial weights and batch, so no arm
  inherits another's allocator, autotuner or compiled state;
- after `warmup` steps, `steps` steps are timed without any added synchronisation: a CUDA event is
  recorded at the start of each step, the host synchronises once at the end, and step i's time is
  the gap between consecutive start events (on a CPU, host clocks around each step). We report the
  fastest and the median;
- kernel busy time: up to 8 more steps under the PyTorch profiler with CUDA activity only; the
  union of kernel/memcpy/memset intervals per step. Utilisation = busy / median step;
- synced breakdown: the same number of steps again with a device synchronisation around each
  phase (forward, loss, backward, optimizer+EMA); it adds idle time, so it explains the step's
  composition, never its speed;
- peak memory: `torch.cuda.max_memory_allocated` over the timed steps.
"""

from __future__ import annotations

import contextlib
import json
import logging
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

_T0 = time.perf_counter()  # process start, for the per-stage wall times of an arm

# Arms are deltas on the user's config. `eager` is the config as given. Deltas combine with '+':
# `bfloat16+graph` is the bfloat16 arm with CUDA graphs on.
ARMS: dict[str, dict[str, Any]] = {
    "eager": {},
    "fp32": {"amp": False},
    "float16": {"amp": True, "amp_dtype": "float16"},
    "bfloat16": {"amp": True, "amp_dtype": "bfloat16"},
    "graph": {"cuda_graph": True},
    "full": {"cuda_graph": "full"},
    "compile": {"compile": True},
    "nchw": {"channels_last": False},
    "nhwc": {"channels_last": True},
}
# Kernel busy time comes from a profiled run of this many steps (at most `steps`): the trace of a
# launch-heavy step is large, and busy time per step varies far less than step time does.
PROFILED_STEPS = 8


def arm_delta(arm: str) -> dict[str, Any]:
    """The config delta of an arm name such as `float16+graph`; ConfigError for an unknown part."""
    from .errors import ConfigError

    delta: dict[str, Any] = {}
    for part in arm.split("+"):
        if part not in ARMS:
            raise ConfigError(f"unknown arm '{arm}' (arms: {', '.join(ARMS)}, combined with '+' as in float16+graph)")
        delta.update(ARMS[part])
    return delta


def parse_arms(text: str) -> list[str]:
    """`float16,float16+graph` -> the arm names, each checked; ConfigError for an empty list or entry."""
    from .errors import ConfigError

    arms = [a.strip() for a in text.split(",")]
    if not any(arms):
        raise ConfigError(f"no arms given (arms: {', '.join(ARMS)}, e.g. arms=float16,float16+graph)")
    if not all(arms):
        raise ConfigError(f"empty arm in arms='{text}' (a stray comma?)")
    for arm in arms:
        arm_delta(arm)
    return arms


def inert_levers(arm: str, spec: Any, model: Any, device: Any) -> list[str]:
    """Why the levers of `arm` would change nothing on `device` (empty when every one acts).

    The precision rules and the graph manager's own checks decide, so this says exactly what
    training would do: on a CPU, float16 and bfloat16 autocast and CUDA graphs fall back to
    float32 eager, and such an arm times the same computation as `eager` (the issue saw
    float16+graph '1.11x faster' than an identical arm, inside a 34-44 % run spread)."""
    import torch

    from .engine.graphs import unsupported_reason
    from .engine.precision import bf16_native, resolve

    delta, reasons = arm_delta(arm), []
    if delta.get("amp"):
        dtype = delta["amp_dtype"]
        got = resolve(True, dtype, device.type, bf16_native(device)).dtype
        if got is None:
            reasons.append(f"{dtype} autocast needs a CUDA device")
        elif got is not getattr(torch, dtype):
            reasons.append(f"{dtype} is not native on this GPU (it would run as float16)")
    if delta.get("cuda_graph"):
        why = unsupported_reason(model, spec, device)
        if why:
            reasons.append(why)
    return reasons


def refuse_inert_arms(arms: list[str], spec: Any, model: Any, device: Any) -> None:
    """One ConfigError line naming every arm whose lever cannot act here, before any arm runs."""
    from .errors import ConfigError

    inert = {arm: inert_levers(arm, spec, model, device) for arm in arms}
    inert = {arm: why for arm, why in inert.items() if why}
    if not inert:
        return
    acting = ", ".join(a for a in ARMS if not inert_levers(a, spec, model, device))
    listed = "; ".join(f"'{arm}' ({', '.join(why)})" for arm, why in inert.items())
    raise ConfigError(f"bench arms whose lever cannot act on {device}: {listed}; they would time what another arm "
                      f"times and report noise as a speed-up (arms that act on {device}: {acting})")


def prepare(user: dict[str, Any], workdir: Path, arms: list[str] | None = None) -> dict[str, Any]:
    """Resolve config + model, save the initial weights and one real batch into `workdir`.

    With `arms`, first refuse those whose lever cannot act on the run's device (inert_levers)."""
    import torch

    from .config import build_config
    from .engine.builder import build_model
    from .engine.device import select_device
    from .logs import checking_inputs
    from .model import LibreYOLO, check_batch
    from .tasks import task_for

    lib = LibreYOLO(user["model"])
    task = task_for(lib.source.spec, user.get("task"))
    user = {"data": task.builtin_data, **user}
    # One batch at `imgsz`: a multi-scale draw (the DETR recipes default to it) would time a
    # random size (it timed RT-DETR at 960 px once).
    cfg = build_config({**user, "workers": 0, "val": False, "multi_scale": False}, lib.source.defaults)
    data_cfg = task.load_data(cfg.data)
    torch.manual_seed(cfg.seed)
    model = build_model(lib.source, len(data_cfg.names))
    if arms:
        refuse_inert_arms(arms, lib.source.spec, model, select_device(cfg.device))
    with checking_inputs():
        loader = task.train_loader(data_cfg, cfg)
        check_batch(cfg.batch, loader.num_images, data_cfg.name)  # else the timed batch would be smaller
    loader.set_epoch(0)
    batch = next(iter(loader))
    torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, workdir / "init.pt")
    torch.save(task.pack_batch(batch), workdir / "batch.pt")
    meta = {"config": cfg.to_dict(), "family": lib.source.spec.name, "size": lib.source.size, "task": task.name,
            "num_classes": len(data_cfg.names), "arch": lib.arch}
    (workdir / "meta.json").write_text(json.dumps(meta))
    return meta


class _SyncedPhases:
    """A phase recorder that synchronises around each phase: composition, not speed."""

    def __init__(self, sync):
        self.sync = sync
        self.times: dict[str, list[float]] = defaultdict(list)

    @contextlib.contextmanager
    def phase(self, name: str):
        self.sync()
        t0 = time.perf_counter()
        yield
        self.sync()
        self.times[name].append((time.perf_counter() - t0) * 1e3)


def load_arm(workdir: Path, arm: str) -> tuple[Any, Any, dict[str, Any]]:
    """The step context and batch of one arm, from what `prepare` saved: (ctx, batch, meta)."""
    import torch

    from .config import build_config
    from .engine.builder import build_step_context, place_model, seed_everything, set_cudnn_autotune, steady_autotune
    from .engine.device import select_device
    from .families import get_family
    from .tasks import get_task

    meta = json.loads((workdir / "meta.json").read_text())
    cfg = build_config({**meta["config"], **arm_delta(arm)})
    device = select_device(cfg.device)
    seed_everything(cfg.seed, cfg.deterministic)
    set_cudnn_autotune(cfg, steady_autotune(cfg))
    spec = get_family(meta["family"])
    model = spec.build(meta["size"], meta["num_classes"])
    model.load_state_dict(torch.load(workdir / "init.pt", map_location="cpu", weights_only=True))
    model = place_model(model, cfg, device)
    model.train()
    ctx = build_step_context(cfg, spec, model, device)
    saved = torch.load(workdir / "batch.pt", map_location="cpu", weights_only=True)
    batch = get_task(meta.get("task", "detect")).unpack_batch(saved, device.type == "cuda")
    return ctx, batch, meta


def run_arm(workdir: Path, arm: str, steps: int, warmup: int) -> dict[str, Any]:
    """One arm, in this process (called in a fresh subprocess by `bench_step`)."""
    import torch

    from . import markers
    from .engine.step import train_step
    from .profiler.trace import gpu_intervals, union_length

    ctx, batch, meta = load_arm(workdir, arm)
    device = ctx.device
    cuda = device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)

    stage_s = {"setup": time.perf_counter() - _T0}
    t_stage = time.perf_counter()
    for _ in range(warmup):
        train_step(ctx, batch, update=True)
    sync()
    stage_s["warmup"] = time.perf_counter() - t_stage
    t_stage = time.perf_counter()
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
        for i in range(steps):
            starts[i].record()
            train_step(ctx, batch, update=True)
        starts[steps].record()
        sync()
        step_ms = [starts[i].elapsed_time(starts[i + 1]) for i in range(steps)]
        peak_mb = torch.cuda.max_memory_allocated(device) / 2**20
    else:
        step_ms = []
        for _ in range(steps):
            t0 = time.perf_counter()
            train_step(ctx, batch, update=True)
            step_ms.append((time.perf_counter() - t0) * 1e3)
        peak_mb = None

    stage_s["timed"] = time.perf_counter() - t_stage
    t_stage = time.perf_counter()
    busy_ms = None
    if cuda:
        from torch.profiler import ProfilerActivity, profile

        profiled = min(steps, PROFILED_STEPS)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(profiled):
                train_step(ctx, batch, update=True)
            sync()
        with tempfile.TemporaryDirectory() as tmp:
            trace_path = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(trace_path))
            busy_ms = union_length(gpu_intervals(trace_path)) / 1e3 / profiled

    stage_s["profiled"] = time.perf_counter() - t_stage
    t_stage = time.perf_counter()
    recorder = _SyncedPhases(sync)
    markers.set_recorder(recorder)
    try:
        for _ in range(steps):
            train_step(ctx, batch, update=True)
    finally:
        markers.set_recorder(None)
    stage_s["synced"] = time.perf_counter() - t_stage
    captured = None if ctx.graphs.enabled else _captured_region_ms(ctx, batch, steps, sync)
    phases = {k: statistics.median(v) for k, v in recorder.times.items()}
    phases["optimizer+ema"] = phases.pop("optimizer", 0.0) + phases.pop("ema", 0.0)
    network = phases.get("forward", 0.0) + phases.get("backward", 0.0)
    median = statistics.median(step_ms)
    return {
        "arm": arm, "arch": meta["arch"], "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "torch": torch.__version__, "batch": int(batch.images.shape[0]), "imgsz": int(batch.images.shape[-1]),
        "precision": ctx.precision.describe(), "steps": steps, "warmup": warmup,
        "step_ms_min": min(step_ms), "step_ms_median": median,
        "kernel_busy_ms": busy_ms, "utilisation": None if busy_ms is None else busy_ms / median,
        "synced_ms": phases, "network_share": network / max(sum(phases.values()), 1e-9),
        # The capturable region's own forward + backward (eager arms): where the family captures
        # only a part (the DETRs' encoder), its share of the step is what graphs can act on.
        "captured_ms": captured,
        "captured_share": None if captured is None else captured / max(sum(phases.values()), 1e-9),
        "peak_mem_mb": peak_mb,
        "graph": ctx.graphs.stats(),  # replayed vs eager steps
        "whole_step": None if ctx.whole is None else ctx.whole.stats(),  # cuda_graph=full's graphs
        "stage_seconds": {k: round(v, 2) for k, v in stage_s.items()},  # where the arm's wall time went
    }


def _captured_region_ms(ctx, batch, steps: int, sync) -> float:
    """Median ms of `model.capturable`'s forward and backward alone (synchronised), under the
    step's autocast, with unit output gradients; the parameters' gradients are zeroed after."""
    import torch

    images = batch.images.to(ctx.device, non_blocking=True)
    if ctx.channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    images = images.float().div_(255.0)
    times = []
    for _ in range(steps):
        sync()
        t0 = time.perf_counter()
        with ctx.precision.autocast():
            outs = ctx.model.capturable(images)
        outs = [o for o in outs if o.requires_grad]  # RF-DETR's input size rides along, gradient-free
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    ctx.optimizer.zero_grad(set_to_none=False)
    return statistics.median(times)


def bench_step(user: dict[str, Any], arms: list[str], steps: int = 24, warmup: int = 10,
               repeat: int = 1) -> list[dict[str, Any]]:
    """Run each arm in its own process from the same saved state; returns one record per arm.

    With `repeat` > 1 every arm runs that many times, the arms interleaved (a, b, a, b, ...) so a
    drift of the machine hits all of them alike. An arm's record is then its run with the median
    step time, plus `runs_ms` (each run's median step) and `spread` ((max - min) / median of
    those): the run-to-run noise a comparison between arms has to beat.
    """
    from .errors import ConfigError

    if not arms:
        raise ConfigError(f"no arms given (arms: {', '.join(ARMS)}, e.g. arms=float16,float16+graph)")
    for arm in arms:
        arm_delta(arm)  # every arm name is checked before any work starts
    log = logging.getLogger("libreyolo")
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    with tempfile.TemporaryDirectory(prefix="libreyolo-bench-") as tmp:
        workdir = Path(tmp)
        prepare(user, workdir, arms)
        for r in range(repeat):
            for i, arm in enumerate(arms, 1):
                # Progress on stderr: an arm is a fresh process (import, CUDA init, cuDNN
                # autotune, profiler start-up), tens of seconds each on a GPU.
                run = f" run {r + 1}/{repeat}" if repeat > 1 else ""
                log.info(f"bench: arm {i}/{len(arms)} '{arm}'{run} ({warmup} warm-up + 2 x {steps} + "
                         f"{min(steps, PROFILED_STEPS)} profiled steps)")
                runs[arm].append(_run_arm_process(workdir, arm, steps, warmup))
                log.info(f"bench: arm '{arm}' median step {runs[arm][-1]['step_ms_median']:.2f} ms")
    results = [_combine(runs[arm]) for arm in arms]
    base = results[0]["step_ms_median"]
    for r in results:
        r["speedup"] = base / r["step_ms_median"]
    return results


def _run_arm_process(workdir: Path, arm: str, steps: int, warmup: int) -> dict[str, Any]:
    from .errors import ConfigError
    from .worker import run_worker

    got = run_worker("libreyolo.bench", [str(workdir), arm, str(steps), str(warmup)])
    if not got.ok:
        raise ConfigError(f"bench arm '{arm}' failed: {got.error}")
    return got.result


def _combine(records: list[dict[str, Any]]) -> dict[str, Any]:
    """One arm's runs -> the median run's record, with every run's median step and the spread."""
    medians = [r["step_ms_median"] for r in records]
    middle = sorted(records, key=lambda r: r["step_ms_median"])[(len(records) - 1) // 2]
    mid = statistics.median(medians)
    return {**middle, "runs_ms": medians, "spread": (max(medians) - min(medians)) / mid if mid > 0 else 0.0}


def format_table(results: list[dict[str, Any]]) -> str:
    repeated = len(results[0].get("runs_ms", [])) > 1
    head = ("arm", "precision", "step ms (min/med)", "speedup", "kernel busy ms", "util", "network share",
            "peak MiB") + (("run spread",) if repeated else ())
    rows = [head]
    for r in results:
        rows.append((r["arm"], r["precision"], f"{r['step_ms_min']:.2f} / {r['step_ms_median']:.2f}",
                     f"{r['speedup']:.2f}x",
                     "-" if r["kernel_busy_ms"] is None else f"{r['kernel_busy_ms']:.2f}",
                     "-" if r["utilisation"] is None else f"{r['utilisation']:.2f}",
                     f"{r['network_share']:.2f}", "-" if r["peak_mem_mb"] is None else f"{r['peak_mem_mb']:.0f}")
                    + ((f"{100 * r['spread']:.0f} %",) if repeated else ()))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    r0 = results[0]
    lines.insert(0, f"{r0['arch']}  batch {r0['batch']}  imgsz {r0['imgsz']}  on {r0['device']}  "
                    f"(median of {r0['steps']} steps after {r0['warmup']} warm-up; one batch replayed"
                    + (f"; median of {len(r0['runs_ms'])} runs per arm)" if repeated else ")"))
    return "\n".join(lines)


if __name__ == "__main__":  # the per-arm worker process
    from .worker import answer

    _workdir, _arm, _steps, _warmup = sys.argv[1:5]
    answer(lambda: run_arm(Path(_workdir), _arm, int(_steps), int(_warmup)))
