"""`bench step` bookkeeping without running arms: arm names, repeats, the combined record."""

import pytest

from libreyolo import bench
from libreyolo.errors import ConfigError


def test_arm_names_combine_deltas():
    assert bench.arm_delta("bfloat16+graph+nchw") == {"amp": True, "amp_dtype": "bfloat16", "cuda_graph": True,
                                                      "channels_last": False}
    assert bench.arm_delta("eager") == {}
    with pytest.raises(ConfigError, match="unknown arm 'float16\\+turbo'"):
        bench.arm_delta("float16+turbo")


def _record(arm, median, **kw):
    return {"arm": arm, "precision": "float32", "step_ms_min": median - 1, "step_ms_median": median,
            "kernel_busy_ms": None, "utilisation": None, "network_share": 0.8, "peak_mem_mb": None,
            "arch": "yolo9-t", "batch": 8, "imgsz": 640, "device": "cpu", "steps": 24, "warmup": 10, **kw}


def test_repeats_interleave_arms_and_report_the_median_run(monkeypatch, tmp_path):
    medians = iter([30.0, 10.0, 50.0, 12.0, 40.0, 11.0])  # eager, graph, eager, graph, eager, graph
    order = []

    def fake_run(workdir, arm, steps, warmup):
        order.append(arm)
        return _record(arm, next(medians), run=len(order))

    monkeypatch.setattr(bench, "prepare", lambda user, workdir: {})
    monkeypatch.setattr(bench, "_run_arm_process", fake_run)
    eager, graph = bench.bench_step({"model": "yolo9-t"}, ["eager", "graph"], repeat=3)
    assert order == ["eager", "graph"] * 3
    assert eager["runs_ms"] == [30.0, 50.0, 40.0] and eager["step_ms_median"] == 40.0 and eager["run"] == 5
    assert eager["spread"] == pytest.approx(20 / 40)
    assert graph["step_ms_median"] == 11.0 and graph["spread"] == pytest.approx(2 / 11)
    assert graph["speedup"] == pytest.approx(40 / 11)
    table = bench.format_table([eager, graph])
    assert "run spread" in table and "50 %" in table and "median of 3 runs per arm" in table


def test_one_run_per_arm_keeps_the_plain_table(monkeypatch):
    monkeypatch.setattr(bench, "prepare", lambda user, workdir: {})
    monkeypatch.setattr(bench, "_run_arm_process", lambda workdir, arm, steps, warmup: _record(arm, 20.0))
    [only] = bench.bench_step({"model": "yolo9-t"}, ["fp32"])
    assert only["runs_ms"] == [20.0] and only["spread"] == 0.0 and only["speedup"] == 1.0
    assert "run spread" not in bench.format_table([only])
