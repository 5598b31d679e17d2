"""profile what-if on plain profile dicts: each lever's prediction and its assumption, the AMP ratio's
source, and the profiles it refuses; the bundled recorded profiles (tests/fixtures/profiler)."""

import copy
import io
import json
import statistics
from pathlib import Path

import pytest
from testkit import make_profile

from libreyolo.errors import ProfileFormatError
from libreyolo.profiler.artifacts import load_profile
from libreyolo.profiler.report import print_whatif
from libreyolo.profiler.whatif import AMP_KERNEL_RATIO, FULL, FULL_COMPILE, GRAPH, LOADER, what_if

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = sorted((ROOT / "tests" / "fixtures" / "profiler").glob("*.json"))


def eager(step=100.0, busy=18.0, host=99.0, fwd=30.0, bwd=45.0, wait=0.5, idle=0.4, precision="float32",
          region="network"):
    """A version-2 GPU training profile: an eager window with its captured region timed."""
    p = make_profile()
    p["headline"].update(step_ms_mean=step, kernel_busy_ms=busy, utilisation=busy / step, data_wait_ms=wait,
                         precision=precision)
    p["run"].update(precision=precision)
    p["utilisation"].update(idle_data_ms=idle, host_step_ms=host)
    p["capture"] = {"region": region, "note": "the whole network", "whole": "", "forward_host_ms": fwd,
                    "backward_host_ms": bwd, "host_ms": fwd + bwd, "busy_ms": 15.0, "kernels_per_step": 3000.0}
    p["overhead"]["graphed"] = False
    return p


def by_lever(result):
    return {p["lever"]: p for p in result["predictions"]}


def test_graph_removes_the_regions_host_time_and_keeps_the_kernels():
    out = by_lever(what_if(eager()))
    g = out[GRAPH]
    assert g["applies"] and g["step_ms"] == pytest.approx(99.0 - 75.0) and g["bound"] == "host"
    assert g["speedup"] == pytest.approx(100.0 / 24.0)
    assert "forward 30.0 + backward 45.0 ms of the 99.0 ms host time" in g["assumption"]
    # Little host time left outside the region: the kernels set the graphed step.
    g = by_lever(what_if(eager(fwd=40.0, bwd=50.0)))[GRAPH]
    assert g["step_ms"] == pytest.approx(18.0) and g["bound"] == "kernels"


def _phases(p, **host_ms):
    for row in p["phases"]:
        row["host_ms"] = host_ms.get(row["phase"], row["host_ms"])
    return p


def test_full_removes_the_whole_steps_host_time_but_the_data_and_upload():
    p = _phases(eager(), data=0.5, h2d=1.5, forward=30.0, loss=10.0, backward=45.0, optimizer=6.0, ema=2.0)
    f = by_lever(what_if(p))[FULL]
    # 99 ms of host time, 93 of it in the captured phases: the 18 ms of kernels set the step.
    assert f["applies"] and f["step_ms"] == pytest.approx(18.0) and f["bound"] == "kernels" and f["host_ms"] == 6.0
    assert "forward 30.0 + loss 10.0 + backward 45.0 + optimizer 6.0 + ema 2.0 ms of the 99.0 ms" in f["assumption"]
    # Host time outside the step's phases (a slow upload, the loop) stays and can set the step.
    outside = by_lever(what_if(_phases(eager(), forward=20.0, loss=5.0, backward=30.0, optimizer=2.0, ema=1.0)))
    assert outside[FULL]["step_ms"] == pytest.approx(99.0 - 58.0) and outside[FULL]["bound"] == "host"


def test_full_does_not_apply_where_the_step_cannot_be_captured_whole():
    detr = eager(region="encoder")
    detr["capture"]["whole"] = "the denoising reads the batch's largest box count on the host"
    f = by_lever(what_if(detr))[FULL]
    assert not f["applies"] and "cannot be captured whole: the denoising reads" in f["assumption"]
    old = eager()
    del old["capture"]["whole"]  # a profile from before cuda_graph=full
    assert "profile the run again" in by_lever(what_if(old))[FULL]["assumption"]
    untimed = eager()
    untimed["phases"] = [row for row in untimed["phases"] if row["phase"] != "ema"]
    assert "did not time the step's" in by_lever(what_if(untimed))[FULL]["assumption"]
    infer = eager()
    infer["run"]["mode"] = "infer"
    assert "a training lever" in by_lever(what_if(infer))[FULL]["assumption"]


def _kernels(p, *rows):
    p["kernels"]["rows"] = [{"name": n, "count": 1, "total_ms": 1.0, "mean_us": 1.0, "share": share} for n, share in rows]
    return p


def test_full_compile_keeps_only_the_extern_kernels_a_floor_up_to_full():
    p = _phases(eager(), data=0.5, h2d=1.5, forward=30.0, loss=10.0, backward=45.0, optimizer=6.0, ema=2.0)
    _kernels(p, ("sm90_xmma_fprop_implicit_gemm_f16", 0.4), ("cutlass__5x_cudnn::Kernel<ImplicitGemmConvolution>", 0.1),
             ("void cudnn::batchnorm_fwtr_nhwc_semiPersist<__half>", 0.2), ("at::native::vectorized_elementwise_kernel", 0.2))
    f = by_lever(what_if(p))[FULL_COMPILE]
    # 18 ms of kernels, half of them convolutions (batch norm is fused, not kept): 9 ms; the host 6 ms.
    assert f["applies"] and f["step_ms"] == pytest.approx(9.0) and f["step_ms_range"] == pytest.approx([9.0, 18.0])
    assert f["bound"] == "kernels (extern floor)" and "50% of the 18.0 ms busy: 9.0 ms" in f["assumption"]
    assert "outside the window's top 4 (10% of the busy time)" in f["assumption"]
    _kernels(p, ("sm90_xmma_gemm", 0.1), ("elementwise", 0.9))
    assert by_lever(what_if(p))[FULL_COMPILE]["step_ms"] == pytest.approx(6.0)  # the host sets it: 1.8 ms of kernels
    assert by_lever(what_if(p))[FULL_COMPILE]["bound"] == "host"
    # A compiled window's own kernels are fused ones whatever their names say; with no extern kernel
    # by name there is no floor (not a floor of zero).
    _kernels(p, ("triton_poi_fused_convolution_0", 0.5), ("elementwise", 0.5))
    f = by_lever(what_if(p))[FULL_COMPILE]
    assert not f["applies"] and "none of the window's top 2 kernels is a convolution or GEMM" in f["assumption"]


def test_full_compile_applies_only_where_full_does_and_the_region_is_the_whole_network():
    detr = eager(region="encoder")
    f = by_lever(what_if(detr))[FULL_COMPILE]
    assert not f["applies"] and "this family's is its encoder" in f["assumption"]
    old = eager()
    del old["capture"]["whole"]
    f = by_lever(what_if(old))[FULL_COMPILE]
    assert not f["applies"] and f["assumption"].startswith("as cuda_graph=full: the profile does not say")


def test_amp_saves_kernel_time_only_where_the_gpu_is_the_bottleneck():
    ratio, lo, hi, n = AMP_KERNEL_RATIO["float16"]
    launch = by_lever(what_if(eager()))["amp=true amp_dtype=float16"]
    assert launch["step_ms"] == 100.0 and launch["bound"] == "host" and launch["kernel_busy_ms"] == pytest.approx(18 * ratio)
    assert f"median of {n} configurations" in launch["assumption"] and "utilisation 0.18 < 0.80" in launch["assumption"]
    compute = by_lever(what_if(eager(step=20.0, busy=18.0, host=19.0)))["amp=true amp_dtype=float16"]
    assert compute["step_ms"] == pytest.approx(20.0 - 18.0 * (1 - ratio)) and compute["bound"] == "kernels"
    assert compute["step_ms_range"] == pytest.approx([20.0 - 18.0 * (1 - lo), 20.0 - 18.0 * (1 - hi)])
    # Graphs and AMP together: the host time without the region against the shrunk kernels.
    both = by_lever(what_if(eager(fwd=40.0, bwd=50.0)))[f"{GRAPH} amp=true amp_dtype=float16"]
    assert both["step_ms"] == pytest.approx(18.0 * ratio) and both["bound"] == "kernels"
    assert both["speedup"] == pytest.approx(100.0 / (18.0 * ratio))
    reduced = by_lever(what_if(eager(precision="float16 autocast, scaler on")))
    assert not reduced["amp=true amp_dtype=bfloat16"]["applies"]
    assert "ran float16 autocast, scaler on already" in reduced["amp=true amp_dtype=float16"]["assumption"]
    assert f"{GRAPH} amp=true amp_dtype=float16" not in reduced


def test_a_loader_that_never_waits_removes_the_idle_part_of_the_wait():
    p = by_lever(what_if(eager(wait=3.0, idle=2.5)))[LOADER]
    assert p["step_ms"] == pytest.approx(97.5) and "the 2.50 ms per step the GPU sat idle" in p["assumption"]


def test_levers_that_do_not_apply_say_why():
    graphed = eager()
    graphed["overhead"]["graphed"] = True
    assert "already replays a CUDA graph" in by_lever(what_if(graphed))[GRAPH]["assumption"]
    none = eager(region="none")
    none["capture"]["note"] = "a dynamic decoder"
    g = by_lever(what_if(none))[GRAPH]
    assert not g["applies"] and g["step_ms"] is None and "no capturable region (a dynamic decoder)" in g["assumption"]
    untimed = eager()
    untimed["capture"]["backward_host_ms"] = None
    assert "did not time" in by_lever(what_if(untimed))[GRAPH]["assumption"]
    untimed = eager()
    untimed["capture"]["host_ms"] = None
    assert "did not time" in by_lever(what_if(untimed))[GRAPH]["assumption"]


def test_inference_windows_take_the_forward_phase_as_the_region():
    p = eager(bwd=0.0)
    p["run"]["mode"] = "infer"
    p["capture"].update(region="forward", backward_host_ms=None, host_ms=30.0)
    g = by_lever(what_if(p))[GRAPH]
    assert g["step_ms"] == pytest.approx(69.0) and "the forward phase (predict's graph" in g["assumption"]
    assert "applied to inference" in by_lever(what_if(p))["amp=true amp_dtype=float16"]["assumption"]


def test_refusals_are_one_line():
    old = {**eager(), "schema_version": 1}
    with pytest.raises(ProfileFormatError, match=r"is profile schema version 1: profile what-if reads version 2 "
                                                 r"profiles \(profile the run again\)"):
        what_if(old)
    edited = eager()
    del edited["capture"]
    with pytest.raises(ProfileFormatError, match="has no usable data for profile what-if: capture is missing"):
        what_if(edited)
    edited = eager()
    edited["capture"]["host_ms"] = "a lot"
    with pytest.raises(ProfileFormatError, match=r'capture.host_ms is "a lot", not a finite number or null'):
        what_if(edited)
    for key, value, said in (("step_ms_mean", 0.0, "is 0.0, not a number above 0"),
                             ("kernel_busy_ms", float("nan"), "is NaN, not a finite number")):
        edited = eager()
        edited["headline"][key] = value
        with pytest.raises(ProfileFormatError, match=f"headline.{key} {said}"):
            what_if(edited)


def test_print_and_json():
    result = what_if(eager(), path="runs/profile/prof")
    json.dumps(result)  # --json writes exactly this
    text = io.StringIO()
    print_whatif(result, file=text)
    lines = text.getvalue().splitlines()
    assert lines[0].startswith("what-if (training): yolo9-t  batch 8  imgsz 640  on NVIDIA H200  precision float32")
    assert "captured region (network) 75.0 ms" in lines[1]
    assert any(line.startswith("cuda_graph=true ") and "24.0" in line and "4.17x" in line for line in lines)
    assert "assumptions:" in lines and sum(line.startswith("- ") for line in lines) == len(result["predictions"])


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_the_bundled_profiles(path):
    """Recorded profiles, read as standalone copies: every lever answers, and a CPU window only
    predicts the dataloader."""
    p = load_profile(path)
    result = by_lever(what_if(copy.deepcopy(p)))
    assert set(result) >= {GRAPH, "amp=true amp_dtype=float16", "amp=true amp_dtype=bfloat16", LOADER}
    for pred in result.values():
        assert pred["assumption"] and (pred["step_ms"] is None) == (not pred["applies"])
        if pred["applies"]:
            assert 0 < pred["step_ms"] <= p["headline"]["step_ms_mean"] * 1.000001
    if p["kernels"]["kind"] != "kernel":
        assert [k for k, v in result.items() if v["applies"]] == [LOADER]
        assert result[LOADER]["step_ms"] == pytest.approx(p["headline"]["step_ms_mean"] - p["headline"]["data_wait_ms"])


def test_amp_ratios_are_the_bundled_bench_records():
    """AMP_KERNEL_RATIO is what bench step measured: each config's eager float16 (bfloat16) kernel
    busy over its fp32 one, from the records the constant cites."""
    results = ROOT / "benchmarks" / "results" / "h200"
    files = sorted(results.glob("step_yolo9-*_b*.json")) + [results / "classify" / "step_classifiers_b16.json"]
    busy = {}
    for f in files:
        for r in json.loads(f.read_text()):
            busy[(r["arch"], r["batch"], r["arm"])] = r["kernel_busy_ms"]
    for dtype in ("float16", "bfloat16"):
        ratios = [busy[(a, b, dtype)] / ms for (a, b, arm), ms in busy.items() if arm == "fp32" and (a, b, dtype) in busy]
        median, lo, hi, n = AMP_KERNEL_RATIO[dtype]
        assert len(ratios) == n
        assert (min(ratios), statistics.median(ratios), max(ratios)) == pytest.approx((lo, median, hi), abs=6e-4)


@pytest.mark.parametrize(("name", "cases"), [("whatif", 6), ("whatif_autotuned", 2)])
def test_the_h200_validation_is_what_the_code_predicts_from_its_profiles(name, cases):
    """The published validations (docs: within 15 % in every case; the second with the profile
    run's cuDNN autotuning) stay the code's own: each case's eager H200 profile, kept beside the
    record, still predicts the graphed step the record holds, and its error is measured against
    `bench step`'s graphed step."""
    folder = ROOT / "benchmarks" / "results" / "h200" / "profile" / name
    record = json.loads((folder / "whatif_validate.json").read_text())
    assert len(record["cases"]) == cases
    for case in record["cases"]:
        predicted = by_lever(what_if(load_profile(folder / case["profile"])))[GRAPH]
        assert predicted["step_ms"] == pytest.approx(case["predicted_ms"], rel=1e-9), case["model"]
        assert case["error"] == pytest.approx(predicted["step_ms"] / case["measured_ms"] - 1)
        assert abs(case["error"]) <= record["target"]


def test_the_compile_floors_quoted_in_the_docs_come_from_the_stored_h200_windows():
    """docs/training-performance.md (`compile=true`) quotes these from the eager windows kept for the
    what-if validation; they were written before cuda_graph=full, so `whole` is set as the family
    plan says (the YOLO families' steps capture whole)."""
    floors = {}
    for name in ("yolo9-t_b8", "yolo9-t_b2", "yolox-t_b8", "rtmdet-t_b8"):
        p = json.loads((ROOT / "benchmarks/results/h200/profile/whatif/profiles" / f"{name}.json").read_text())
        p["capture"]["whole"] = ""
        floors[name] = by_lever(what_if(p))[FULL_COMPILE]
    assert floors["yolo9-t_b8"]["step_ms"] == pytest.approx(13.2, abs=0.05)
    assert "52% of the 25.3 ms busy" in floors["yolo9-t_b8"]["assumption"]
    for name in ("yolo9-t_b2", "yolox-t_b8", "rtmdet-t_b8"):
        assert any(f"{k}% of the" in floors[name]["assumption"] for k in (29, 30)), floors[name]["assumption"]
