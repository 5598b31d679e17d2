"""profile compare on plain profile dicts: the change line, its cause, the deltas and the refusals."""

import io
import json

import pytest
from testkit import KERNEL, make_profile

from libreyolo.errors import ConfigError, ProfileFormatError
from libreyolo.profiler.compare import TOLERANCE, compare, figures
from libreyolo.profiler.report import print_compare


def variant(step=16.0, busy=4.0, wait=0.2, verdict="launch-bound", **run):
    """make_profile() with other headline figures (and run settings)."""
    p = make_profile()
    p["headline"].update(step_ms_mean=step, kernel_busy_ms=busy, data_wait_ms=wait, verdict=verdict,
                         utilisation=busy / step)
    p["verdict"]["name"] = verdict
    p["run"].update(run)
    return p


def cpu(step, wait, verdict="compute-bound"):
    p = variant(step, step - wait, wait, verdict, device_name="cpu")
    p["kernels"]["kind"] = "cpu_op"
    return p


def test_faster_from_idle_time_reads_as_the_issue_example():
    a = variant(24.3, 6.0, 0.3, "launch-bound")
    b = variant(8.5, 6.1, 0.3, "compute-bound", cuda_graph={"enabled": True, "replayed_steps": 2, "pool_mb": 1.0})
    b["headline"]["cuda_graph"] = True
    c = compare(a, b)["change"]
    assert c["line"] == ("B is 2.86x faster (24.3 -> 8.5 ms per step): idle between kernels 18.0 -> 2.1 ms; "
                         "kernel busy 6.0 -> 6.1 ms (unchanged); data wait 0.30 -> 0.30 ms (unchanged); "
                         "verdict launch-bound -> compute-bound")
    assert c["direction"] == "faster" and c["cause"] == "idle" and c["speedup"] == pytest.approx(24.3 / 8.5)
    assert compare(a, b)["setup_changes"] == {"cuda_graph": [False, True]}


def test_slower_from_kernel_time():
    c = compare(variant(10.0, 8.0, 0.1, "compute-bound"), variant(13.0, 11.0, 0.1, "compute-bound"))["change"]
    assert c["line"] == ("B is 1.3x slower (10.0 -> 13.0 ms per step): kernel busy 8.0 -> 11.0 ms; idle between "
                         "kernels 1.9 -> 1.9 ms (unchanged); data wait 0.10 -> 0.10 ms (unchanged); verdict "
                         "compute-bound (unchanged)")
    assert (c["direction"], c["cause"]) == ("slower", "kernel")


def test_faster_from_data_wait():
    c = compare(variant(20.0, 8.0, 10.0, "dataloader-bound"), variant(10.5, 8.0, 0.5, "compute-bound"))["change"]
    assert c["line"].startswith("B is 1.9x faster (20.0 -> 10.5 ms per step): data wait 10.0 -> 0.50 ms; ")
    assert (c["direction"], c["cause"]) == ("faster", "data")
    assert c["components"]["kernel"]["unchanged"] and c["components"]["idle"]["unchanged"]


def test_unchanged_within_the_tolerance_and_just_outside_it():
    c = compare(variant(16.0), variant(16.0 * (1 + TOLERANCE)))["change"]
    assert c["line"].startswith("B is unchanged within 5% (16.0 -> 16.8 ms per step): ")
    assert (c["direction"], c["cause"]) == ("unchanged", None)
    assert compare(variant(16.0), variant(16.0 * 0.94))["change"]["direction"] == "faster"
    # A component counts as unchanged when it moves by at most 5 % of A's step (0.8 ms here).
    c = compare(variant(16.0, 4.0), variant(17.7, 4.8))["change"]
    assert c["components"]["kernel"]["unchanged"] and not c["components"]["idle"]["unchanged"]
    assert c["line"].startswith("B is 1.11x slower (16.0 -> 17.7 ms per step): idle between kernels 11.8 -> 12.7 ms; "
                                "kernel busy 4.0 -> 4.8 ms (unchanged); ")


def test_cpu_profiles_compare_compute_and_data_wait_only():
    out = compare(cpu(12.5, 2.7, "dataloader-bound"), cpu(11.6, 0.5))
    assert out["kernel_kind"] == "cpu_op" and out["a"]["kernels_per_step"] is None
    assert set(out["change"]["components"]) == {"kernel", "data"}
    assert out["change"]["line"] == ("B is 1.08x faster (12.5 -> 11.6 ms per step): data wait 2.7 -> 0.50 ms; "
                                     "compute 9.8 -> 11.1 ms; verdict dataloader-bound -> compute-bound")
    text = io.StringIO()
    print_compare(out, file=text)
    assert "compute ms" in text.getvalue() and "idle between" not in text.getvalue().split("change:")[0]
    assert "CPU op" in text.getvalue()


def test_figures_add_idle_and_kernels_per_step_to_the_summary():
    f = figures(variant(16.0, 4.0, 0.2))
    assert f["idle_ms"] == pytest.approx(11.8) and f["data_idle_ms"] == pytest.approx(0.2)
    assert f["kernels_per_step"] == 900 and f["verdict"] == "launch-bound" and f["mode"] == "train"
    # A data wait the GPU was busy through is not idle: only the part with the GPU idle counts.
    f = figures(variant(10.0, 9.5, 2.0, "compute-bound"))
    assert f["data_idle_ms"] == pytest.approx(0.5) and f["idle_ms"] == pytest.approx(0.0)
    p = variant()
    p["headline"]["kernel_busy_ms"] = None
    assert figures(p)["idle_ms"] is None
    assert set(compare(variant(), p)["change"]["components"]) == set()


def test_deltas_of_figures_phases_and_kernels():
    a, b = variant(16.0, 4.0), variant(8.0, 4.0, verdict="compute-bound")
    for p in b["phases"]:
        p["synced_ms"] = 1.0
    b["phases"].append({"phase": "extra", "host_ms": 0.5, "synced_ms": 0.5, "share": 0.0})
    b["steps"] = b["steps"] * 2  # 8 steps: kernel totals compare per step
    b["kernels"]["rows"] = [{"name": "new_kernel", "count": 8, "total_ms": 8.0, "mean_us": 1000.0, "share": 0.8},
                            {"name": "sm90_xmma_gemm [x]", "count": 20, "total_ms": 2.0, "mean_us": 100.0, "share": 0.2}]
    out = compare(a, b)
    assert out["figures"]["step_ms_mean"] == {"a": 16.0, "b": 8.0, "delta": -8.0, "ratio": 0.5}
    assert out["figures"]["verdict"] == {"a": "launch-bound", "b": "compute-bound", "changed": True}
    forward = next(r for r in out["phases"] if r["phase"] == "forward")
    assert (forward["a_ms"], forward["b_ms"], forward["delta_ms"], forward["ratio"]) == (2.0, 1.0, -1.0, 0.5)
    assert out["phases"][-1] == {"phase": "extra", "a_ms": None, "b_ms": 0.5, "delta_ms": None, "ratio": None,
                                 "a_host_ms": None, "b_host_ms": 0.5}
    rows = {r["name"]: r for r in out["kernels"]}
    assert rows["new_kernel"] == {"name": "new_kernel", "a_ms": 0.0, "b_ms": 1.0, "delta_ms": 1.0}  # A's rows are complete
    assert rows[KERNEL] == {"name": KERNEL, "a_ms": 0.75, "b_ms": 0.0, "delta_ms": -0.75}
    assert rows["sm90_xmma_gemm [x]"]["delta_ms"] == 0.0
    assert [r["name"] for r in out["kernels"]] == ["new_kernel", KERNEL, "sm90_xmma_gemm [x]"]  # largest change first
    assert [r["name"] for r in compare(a, b, top=1)["kernels"]] == ["new_kernel", KERNEL]
    # Rows cut at the kept maximum (shares short of 1): a kernel missing there is unknown, not 0.
    b["kernels"]["rows"][1]["share"] = 0.1
    assert {r["name"]: r["b_ms"] for r in compare(a, b)["kernels"]}[KERNEL] is None
    json.dumps(out)  # --json writes exactly this


def test_refusals_and_force():
    older = {**make_profile(), "schema_version": 1}
    with pytest.raises(ProfileFormatError, match="A is profile schema version 1 and B version 2"):
        compare(older, make_profile())
    infer = variant(mode="infer")
    with pytest.raises(ConfigError, match=r"A profiles training and B inference: compare like with like"):
        compare(make_profile(), infer)  # no run.mode: a training profile
    assert compare(variant(mode="train"), make_profile())["mode"] == "train"
    with pytest.raises(ConfigError, match=r"A and B differ in batch \(8 vs 16\) and imgsz \(640 vs 320\): .* "
                                          r"add --force to compare them anyway"):
        compare(make_profile(), variant(batch=16, imgsz=320))
    with pytest.raises(ConfigError, match="force"):
        compare(make_profile(), variant(imgsz=320), force=False)
    out = compare(make_profile(), variant(batch=16), force=True)
    assert out["notes"] == ["batch (8 vs 16) differs: compared because of --force; per-step figures are not like "
                            "for like"]
    assert out["setup_changes"] == {"batch": [8, 16]}
    both = compare(make_profile(), variant(batch=16, imgsz=320), force=True)["notes"][0]
    assert both.startswith("batch (8 vs 16) and imgsz (640 vs 320) differ: compared because of --force")
    assert compare(make_profile(), make_profile(), force=True)["notes"] == []


def test_print_compare_plain_and_rich(monkeypatch):
    out = compare(variant(16.0), variant(8.0, verdict="compute-bound", batch=16, workers=2), force=True,
                  paths=("runs/a", "runs/b"))
    text = io.StringIO()
    print_compare(out, file=text)
    lines = text.getvalue().splitlines()
    assert lines[0] == "compare"
    assert lines[1].startswith("A: yolo9-t  batch 8  imgsz 640  workers 8  on NVIDIA H200") and lines[1].endswith("(runs/a)")
    assert lines[3] == "setup changed: batch 8 -> 16, workers 8 -> 2"
    assert lines[4].startswith("note: batch (8 vs 16) differs: compared because of --force")
    assert lines[-1] == f"change: {out['change']['line']}"
    assert any(line.startswith("step ms ") and "16.0 ± 0.5" in line and "0.50x" in line for line in lines)
    assert any(line.startswith("verdict ") and "changed" in line for line in lines)
    assert "vectorized_elementwise_kernel" in text.getvalue()
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich tables, as on a terminal
    rich = io.StringIO()
    print_compare(compare(variant(mode="infer"), variant(8.0, mode="infer")), file=rich)
    assert rich.getvalue().startswith("compare (inference)") and "┃" in rich.getvalue()
    assert "sm90_xmma_gemm [x]" in rich.getvalue()  # names are text, never markup
