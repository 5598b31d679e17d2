"""The verdict: which lever a window's figures point at, and the thresholds it reads.

The figures come from analyze.py (`analyse_window`): W, the step time of the timed steps; B, the
busy time of the kernels the recorded steps launched; U = B / W, the utilisation; and I = W - B,
the idle time. The rules, in order:

1. `memory-bound` when the caching allocator shows pressure (the allocator's counters over the
   timed and recorded steps, the trace's runtime calls in the recorded ones, the reserved memory
   at the window's edges): at least ALLOC_RETRIES (1) retry, i.e. a failed cudaMalloc after which
   the allocator synchronised, freed its cached blocks and tried again; or at least
   ALLOC_CALLS_PER_STEP (1.0) cudaMalloc/cudaFree (cuMemMap/cuMemUnmap under expandable
   segments) per step, where a warm caching allocator serves a steady step from its cache with
   none (PyTorch CUDA semantics notes: the cache makes frees "without device synchronizations");
   or reserved memory at least NEAR_LIMIT_FRAC (0.95) of the allocator's limit (the device's
   memory times the per-process fraction). It comes first: allocator pressure changes what every
   other lever does (a larger batch, the compute-bound lever, would not fit; a retry's device
   sync and cudaFree calls would read as host-bound gaps).
2. `compute-bound` when U >= COMPUTE_BOUND_UTIL (0.80). Above 80 % busy, removing every idle
   microsecond wins at most 1.25x, while faster kernels (bf16/fp16 tensor cores, a larger batch
   that amortises fixed per-kernel costs) commonly win 1.5-3x: the kernels are the prize.
3. `dataloader-bound` when the wait for the next batch (time blocked in `next(loader)`, capped at
   I) is at least as large as each idle class below: it is the biggest single piece of idle.
4. The idle time outside data waits is split by gap length in the recorded steps, and that split
   is applied to the timed steps' idle (the recorded gaps carry the profiler's host cost). A gap
   shorter than LAUNCH_GAP_US (100 us) is what launching costs: an eager op is ~5-30 us of Python,
   dispatcher and cudaLaunchKernel, so a sub-100 us gap is a few launches back to back. Longer
   gaps mean the CPU did something else (Python logic, a CPU-side assigner, allocator work,
   waiting on a sync). `host-bound` when host syncs per step >= HOST_SYNCS_PER_STEP (1.0; the
   syncs a model makes by design, `model.host_syncs`, not counted) or long-gap idle exceeds
   short-gap idle. The step is meant to be sync-free (the loop's loss read-back once per
   `log_interval` is deferred on CUDA: it waits at most for the previous interval's copy,
   normally long done, and for the device at an epoch's end); a sync every step means the step
   waits on the GPU, which also keeps CUDA graphs from capturing it. `launch-bound` otherwise.
   Where switching `cuda_graph=full` on would capture the training step whole, a host-bound window
   whose step makes no sync of its own, and a launch-bound one that replays network graphs, name it
   first (an eager launch-bound one names it after `cuda_graph=true`): a whole-step replay runs none
   of the step's Python and launches nothing one by one.

On CPU there are no kernels: U = (W - data wait) / W, and the verdict is `compute-bound` when
U >= COMPUTE_BOUND_UTIL, else `dataloader-bound` (waiting for data is the only idle a CPU step has).

Inference windows (`libreyolo profile infer`, mode "infer") use the same rules and thresholds with
two differences. The step must bring its results to the host: NMS (`nonzero`, data-dependent
shapes) and the copy of the detections sync by design, once per batch, so the syncs inside the
`postprocess` phase do not count towards HOST_SYNCS_PER_STEP (the long gaps they leave still do).
And the levers are inference's: prepare threads (`workers`) and the source's decoding for a data
wait, `cuda_graph=true` (the forward captured at the first batch) for launches, amp and the
batch/imgsz for compute, the batch and conf for postprocess.
"""

from __future__ import annotations

from ..logs import counted

COMPUTE_BOUND_UTIL = 0.80
LAUNCH_GAP_US = 100.0
HOST_SYNCS_PER_STEP = 1.0
ALLOC_RETRIES = 1
ALLOC_CALLS_PER_STEP = 1.0
NEAR_LIMIT_FRAC = 0.95
THRESHOLDS = {"compute_bound_util": COMPUTE_BOUND_UTIL, "launch_gap_us": LAUNCH_GAP_US,
              "host_syncs_per_step": HOST_SYNCS_PER_STEP, "alloc_retries": ALLOC_RETRIES,
              "alloc_calls_per_step": ALLOC_CALLS_PER_STEP, "near_limit_frac": NEAR_LIMIT_FRAC}


def memory_signals(f: dict) -> list[str]:
    """The allocator-pressure findings of window figures `f` (empty: none), each one phrase.

    Optional keys: alloc_retries (the caching allocator's retries in the window), alloc_calls_per_step
    (device-memory calls per step), reserved_mb and limit_mb (reserved memory at the window's
    edges, the allocator's limit)."""
    if not f.get("cuda"):
        return []
    out = []
    retries = f.get("alloc_retries") or 0
    if retries >= ALLOC_RETRIES:
        out.append(f"the caching allocator retried {counted(retries, 'time')} in the window (a "
                   "cudaMalloc failed: it synchronised, freed its cached blocks and tried again)")
    calls = f.get("alloc_calls_per_step") or 0.0
    if calls >= ALLOC_CALLS_PER_STEP:
        out.append(f"{calls:.1f} cudaMalloc/cudaFree calls per step (a warm caching allocator makes none)")
    reserved, limit = f.get("reserved_mb"), f.get("limit_mb")
    if reserved is not None and limit and reserved >= NEAR_LIMIT_FRAC * limit:
        out.append(f"reserved memory {reserved:.0f} of {limit:.0f} MB ({reserved / limit:.0%} of the allocator's limit)")
    return out


def _memory_verdict(f: dict, signals: list[str]) -> dict:
    """`memory-bound`, with the levers that fit what was seen: capacity (retries, reserved memory
    near the limit) wants less memory per step; churn (allocator calls every step, retries) wants
    fewer allocations per step."""
    infer = f.get("mode") == "infer"
    retries = (f.get("alloc_retries") or 0) >= ALLOC_RETRIES
    near = any(s.startswith("reserved memory") for s in signals)
    churn = retries or (f.get("alloc_calls_per_step") or 0.0) >= ALLOC_CALLS_PER_STEP
    levers = []
    if retries or near:
        levers.append("a smaller batch" if infer else "a smaller batch or imgsz")
        if f.get("precision") == "float32":
            levers.append("amp=true (float16 weights and activations)" if infer else
                          "amp=true (activations in half the bytes)")
    if churn and not retries:
        levers.append("no torch.cuda.empty_cache() or other cache flush inside the step")
    if "expandable_segments:true" not in str(f.get("alloc_conf") or "").replace(" ", "").lower():
        levers.append("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (segments grow in place instead of "
                      "fragmenting into blocks the next step cannot reuse)")
    if churn and not f.get("graphed"):
        levers.append("cuda_graph=true (replays allocate nothing: the graph's private pool is allocated once, at "
                      "capture; it holds about one eager step's peak)")
    reason = "; ".join(signals) + f"; GPU kernels busy {f['utilisation']:.0%} of the step"
    return {"name": "memory-bound", "reason": reason, "lever": "; or ".join(levers)}


def verdict(f: dict) -> dict:
    """The verdict from window figures (see the module docstring for the rules and their order).

    `f` keys: cuda, utilisation, step_ms, data_ms, idle_data_ms, idle_short_ms, idle_long_ms,
    syncs_per_step, kernels_per_step, kernel_median_us, host_phases [(name, ms)], workers, precision;
    optional: graphed, whole_step (the window replays whole-step graphs, cuda_graph=full),
    whole_reason (training: "" where switching cuda_graph=full on would capture the step, else why
    not; absent or None: not known), compiled (compile=true), mode ("train" when absent, or "infer"), for "infer"
    postprocess_syncs_per_step, and designed_syncs_per_step (the syncs a training step makes by
    design, `model.host_syncs`: the DETRs' denoising count and matcher), which, like the
    postprocess syncs, do not count towards HOST_SYNCS_PER_STEP; the allocator figures of
    `memory_signals` and alloc_conf (PYTORCH_CUDA_ALLOC_CONF as the run had it).
    """
    signals = memory_signals(f)
    if signals:
        return _memory_verdict(f, signals)
    infer = f.get("mode") == "infer"
    util, data_share = f["utilisation"], f["data_ms"] / max(f["step_ms"], 1e-9)
    if infer:
        wait = (f"the loop waited for the next prepared batch (decode, then letterbox or crop) {data_share:.0%} of "
                f"the step ({f['data_ms']:.1f} of {f['step_ms']:.1f} ms)")
        data_lever = (f"more decode threads (workers={f['workers']} now: each decodes and letterboxes whole "
                      "images), or a source that decodes faster (JPEG rather than PNG, smaller files, frames "
                      "already in memory)")
    else:
        wait = f"the loop waited for the next batch {data_share:.0%} of the step ({f['data_ms']:.1f} of {f['step_ms']:.1f} ms)"
        cache_note = {"ram": "; the images are cached in RAM already)",
                      "n/a": "; this task's loader reads its files, cache does not apply)"}
        data_lever = f"more dataloader workers (workers={f['workers']} now" + cache_note.get(f.get("cache"), ") or cache=ram")
    if util >= COMPUTE_BOUND_UTIL:
        reason = (f"GPU kernels busy {util:.0%} of the step" if f["cuda"] else
                  f"the CPU computes {util:.0%} of the step ({1 - util:.0%} waiting for data)")
        if not f["cuda"]:
            lever = "a CUDA device (amp and CUDA graphs are GPU-only); on CPU, a smaller imgsz or model"
        elif infer and f["precision"] == "float32":
            lever = "amp=true (float16, or amp_dtype=bfloat16), then a larger batch for more images/s"
        elif infer:
            lever = ("a smaller imgsz or model (kernels are already in reduced precision); a larger batch raises "
                     "images/s at the cost of latency")
        elif f["precision"] == "float32":
            lever = "amp=True with amp_dtype=bfloat16 (or float16 before Ampere), then a larger batch"
        else:
            lever = "a larger batch (kernels are already in reduced precision), or a smaller model/imgsz"
        return {"name": "compute-bound", "reason": reason, "lever": lever}
    if not f["cuda"] or f["idle_data_ms"] >= max(f["idle_short_ms"], f["idle_long_ms"]):
        return {"name": "dataloader-bound", "reason": wait, "lever": data_lever}
    top = ", ".join(f"{n} {ms:.1f} ms" for n, ms in f["host_phases"][:3])
    post = f.get("postprocess_syncs_per_step", 0.0)  # inference's syncs by design (module docstring)
    designed = f.get("designed_syncs_per_step", 0.0)  # a training step's by design (model.host_syncs)
    syncs = f["syncs_per_step"] - post - designed
    if infer and (syncs >= HOST_SYNCS_PER_STEP or f["idle_long_ms"] > f["idle_short_ms"]):
        reason = (f"GPU idle {1 - util:.0%} of the step while the CPU does other work: {syncs:.1f} host syncs per "
                  f"step outside postprocess ({post:.1f} in it: NMS and the copy of the results); top host "
                  f"phases: {top}")
        lever = ("remove the host syncs outside postprocess (in the phases above)" if syncs >= HOST_SYNCS_PER_STEP
                 else "a larger batch (postprocess and its syncs are paid once per batch), or a higher conf "
                      "(fewer boxes into NMS)")
        return {"name": "host-bound", "reason": reason, "lever": lever}
    # cuda_graph=full replays the whole training step, its Python and launches gone: a lever where
    # switching it on would capture the step (whole_reason "", assemble._whole) and it is not on.
    full = not infer and f.get("whole_reason") == "" and not f.get("whole_step")
    if syncs >= HOST_SYNCS_PER_STEP or f["idle_long_ms"] > f["idle_short_ms"]:
        if syncs < HOST_SYNCS_PER_STEP and full:
            lever = ("cuda_graph=full (the whole step replays as one graph: the CPU work in those phases, loss, "
                     "matching and optimizer included, no longer runs each step), or fix the code path")
        else:
            lever = "fix the code path (host syncs, CPU work in those phases); CUDA graphs help little"
        return {"name": "host-bound",
                "reason": (f"GPU idle {1 - util:.0%} of the step while the CPU does other work: "
                           f"{f['syncs_per_step']:.1f} host syncs per step"
                           + (f" ({designed:g} of them the model's by design)" if designed else "")
                           + f"; top host phases: {top}"),
                "lever": lever}
    reason = (f"GPU busy {util:.0%}: idle between {f['kernels_per_step']:.0f} kernels per step "
              f"(median {f['kernel_median_us']:.0f} us) while the CPU launches them")
    if f.get("graphed"):
        # The network already replays as one graph: what still launches one kernel at a time is
        # the eager part of the step (training: loss, its backward, optimizer, EMA; inference: NMS).
        if infer:
            return {"name": "launch-bound", "reason": f"{reason}; the forward already replays as a CUDA graph",
                    "lever": f"a larger batch (amortises the eager postprocess launches; top host phases: {top})"}
        if f.get("whole_step"):
            return {"name": "launch-bound", "reason": f"{reason}; the whole step already replays as a CUDA graph",
                    "lever": "a larger batch" + ("" if f.get("compiled") else ", or compile=true (fewer, larger kernels)")}
        if full:
            return {"name": "launch-bound", "reason": f"{reason}; the network already runs as a CUDA graph",
                    "lever": f"cuda_graph=full (the loss, optimizer and EMA replay in the graph too; top host "
                             f"phases: {top}), or a larger batch"}
        return {"name": "launch-bound", "reason": f"{reason}; the network already runs as a CUDA graph",
                "lever": f"a larger batch (amortises the eager loss/optimizer launches; top host phases: {top})"}
    if infer:
        return {"name": "launch-bound", "reason": reason,
                "lever": "cuda_graph=true (inference capture: the forward replays as one graph), or a larger batch"}
    return {"name": "launch-bound", "reason": reason,
            "lever": "cuda_graph=True (launch the network as one graph"
                     + ("; cuda_graph=full the whole step" if full else "") + "), or a larger batch"}
