"""`libreyolo profile what-if PROFILE`: what each lever would make of the profiled step, from one window.

Reads profile dicts only (no torch). Every prediction rests on the same picture of a step, each
with its assumption printed beside it. Per step the CPU spends H ms (the timed steps' host
interval: launching, Python, the data wait) and the GPU B ms (kernel busy). The step has no host
sync (the loop's log read-back aside), so the CPU runs ahead of the GPU and the step takes about
the longer of the two: W ~ max(H, B). An eager step that is launch-bound has H ~ W > B.

- `cuda_graph=true`: the captured region (the family's capture plan in profile.json's
  `capture`: the network, or the DETRs' encoder; inference: the forward phase) stops costing its
  eager host time R (its forward, and its backward from the first gradient at its outputs to the
  end of the backward phase, timed on the host in the unrecorded steps) and replays as graphs;
  everything else keeps its host time; the kernels are the same. Predicted max(H - R, B). A
  replay's own host cost (one launch per graph, the copy into its static input) is left out, and
  the dataloader is assumed to keep up with the faster step.
- `cuda_graph=full`: the whole step but its data wait and upload (the forward, loss, backward,
  optimizer and EMA phases, their host time F) replays as graphs: predicted max(H - F, B), the
  replays' own launches and the host's LR writes (a few kernels) left out. Only where the family's
  step can be captured whole (`capture.whole` in profile.json, from the family's capture plan).
- `cuda_graph=full compile=true`: as `full` for the host; on the GPU, inductor fuses the network's
  pointwise, normalisation and reduction kernels and calls its convolutions and matrix multiplies
  from cuDNN/cuBLAS as they are (EXTERN_KERNEL names them). How well it fuses the rest is not in one
  eager window, so this is a floor, not an estimate: every kernel but those (the loss's and the
  optimizer's too, and any kernel outside the window's top list) taken as free, max(H - F, B x
  extern share), up to the `full` prediction. Only where compile=true applies: the family's
  captured region is the whole network.
- AMP (a float32 window): kernel busy scales by the float16 (bfloat16) / float32 kernel busy
  ratio that `bench step` measured for whole training steps on the H200 (AMP_KERNEL_RATIO, from
  the bundled records it cites), the host time stays. If the GPU is the bottleneck (utilisation >=
  COMPUTE_BOUND_UTIL) the step shrinks by the kernel time saved; otherwise it waits on the host
  and does not change (the saving shows after graphs: the combined prediction, max(H - R, B x ratio)).
- a dataloader that never makes the step wait: the step loses the data wait during which the GPU
  sat idle (`utilisation.idle_data_ms`); the part of the wait the GPU was busy through was hidden
  already.
"""

from __future__ import annotations

import re
from typing import Any

from .artifacts import SCHEMA_VERSION, WHATIF_SHAPE, require
from .verdict import COMPUTE_BOUND_UTIL

WHATIF_SCHEMA = "libreyolo-profile-whatif"
# float16 / float32 and bfloat16 / float32 kernel busy of the same eager training step, from `bench
# step` on the H200 (torch 2.11.0+cu130): (median, lowest, highest) over the configurations with both
# arms. float16: yolo9-t and yolo9-s at batch 2, 8 and 32 (benchmarks/results/h200/step_yolo9-{t,s}_b{2,8,32}.json)
# and resnet18, mobilenetv4-s at batch 16 (classify/step_classifiers_b16.json): 8 configurations.
# bfloat16: the six yolo9 ones (the classifier records have no bfloat16 arm). tests/unit/test_profile_whatif.py
# recomputes both from those files. fp32 convolutions already run on TF32 tensor cores (cuDNN's
# default), which is why the saving is 8-31 % rather than the 2x of peak throughput.
AMP_KERNEL_RATIO: dict[str, tuple[float, float, float, int]] = {
    "float16": (0.808, 0.692, 0.924, 8),
    "bfloat16": (0.924, 0.813, 1.282, 6),
}
GRAPH = "cuda_graph=true"
FULL = "cuda_graph=full"
FULL_COMPILE = "cuda_graph=full compile=true"
# The kernels inductor leaves to cuDNN and cuBLAS (extern kernels: convolutions, their split-K
# reductions, workspaces and layout transforms, GEMMs), by name; cuDNN's batch norm kernels do not
# match: inductor decomposes batch norm and fuses it. Inductor's own kernels (triton_*, in a
# compiled window) are fused ones, whatever their names say.
EXTERN_KERNEL = re.compile(r"conv|gemm|gemv|xmma|nvjet|cublas|splitk|dgrad|wgrad|fprop|winograd|fft|scudnn|cask_plugin"
                           r"|nchwtonhwc|nhwctonchw", re.IGNORECASE)
# The phases a whole-step graph replays (engine/fullstep.py); data and h2d stay on the host.
FULL_PHASES = ("forward", "loss", "backward", "optimizer", "ema")
LOADER = "a dataloader that never waits"


def what_if(profile: dict, path: str | None = None) -> dict:
    """Everything `profile what-if` prints (and --json writes): the measured step and one
    prediction per lever, each with its assumption. ProfileFormatError for a profile without the
    figures it needs (schema version 1, an edited file)."""
    require(profile, WHATIF_SHAPE, "profile what-if", path)
    run, head, u, cap = profile["run"], profile["headline"], profile["utilisation"], profile["capture"]
    cuda = profile["kernels"].get("kind") == "kernel"
    step, busy, util = head["step_ms_mean"], head["kernel_busy_ms"], head["utilisation"]
    host = u["host_step_ms"] if u["host_step_ms"] is not None else step
    graph = _graph(profile, cuda, host, busy)
    amps = [_amp(profile, cuda, dtype, step, busy, util) for dtype in AMP_KERNEL_RATIO]
    full = _full(profile, cuda, host, busy)
    out = [graph, full, _full_compile(profile, full, busy), *amps]
    if graph["applies"] and amps[0]["applies"]:
        out.append(_graph_amp(graph, "float16", step, busy))
    out.append(_loader(step, head.get("data_wait_ms") or 0.0, u["idle_data_ms"], cuda))
    graphs = run.get("cuda_graph") or {}
    return {"schema": WHATIF_SCHEMA, "schema_version": SCHEMA_VERSION, "path": path, "mode": run.get("mode", "train"),
            "arch": run.get("arch"), "batch": run.get("batch"), "imgsz": run.get("imgsz"),
            "device": run.get("device_name"), "precision": run.get("precision"),
            "cuda_graph": bool(graphs.get("enabled")), "kernel_kind": "kernel" if cuda else "cpu_op",
            "measured": {"step_ms": step, "kernel_busy_ms": busy, "utilisation": util, "host_step_ms": host,
                         "data_wait_ms": head.get("data_wait_ms"), "data_idle_ms": u["idle_data_ms"],
                         "region": cap["region"], "region_host_ms": cap["host_ms"], "verdict": head.get("verdict")},
            "predictions": out}


def _prediction(lever: str, step: float | None, measured: float, assumption: str, *, bound: str | None = None,
                span: tuple[float, float] | None = None) -> dict[str, Any]:
    return {"lever": lever, "applies": step is not None, "step_ms": step,
            "step_ms_range": list(span) if span is not None else None,
            "speedup": measured / step if step else None, "bound": bound, "assumption": assumption}


def _na(lever: str, why: str) -> dict[str, Any]:
    return _prediction(lever, None, 0.0, why)


def _graphed(profile: dict) -> bool:
    """The window's steps replayed a CUDA graph (its kind, as the overhead figure judged it)."""
    graphed = profile["overhead"].get("graphed")
    return bool(graphed) if graphed is not None else bool(profile["headline"].get("cuda_graph"))


def _graph(profile: dict, cuda: bool, host: float, busy: float) -> dict[str, Any]:
    cap, infer = profile["capture"], profile["run"].get("mode") == "infer"
    if not cuda:
        return _na(GRAPH, "CUDA graphs need a CUDA device: the window ran on the CPU")
    if _graphed(profile):
        return _na(GRAPH, "the window already replays a CUDA graph: profile with cuda_graph=false to predict it")
    if cap["region"] not in ("network", "encoder", "forward"):
        return _na(GRAPH, f"the family has no capturable region ({cap.get('note') or cap['region']})")
    if cap["forward_host_ms"] is None or (not infer and cap["backward_host_ms"] is None) or cap["host_ms"] is None:
        return _na(GRAPH, "the window did not time the captured region's forward and backward")
    region = cap["host_ms"]
    rest = max(host - region, 0.0)
    step = max(rest, busy)
    parts = (f"forward {cap['forward_host_ms']:.1f} ms" if infer else
             f"forward {cap['forward_host_ms']:.1f} + backward {cap['backward_host_ms']:.1f} ms")
    what = ("the forward phase (predict's graph: network and decode)" if infer else
            f"the captured region ({cap['region']}{': ' + cap['note'] if cap.get('note') else ''})")
    assumption = (f"{what} costs no host time ({parts} of the {host:.1f} ms host time per step now; a replay's own "
                  f"launch is left out); the rest of the step keeps its host time ({rest:.1f} ms: data wait, "
                  f"upload, {'postprocess' if infer else 'loss, optimizer, EMA'}, the loop) and its kernels their "
                  f"busy time ({busy:.1f} ms); with no sync in the step the CPU runs ahead, so the step takes the "
                  f"longer of the two; the dataloader keeps up with the faster step")
    return {**_prediction(GRAPH, step, profile["headline"]["step_ms_mean"], assumption,
                          bound="host" if rest >= busy else "kernels"), "host_ms": rest}


def _full(profile: dict, cuda: bool, host: float, busy: float) -> dict[str, Any]:
    cap = profile["capture"]
    if not cuda:
        return _na(FULL, "CUDA graphs need a CUDA device: the window ran on the CPU")
    if profile["run"].get("mode") == "infer":
        return _na(FULL, "a training lever: predict's graph already holds the whole forward phase (cuda_graph=true)")
    if _graphed(profile):
        return _na(FULL, "the window already replays a CUDA graph: profile with cuda_graph=false to predict it")
    if cap["region"] not in ("network", "encoder"):
        return _na(FULL, f"the family has no capturable region ({cap.get('note') or cap['region']})")
    whole = cap.get("whole")
    if whole is None:
        return _na(FULL, "the profile does not say whether the family's step can be captured whole (written before "
                         "cuda_graph=full): profile the run again")
    if whole:
        return _na(FULL, f"the family's step cannot be captured whole: {whole} (it trains as cuda_graph=true)")
    phases = {p.get("phase"): p.get("host_ms") for p in profile.get("phases") or []}
    times = [phases.get(name) for name in FULL_PHASES]
    if any(not isinstance(t, (int, float)) for t in times):
        return _na(FULL, "the window did not time the step's forward, loss, backward, optimizer and EMA phases")
    captured = float(sum(times))
    rest = max(host - captured, 0.0)
    step = max(rest, busy)
    parts = " + ".join(f"{name} {t:.1f}" for name, t in zip(FULL_PHASES, times))
    assumption = (f"the whole step but its data wait and upload costs no host time ({parts} ms of the {host:.1f} ms "
                  f"host time per step now; the replays' launches and the LR and EMA-weight writes before them are "
                  f"left out); the rest keeps its host time ({rest:.1f} ms: data wait, upload, the loop) and the "
                  f"kernels their busy time ({busy:.1f} ms: the loss's and optimizer's kernels are the eager ones, "
                  f"padded boxes aside); the step takes the longer of the two")
    return {**_prediction(FULL, step, profile["headline"]["step_ms_mean"], assumption,
                          bound="host" if rest >= busy else "kernels"), "host_ms": rest}


def _full_compile(profile: dict, full: dict[str, Any], busy: float) -> dict[str, Any]:
    if not full["applies"]:
        return _na(FULL_COMPILE, f"as {FULL}: {full['assumption']}")
    if profile["capture"]["region"] != "network":
        return _na(FULL_COMPILE, f"compile=true compiles a captured region that is the whole network; this family's "
                                 f"is its {profile['capture']['region']}")
    rows = profile["kernels"].get("rows") or []
    listed = sum(r["share"] for r in rows)
    kept = sum(r["share"] for r in rows if EXTERN_KERNEL.search(r["name"]) and not r["name"].startswith("triton_"))
    if not kept:
        return _na(FULL_COMPILE, f"none of the window's top {len(rows)} kernels is a convolution or GEMM by name, so "
                                 f"there is no floor to put under a compiled step")
    rest, floor = full["host_ms"], busy * kept
    step = max(rest, floor)
    assumption = (f"the host as under {FULL} ({rest:.1f} ms); of the kernels only the convolutions and matrix "
                  f"multiplies inductor leaves to cuDNN/cuBLAS keep their time ({kept:.0%} of the {busy:.1f} ms busy: "
                  f"{floor:.1f} ms), every other kernel taken as fused away (a floor: the loss's and optimizer's "
                  f"kernels stay eager, the fused ones cost something, and kernels outside the window's top "
                  f"{len(rows)} ({1 - listed:.0%} of the busy time) are counted as fusable); at worst the {FULL} step")
    return _prediction(FULL_COMPILE, step, profile["headline"]["step_ms_mean"], assumption,
                       bound="host" if rest >= floor else "kernels (extern floor)", span=(step, full["step_ms"]))


def _amp(profile: dict, cuda: bool, dtype: str, step: float, busy: float, util: float) -> dict[str, Any]:
    lever = f"amp=true amp_dtype={dtype}"
    precision = str(profile["run"].get("precision") or profile["headline"].get("precision"))
    if not cuda:
        return _na(lever, "mixed precision needs a CUDA device: the window ran on the CPU")
    if precision != "float32":
        return _na(lever, f"the window ran {precision} already")
    ratio, lo, hi, n = AMP_KERNEL_RATIO[dtype]
    source = (f"kernel busy x {ratio:.2f} ({dtype}/float32 kernel busy of the same training step, measured by bench "
              f"step on the H200: median of {n} configurations, {lo:.2f}-{hi:.2f}"
              + ("; measured on training steps, applied to inference" if profile["run"].get("mode") == "infer"
                 else "") + f"): {busy:.1f} -> {busy * ratio:.1f} ms")
    if util >= COMPUTE_BOUND_UTIL:
        saved = [busy * (1 - r) for r in (ratio, hi, lo)]
        return {**_prediction(lever, step - saved[0], step, f"{source}; the GPU is the bottleneck (utilisation "
                              f"{util:.2f} >= {COMPUTE_BOUND_UTIL:.2f}), so the step shrinks by the kernel time saved "
                              f"and its idle time stays", bound="kernels", span=(step - saved[2], step - saved[1])),
                "kernel_busy_ms": busy * ratio}
    return {**_prediction(lever, step, step, f"{source}; the step waits on the host, not on its kernels "
                          f"(utilisation {util:.2f} < {COMPUTE_BOUND_UTIL:.2f}): the saved kernel time becomes idle "
                          f"and the step stays as it is", bound="host", span=(step, step)),
            "kernel_busy_ms": busy * ratio}


def _graph_amp(graph: dict, dtype: str, measured: float, busy: float) -> dict[str, Any]:
    ratio, lo, hi, _ = AMP_KERNEL_RATIO[dtype]
    rest = graph["host_ms"]
    step = max(rest, busy * ratio)
    return _prediction(f"{GRAPH} amp=true amp_dtype={dtype}", step, measured,
                       f"both of the above: the host time without the region ({rest:.1f} ms) against the kernel "
                       f"busy time x {ratio:.2f} ({busy * ratio:.1f} ms), the longer of the two",
                       bound="host" if rest >= busy * ratio else "kernels",
                       span=(max(rest, busy * lo), max(rest, busy * hi)))


def _loader(step: float, wait: float, idle: float, cuda: bool) -> dict[str, Any]:
    if not cuda:  # a CPU step computes nothing while it waits: all of the wait goes
        return _prediction(LOADER, step - idle, step, f"the {idle:.2f} ms per step the loop waited for the batch "
                           f"goes (a CPU step computes nothing while it waits)")
    return _prediction(LOADER, step - idle, step,
                       f"the {idle:.2f} ms per step the GPU sat idle waiting for the batch goes; the rest of the "
                       f"{wait:.2f} ms wait was hidden behind kernels already")
