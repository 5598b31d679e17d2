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

    monkeypatch.setattr(bench, "prepare", lambda user, workdir, arms=None: {})
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
    monkeypatch.setattr(bench, "prepare", lambda user, workdir, arms=None: {})
    monkeypatch.setattr(bench, "_run_arm_process", lambda workdir, arm, steps, warmup: _record(arm, 20.0))
    [only] = bench.bench_step({"model": "yolo9-t"}, ["fp32"])
    assert only["runs_ms"] == [20.0] and only["spread"] == 0.0 and only["speedup"] == 1.0
    assert "run spread" not in bench.format_table([only])


def test_levers_that_cannot_act_on_the_device_are_named(monkeypatch):
    import torch

    from libreyolo.engine import precision
    from libreyolo.families import get_family

    spec, cpu = get_family("yolo9"), torch.device("cpu")
    assert bench.inert_levers("eager", spec, None, cpu) == [] and bench.inert_levers("fp32+nchw", spec, None, cpu) == []
    assert bench.inert_levers("bfloat16+graph", spec, None, cpu) == [
        "bfloat16 autocast needs a CUDA device", "CUDA graphs need a CUDA device (training on cpu)"]
    with pytest.raises(ConfigError) as err:
        bench.refuse_inert_arms(["eager", "float16", "fp32+graph"], spec, None, cpu)
    assert str(err.value) == (
        "bench arms whose lever cannot act on cpu: 'float16' (float16 autocast needs a CUDA device); 'fp32+graph' "
        "(CUDA graphs need a CUDA device (training on cpu)); they would time what another arm times and report "
        "noise as a speed-up (arms that act on cpu: eager, fp32, compile, nchw, nhwc)")
    # A GPU without native bfloat16 would run the bfloat16 arm as float16: not a bfloat16 figure.
    monkeypatch.setattr(precision, "bf16_native", lambda device: False)
    gpu = torch.device("cuda", 0)
    assert bench.inert_levers("bfloat16", spec, None, gpu) == ["bfloat16 is not native on this GPU (it would run "
                                                               "as float16)"]
    assert bench.inert_levers("float16+graph", spec, None, gpu) == []


def test_the_timed_batch_is_at_imgsz_even_for_a_multi_scale_recipe(tmp_path):
    import torch

    from libreyolo.bench import prepare

    meta = prepare({"model": "rtdetr-r18", "imgsz": 64, "batch": 2, "device": "cpu"}, tmp_path)
    assert meta["config"]["multi_scale"] is False  # the family's recipe says True
    assert torch.load(tmp_path / "batch.pt", weights_only=True)["images"].shape[-2:] == (64, 64)
