"""Trace arithmetic and the verdict on synthetic traces (no training, no GPU)."""

import pytest

from libreyolo.profiler import analyze as A


def gpu_trace(kernels, syncs=(), device=0, extra=()):
    """A Kineto-like trace: (launch_ts, start, dur[, name]) kernels plus (ts, dur, name) runtime calls."""
    events = []
    for i, k in enumerate(kernels):
        launch, start, dur = k[:3]
        name = k[3] if len(k) > 3 else f"k{i % 3}"
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 7, "tid": 7,
                       "ts": launch, "dur": 3.0, "args": {"correlation": 1000 + i}})
        events.append({"ph": "X", "cat": "kernel", "name": name, "pid": device, "tid": 7, "ts": start, "dur": dur,
                       "args": {"device": device, "stream": 7, "correlation": 1000 + i}})
    for ts, dur, name in syncs:
        events.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 7, "tid": 7, "ts": ts, "dur": dur,
                       "args": {"correlation": 5000 + len(events)}})
    return {"traceEvents": events + list(extra)}


def test_union_merges_overlaps_and_clips():
    iv = [(0, 10), (5, 15), (20, 30), (30, 31), (40, 40)]
    assert A.merge(iv) == [(0, 15), (20, 31)]
    assert A.union_length(iv) == 26
    assert A.union_length(iv, lo=12, hi=25) == 3 + 5


def test_busy_events_filter_device_drop_early_kernels_and_annotations():
    trace = gpu_trace([(0, 10, 5), (20, 15, 5), (30, 40, 10)],
                      extra=[{"ph": "X", "cat": "gpu_user_annotation", "name": "span", "pid": 0, "tid": 7, "ts": 0,
                              "dur": 1000, "args": {"device": 0}},
                             {"ph": "X", "cat": "kernel", "name": "other_gpu", "pid": 1, "tid": 7, "ts": 0, "dur": 99,
                              "args": {"device": 1}},
                             {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "pid": 0, "tid": 8, "ts": 60,
                              "dur": 4, "args": {"device": 0}}])
    events = A.busy_events(trace, device=0)
    # The kernel that "starts" (15) before its own launch (20) is a corrupted timestamp: dropped.
    assert [(e["ts"], e["end"]) for e in events] == [(10, 15), (40, 50), (60, 64)]
    assert [e["launch"] for e in events] == [0, 30, 60]  # memcpy without a launch record: its own start
    assert len(A.busy_events(trace)) == 4  # all devices
    assert A.union_length(A.gpu_intervals(trace, device=0)) == 19


def test_kernels_belong_to_the_step_that_launched_them():
    # Step 1 launches three kernels that run late (the CPU ran ahead); step 2 launches one.
    trace = gpu_trace([(1, 50, 40), (2, 90, 40), (3, 130, 40), (110, 170, 10)])
    groups = A.launched_in(A.busy_events(trace), [(0, 100), (100, 200)])
    assert [len(g) for g in groups] == [3, 1]
    assert A.union_length((e["ts"], e["end"]) for e in groups[0]) == 120


def test_sync_count_cuda_runtime_and_cpu_ops():
    trace = gpu_trace([(0, 1, 1)], syncs=[(10, 50, "cudaStreamSynchronize"), (70, 5, "cudaDeviceSynchronize"),
                                          (90, 1, "cudaMemcpyAsync"), (95, 1, "cudaMemcpy")])
    assert A.sync_times(trace) == [10, 70, 95]
    assert A.in_spans(A.sync_times(trace), [(0, 60), (60, 100), (100, 200)]) == [1, 2, 0]
    cpu = {"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::item", "pid": 1, "tid": 1, "ts": 5, "dur": 4},
        {"ph": "X", "cat": "cpu_op", "name": "aten::_local_scalar_dense", "pid": 1, "tid": 1, "ts": 6, "dur": 2},
        {"ph": "X", "cat": "cpu_op", "name": "aten::nonzero", "pid": 1, "tid": 1, "ts": 20, "dur": 2},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 30, "dur": 2}]}
    assert A.sync_times(cpu) == [6, 20]  # item() once (not twice), nonzero once
    other = {"ph": "X", "cat": "cpu_op", "name": "aten::nonzero", "pid": 1, "tid": 2, "ts": 40, "dur": 2}
    cpu["traceEvents"].append(other)
    assert A.sync_times(cpu, tid=1) == [6, 20] and A.sync_times(cpu) == [6, 20, 40]
    assert A.sync_times(cpu, tid=99) == [6, 20, 40]  # no events on that thread at all: count every thread


def test_clock_correction_from_our_own_syncs():
    trace = gpu_trace([], syncs=[(1000 + 150, 40, "cudaDeviceSynchronize"), (5000 + 150, 40, "cudaDeviceSynchronize"),
                                 (9000 + 150, 40, "cudaDeviceSynchronize")])
    ours = [(1000, 1040), (5000, 5040), (9000, 9040)]  # our clock reads 150 us early
    assert A.clock_correction(trace, ours) == pytest.approx(150)
    assert A.clock_correction(trace, [(10**9, 10**9 + 1)]) == 0.0  # nothing near: no correction
    assert A.clock_correction({"traceEvents": []}, ours) == 0.0


def test_snap_moves_points_out_of_slices_keeping_order():
    slices = [(10, 20), (30, 40)]
    assert A.snap([5, 12, 18, 20, 35, 36, 50], slices) == [5, 10, 20, 20, 30, 40, 50]  # a tie goes to the start
    points = [11, 14, 15, 16, 19]
    snapped = A.snap(points, slices)
    assert snapped == sorted(snapped)


def test_thread_slices_are_outermost_and_skip_other_threads():
    trace = {"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "outer", "tid": 1, "ts": 0, "dur": 10},
        {"ph": "X", "cat": "cpu_op", "name": "inner", "tid": 1, "ts": 2, "dur": 3},
        {"ph": "X", "cat": "cpu_op", "name": "next", "tid": 1, "ts": 10, "dur": 5},
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "tid": 1, "ts": 0, "dur": 100},
        {"ph": "X", "cat": "cpu_op", "name": "elsewhere", "tid": 2, "ts": 0, "dur": 50}]}
    assert A.thread_slices(trace, 1) == [(0, 10), (10, 15)]


def test_idle_split_by_gap_length_outside_data_waits():
    busy = A.merge([(0, 10), (40, 50), (60, 70), (500, 510)])
    # gaps: 10-40 (30, short), 50-60 (10, short), 70-500 (430, long), 510-600 (90, short)
    assert A.idle_split(busy, [(0, 600)], []) == (130, 430)
    # a data wait over 100-420 leaves 70-100 and 420-500 of the long gap: both short now
    assert A.idle_split(busy, [(0, 600)], [(100, 420)]) == (240, 0)
    assert A.idle_split(busy, [(0, 45), (55, 600)], [(100, 420)]) == (30 + 5 + 30 + 80 + 90, 0)


def test_aggregate_sorts_and_shares():
    rows = A.aggregate([("a", 10), ("b", 30), ("a", 20), ("c<T>&", 40)], top=2)
    assert [r["name"] for r in rows] == ["c<T>&", "a"]
    assert rows[1]["count"] == 2 and rows[1]["mean_us"] == 15 and rows[1]["total_ms"] == pytest.approx(0.03)
    assert sum(r["share"] for r in A.aggregate([("a", 1), ("b", 3)], top=None)) == pytest.approx(1.0)


def _figures(**kw):
    f = {"cuda": True, "utilisation": 0.3, "step_ms": 10.0, "data_ms": 0.1, "idle_data_ms": 0.1,
         "idle_short_ms": 5.0, "idle_long_ms": 1.0, "syncs_per_step": 0.1, "kernels_per_step": 400,
         "kernel_median_us": 6.0, "host_phases": [("loss", 3.0), ("forward", 2.0)], "workers": 8,
         "precision": "float16 autocast, scaler on"}
    f.update(kw)
    return f


def test_verdict_rules():
    assert A.verdict(_figures())["name"] == "launch-bound"
    assert "cuda_graph=True" in A.verdict(_figures())["lever"]
    graphed = A.verdict(_figures(graphed=True))  # graphs already on: never suggest turning them on
    assert graphed["name"] == "launch-bound" and "cuda_graph" not in graphed["lever"]
    assert "already runs as a CUDA graph" in graphed["reason"] and "loss 3.0 ms" in graphed["lever"]
    assert A.verdict(_figures(utilisation=A.COMPUTE_BOUND_UTIL))["name"] == "compute-bound"
    assert "larger batch" in A.verdict(_figures(utilisation=0.9))["lever"]
    assert "amp=True" in A.verdict(_figures(utilisation=0.9, precision="float32"))["lever"]
    data = A.verdict(_figures(data_ms=6.0, idle_data_ms=6.0))
    assert data["name"] == "dataloader-bound" and "workers=8" in data["lever"] and "cache=ram" in data["lever"]
    cached = A.verdict(_figures(data_ms=6.0, idle_data_ms=6.0, cache="ram"))  # cache=auto chose RAM: say so
    assert "cache=ram" not in cached["lever"] and "cached in RAM already" in cached["lever"]
    uncachable = A.verdict(_figures(data_ms=6.0, idle_data_ms=6.0, cache="n/a"))  # classify, segment
    assert "cache=ram" not in uncachable["lever"] and "cache does not apply" in uncachable["lever"]
    host = A.verdict(_figures(idle_long_ms=6.0))
    assert host["name"] == "host-bound" and "loss 3.0 ms" in host["reason"]
    assert A.verdict(_figures(syncs_per_step=A.HOST_SYNCS_PER_STEP))["name"] == "host-bound"
    # CPU: only two outcomes, decided by the data share alone.
    cpu = dict(cuda=False, idle_short_ms=0.0, idle_long_ms=0.0, syncs_per_step=5.0)
    assert A.verdict(_figures(utilisation=0.85, **cpu))["name"] == "compute-bound"
    assert A.verdict(_figures(utilisation=0.5, data_ms=5.0, **cpu))["name"] == "dataloader-bound"
    for v in (A.verdict(_figures()), A.verdict(_figures(utilisation=0.5, **cpu))):
        assert "\n" not in v["reason"] + v["lever"]


def test_the_levers_name_cuda_graph_full_where_the_step_can_be_captured_whole():
    """whole_reason "" (the family's step captures whole) and no whole-step replay yet: the host-bound
    and launch-bound levers point at cuda_graph=full; never for a step that syncs, a family that
    cannot, a window already replaying it, or inference."""
    host = _figures(idle_long_ms=6.0, whole_reason="")
    assert A.verdict(host)["lever"].startswith("cuda_graph=full")
    assert A.verdict({**host, "graphed": True})["lever"].startswith("cuda_graph=full")
    for other in ({"whole_reason": "YOLOX's L1 branch"}, {"whole_reason": None}, {"whole_step": True, "graphed": True},
                  {"syncs_per_step": A.HOST_SYNCS_PER_STEP}):
        v = A.verdict({**host, **other})
        assert v["name"] == "host-bound" and v["lever"].startswith("fix the code path"), other
    assert "cuda_graph=full the whole step" in A.verdict(_figures(whole_reason=""))["lever"]
    assert "cuda_graph=full" not in A.verdict(_figures(whole_reason="a reason"))["lever"]
    graphed = A.verdict(_figures(graphed=True, whole_reason=""))
    assert graphed["lever"].startswith("cuda_graph=full") and "loss 3.0 ms" in graphed["lever"]
    replaying = A.verdict(_figures(graphed=True, whole_step=True, whole_reason=""))
    assert "whole step already replays" in replaying["reason"] and "cuda_graph" not in replaying["lever"]
    assert "compile=true" in replaying["lever"]
    compiled = A.verdict(_figures(graphed=True, whole_step=True, whole_reason="cuda_graph=full is on", compiled=True))
    assert compiled["lever"] == "a larger batch"
    infer = A.verdict(_figures(graphed=True, whole_reason="", mode="infer", postprocess_syncs_per_step=0.0))
    assert "cuda_graph=full" not in infer["lever"]


def test_stats_ignores_missing_values():
    assert A.stats([1.0, None, 3.0]) == {"mean": 2.0, "std": pytest.approx(2 ** 0.5), "median": 2.0, "min": 1.0,
                                         "max": 3.0, "n": 2}
    assert A.stats([])["mean"] is None
    assert A.finite(float("nan")) is None and A.finite(2.0) == 2.0


def test_a_models_designed_syncs_do_not_make_the_step_host_bound():
    """A DETR step syncs 3 times by design (model.host_syncs): the verdict looks past them."""
    assert A.verdict(_figures(syncs_per_step=3.1))["name"] == "host-bound"
    designed = A.verdict(_figures(syncs_per_step=3.1, designed_syncs_per_step=3.0))
    assert designed["name"] == "launch-bound"
    named = A.verdict(_figures(syncs_per_step=4.2, designed_syncs_per_step=3.0))
    assert named["name"] == "host-bound" and "(3 of them the model's by design)" in named["reason"]


# --- memory-bound ---------------------------------------------------------------------------------
def test_memory_bound_comes_first_and_names_what_it_saw():
    calm = _figures(utilisation=0.9, alloc_retries=0, alloc_calls_per_step=0.2, reserved_mb=900.0, limit_mb=1000.0)
    assert A.memory_signals(calm) == [] and A.verdict(calm)["name"] == "compute-bound"
    retried = A.verdict({**calm, "alloc_retries": A.ALLOC_RETRIES})  # a compute-bound window with a retry
    assert retried["name"] == "memory-bound"
    assert retried["reason"].startswith("the caching allocator retried 1 time in the window")
    assert retried["reason"].endswith("GPU kernels busy 90% of the step")
    assert retried["lever"].startswith("a smaller batch or imgsz; or PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    assert "cuda_graph=true (replays allocate nothing" in retried["lever"]
    churn = A.verdict({**calm, "alloc_calls_per_step": A.ALLOC_CALLS_PER_STEP})
    assert churn["name"] == "memory-bound" and churn["reason"].startswith("1.0 cudaMalloc/cudaFree calls per step")
    assert churn["lever"].startswith("no torch.cuda.empty_cache()") and "smaller batch" not in churn["lever"]
    near = A.verdict({**calm, "reserved_mb": A.NEAR_LIMIT_FRAC * 1000.0})
    assert near["name"] == "memory-bound" and "reserved memory 950 of 1000 MB (95% of the allocator's limit)" in near["reason"]
    assert "cuda_graph" not in near["lever"]  # capacity, not churn: a graph's pool needs memory too
    # What the run already has is not suggested again; float32 gets amp.
    set_up = A.verdict({**calm, "alloc_retries": 3, "alloc_conf": "expandable_segments:True", "graphed": True,
                        "precision": "float32"})
    assert set_up["lever"] == "a smaller batch or imgsz; or amp=true (activations in half the bytes)"
    assert "3 times" in set_up["reason"]
    assert A.verdict({**calm, "alloc_retries": 5, "cuda": False})["name"] == "compute-bound"  # a CPU has no allocator


def test_allocator_calls_in_the_trace_per_step():
    trace = gpu_trace([(0, 1, 1)], syncs=[(10, 40, "cudaMalloc"), (20, 5, "cudaFree"), (150, 30, "cudaMalloc"),
                                          (160, 3, "cudaLaunchKernel"), (300, 9, "cudaMalloc")])
    assert A.alloc_calls(trace, [(0, 100), (100, 200), (200, 250)]) == [(2, 45.0), (1, 30.0), (0, 0.0)]


# --- host operators -------------------------------------------------------------------------------
def _op(name, tid, ts, dur):
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}


def test_host_ops_self_and_total_time_per_step():
    trace = {"traceEvents": [
        _op("aten::conv2d", 1, 0, 100), _op("aten::convolution", 1, 5, 90), _op("aten::empty", 1, 10, 10),
        _op("aten::add", 1, 120, 20),
        _op("aten::conv2d", 1, 200, 50), _op("aten::convolution", 1, 205, 40),   # step 2
        _op("aten::to", 1, 300, 30), _op("aten::to", 1, 305, 10),               # recursion, outside the spans
        _op("autograd::engine::evaluate_function: AddBackward0", 9, 130, 10),    # autograd's device thread
        _op("aten::pin_memory", 5, 0, 400),                                      # pin-memory thread: not the step's
    ]}
    threads = A.step_threads(trace, 1)
    assert threads == {1, 9}
    table = A.host_ops(trace, threads, [(0, 150), (200, 260)], steps=2)
    rows = {r["name"]: r for r in table["rows"]}
    assert set(rows) == {"aten::conv2d", "aten::convolution", "aten::empty", "aten::add",
                         "autograd::engine::evaluate_function: AddBackward0"}
    assert rows["aten::convolution"]["self_ms_per_step"] == pytest.approx((80 + 40) / 2 / 1e3)
    assert rows["aten::conv2d"]["self_ms_per_step"] == pytest.approx((10 + 10) / 2 / 1e3)
    assert rows["aten::conv2d"]["total_ms_per_step"] == pytest.approx(150 / 2 / 1e3)
    assert rows["aten::convolution"]["calls_per_step"] == 1.0
    assert table["self_ms_per_step"] == pytest.approx((100 + 20 + 10 + 50) / 2 / 1e3)  # every op's self time once
    assert [r["name"] for r in table["rows"]][0] == "aten::convolution" and table["ops"] == 5
    assert sum(r["self_share"] for r in table["rows"]) == pytest.approx(1.0)
    # Without spans: everything on the threads; a recursive op's total counts its outer call only.
    to = {r["name"]: r for r in A.host_ops(trace, {1}, None, steps=1)["rows"]}["aten::to"]
    assert (to["calls_per_step"], to["self_ms_per_step"], to["total_ms_per_step"]) == (2, 0.03, 0.03)
    assert len(A.host_ops(trace, threads, None, steps=1, top=2)["rows"]) == 2
