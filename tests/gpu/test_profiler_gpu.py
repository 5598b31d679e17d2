"""The profiler on a real GPU (issues 5 and 17): YOLOv9-t batch 8 at 640, float16, 5 skipped steps,
then the window (10 timed, 10 + 10 recorded, 2 op steps).

Every profiled run is its own process (`python -c DRIVER`): one profiler recording per process, as
`libreyolo profile run --repeat` does (a second recording in one process can corrupt timestamps).
nbs=8: every step updates the weights, as every `bench step` step does, so the two time one step.
Loader: 8 workers and cache=ram, about 590 images/s on the H200 host, above the ~400 a 20 ms graphed
step consumes (`bench step` replays one batch, without a loader); with 4 workers (375 images/s) the
graphed window read 25.4 ms against bench's 19.7 ms.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from libreyolo.profiler import analyze as A

pytestmark = pytest.mark.gpu

VERDICTS = {"dataloader-bound", "launch-bound", "host-bound", "compute-bound", "memory-bound"}
SRC = Path(__file__).resolve().parents[2] / "src"
# Plants a fault in the loss when asked, then runs what `libreyolo profile run` runs:
# - item: an `.item()` per step (a host sync);
# - empty_cache: torch.cuda.empty_cache() per step, a common mistake: the allocator gives its free
#   blocks back every step and the backward allocates them again (cudaFree + cudaMalloc per step);
# - fraction: at the window's second step, a per-process memory limit three quarters of the way from
#   the peak allocation of five whole steps to the memory the allocator had reserved for them, and
#   its cache emptied: the batch still fits, but the allocator runs out of room to cache and retries
#   (frees its cache and calls cudaMalloc again). (Measured from the first timed step's loss, the
#   peak missed that step's backward, and halfway ran out of memory on the H200.)
DRIVER = r"""
import sys
import torch
from libreyolo.families.yolo9.loss import YOLO9Loss
kind = sys.argv[1]
call, calls = YOLO9Loss.__call__, [0]
def planted(self, preds, targets):
    loss, items = call(self, preds, targets)
    calls[0] += 1
    if kind == "item":
        loss.detach().item()
    elif kind == "empty_cache":
        torch.cuda.empty_cache()
    elif kind == "fraction" and calls[0] == 2:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    elif kind == "fraction" and calls[0] == 7:  # profile_skip=5: steps 2-6 are whole, 7 is the second timed
        peak, reserved = torch.cuda.max_memory_allocated(), torch.cuda.memory_reserved()
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction((peak + 0.75 * (reserved - peak)) / total)
        torch.cuda.empty_cache()
        print("fraction plant:", peak / 2**20, reserved / 2**20, file=sys.stderr)
    return loss, items
YOLO9Loss.__call__ = planted
from libreyolo.profile_run import run_once
print(run_once("yolo9-t", "shapes", {"batch": 8, "nbs": 8, "imgsz": 640, "amp": True, "amp_dtype": "float16",
                                     "workers": 8, "cache": "ram", "cuda_graph": kind == "graph",
                                     "project": sys.argv[2], "name": kind}))
"""


def _profile_run(kind: str, project: Path) -> Path:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run([sys.executable, "-c", DRIVER, kind, str(project)], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return Path(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def eager(tmp_path_factory):
    run = _profile_run("eager", tmp_path_factory.mktemp("gpu_profile"))
    return run, json.loads((run / "profile.json").read_text()), json.loads((run / "profile_trace.json").read_text())


def _step_spans(trace):
    steps = sorted((e for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")),
                   key=lambda e: e["ts"])
    return steps, [(e["ts"], e["ts"] + e["dur"]) for e in steps]


def test_eager_float16_verdict_and_figures(eager):
    run, p, trace = eager
    h, u = p["headline"], p["utilisation"]
    print(json.dumps(h, indent=1), json.dumps(p["verdict"], indent=1))  # the figures, for the results log
    assert h["verdict"] in VERDICTS and p["verdict"]["reason"] and p["verdict"]["lever"]
    assert h["precision"] == "float16 autocast, scaler on" and p["run"]["device_name"].startswith("NVIDIA")
    assert 0 < h["utilisation"] <= 1.05 and 0 < h["kernel_busy_ms"] <= h["step_ms_mean"] * 1.05
    assert u["kernels_per_step"] > 100 and u["kernel_median_us"] > 0
    assert h["peak_memory_mb"] > 0 and p["memory"]["peak_reserved_mb"] >= p["memory"]["peak_allocated_mb"]
    assert h["syncs_per_step"] < 1  # the step is sync-free: only the loop's loss read-back per log_interval
    assert p["kernels"]["kind"] == "kernel" and p["kernels"]["rows"][0]["count"] > 0
    phases = {r["phase"]: r for r in p["phases"]}
    for name in ("forward", "backward"):
        assert phases[name]["gpu_ms"] > 0 and 0 < phases[name]["busy_ms"] <= phases[name]["gpu_ms"] * 1.05
    # Per step, busy may exceed the step's own CPU time when the CPU runs ahead; the window's
    # boundaries are synchronised, so its utilisation cannot (checked above).
    assert all(s["busy_ms"] > 0 and s["kernels"] > 100 for s in p["steps"] if s["half"] == 1)
    # Alignment: the launches our step spans claim are the launches the trace recorded in them.
    steps, spans = _step_spans(trace)
    assert [e["name"] for e in steps] == [f"ProfilerStep#{s['iteration']}" for s in p["steps"] if s["half"] > 0]
    launches = sorted(e["ts"] for e in trace["traceEvents"] if e.get("name") == "cudaLaunchKernel"
                      and spans[0][0] <= e["ts"] < spans[-1][1])
    inside = sum(A.in_spans(launches, spans))
    assert inside >= 0.98 * len(launches), (inside, len(launches))


def test_planted_item_raises_the_sync_count(eager, tmp_path):
    _, base, _ = eager
    planted = json.loads((_profile_run("item", tmp_path) / "profile.json").read_text())
    assert planted["headline"]["syncs_per_step"] >= base["headline"]["syncs_per_step"] + 0.99
    assert planted["headline"]["verdict"] in VERDICTS


def test_utilisation_matches_hta_busy_time(eager, tmp_path, monkeypatch):
    monkeypatch.setenv("HTA_DISABLE_NS_ROUNDING", "1")
    pytest.importorskip("hta")
    from hta.trace_analysis import TraceAnalysis

    run, p, trace = eager
    (tmp_path / "hta").mkdir()
    shutil.copy(run / "profile_trace.json", tmp_path / "hta" / "rank0.json")
    breakdown = TraceAnalysis(trace_dir=str(tmp_path / "hta")).get_temporal_breakdown(visualize=False)
    # HTA 0.5 reports microseconds, earlier releases nanoseconds: take whichever this one has.
    unit, scale = next((u, s) for u, s in (("us", 1.0), ("ns", 1e-3)) if f"kernel_time({u})" in breakdown)
    hta_busy_us = float((breakdown[f"kernel_time({unit})"] - breakdown[f"idle_time({unit})"]).iloc[0]) * scale
    # HTA drops the last profiler step; compare busy microseconds over the steps it keeps, as
    # utilisation points of our step time (its percentages divide by its GPU-active span instead).
    _, spans = _step_spans(trace)
    kept = spans[:-1]
    ours_us = A.union_length((e["ts"], e["end"]) for g in A.launched_in(A.busy_events(trace, 0), kept) for e in g)
    wall_us = sum(hi - lo for lo, hi in kept)
    assert abs(hta_busy_us - ours_us) / wall_us <= 0.02, (hta_busy_us, ours_us, wall_us)



@pytest.fixture(scope="module")
def graphed(tmp_path_factory):
    run = _profile_run("graph", tmp_path_factory.mktemp("gpu_profile_graph"))
    return run, json.loads((run / "profile.json").read_text())


@pytest.fixture(scope="module")
def bench():
    """`bench step` of the same step: YOLOv9-t batch 8 at 640, float16, per arm (eager or graphed),
    three processes: the record is the median run's. Each arm is benched when a test asks for it."""
    from libreyolo.bench import bench_step

    records = {}

    def run(arm):
        if arm not in records:
            records[arm] = bench_step({"model": "yolo9-t", "batch": 8, "imgsz": 640}, [arm], repeat=3)[0]
        return records[arm]
    return run


@pytest.mark.parametrize("arm", ["float16", "float16+graph"])
def test_profile_and_bench_agree_on_utilisation(arm, request, bench, tmp_path):
    """Issue 17's first item: the window's step time comes from unrecorded steps, so `profile run`
    and `bench step` measure the same utilisation (within 3 points), eager and graphed. The
    recorded steps' own figure and the overhead are printed: the bias the timed steps remove.

    An eager step follows the host, whose speed differs between processes on the H200 machine
    (one call: profile 82.5 ms, bench 99.0 ms for the same step, 4 points apart), so the eager
    arm compares medians of three processes a side; graphed steps repeat within a few per cent.
    The graphed arm once missed by 3.3 points (0.843 against 0.876) while the loss read-back still
    synchronised: the read's step and the next took 27.5 and 25.2 ms against 19.9 (engine/meter.py)."""
    if arm == "float16":  # each arm builds only its own fixture, so one arm can run alone (-k)
        more = [_profile_run("eager", tmp_path / str(i)) / "profile.json" for i in range(2)]
        runs = [request.getfixturevalue("eager")[1]] + [json.loads(f.read_text()) for f in more]
        p = sorted(runs, key=lambda r: r["headline"]["utilisation"])[1]
    else:
        runs = [p := request.getfixturevalue("graphed")[1]]
    h, u, b = p["headline"], p["utilisation"], bench(arm)
    print(json.dumps({"arm": arm, "profile_utilisation": h["utilisation"], "bench_utilisation": b["utilisation"],
                      "profile_runs_utilisation": [r["headline"]["utilisation"] for r in runs],
                      "profile_step_ms": h["step_ms_mean"], "profile_step_ms_stats": u["step_ms"],
                      "bench_step_ms_median": b["step_ms_median"], "bench_runs_ms": b.get("runs_ms"),
                      "profile_busy_ms": h["kernel_busy_ms"], "bench_busy_ms": b["kernel_busy_ms"],
                      "recorded_step_ms": u["step_ms_recorded"]["mean"],
                      "utilisation_recorded": u["utilisation_recorded"],
                      "overhead_frac": h["overhead_frac"], "verdict": h["verdict"]}))
    assert u["basis"] == "kernel busy (recorded steps) / step time (unrecorded steps)" and u["timed_steps"] >= 5
    assert abs(h["utilisation"] - b["utilisation"]) <= 0.03, (arm, h["utilisation"], b["utilisation"])
    if arm == "float16+graph":
        # Kernel time measured under the profiler still fits in the unprofiled step: its durations
        # are not inflated (a graphed step is 0.8-0.9 busy, the check with the least room).
        assert h["utilisation"] <= 1.02
        assert p["overhead"]["graphed"] is True and p["capture"]["region"] == "network"


def test_eager_window_records_the_region_and_the_host_ops(eager):
    """What `profile what-if` and `profile ops` read, from the eager window."""
    from libreyolo.profiler.whatif import what_if

    _, p, _ = eager
    cap, ops = p["capture"], p["host_ops"]
    print(json.dumps({"capture": cap, "host_ops_top": ops["rows"][:5], "self_ms_per_step": ops["self_ms_per_step"]}))
    assert 0 < cap["forward_host_ms"] < p["utilisation"]["host_phases_ms"]["forward"] * 1.01
    assert 0 < cap["backward_host_ms"] < p["utilisation"]["host_phases_ms"]["backward"] * 1.01
    assert 0 < cap["busy_ms"] <= p["headline"]["kernel_busy_ms"] * 1.01 and cap["kernels_per_step"] > 100
    assert ops["steps"] == 2 and "op steps" in ops["source"] and ops["rows"][0]["calls_per_step"] > 0
    assert ops["self_ms_per_step"] <= p["headline"]["step_ms_mean"] * 3  # CPU-op recording at most ~doubles it
    prediction = {x["lever"]: x for x in what_if(p)["predictions"]}["cuda_graph=true"]
    print(json.dumps(prediction))
    assert prediction["applies"] and prediction["step_ms"] < p["headline"]["step_ms_mean"]


@pytest.mark.parametrize("kind", ["empty_cache", "fraction"])
def test_planted_allocator_pressure_is_memory_bound(kind, tmp_path):
    """A planted case per signal: torch.cuda.empty_cache() in every step (cudaMalloc/cudaFree per
    step), and a per-process memory limit the batch just fits under (the allocator retries)."""
    p = json.loads((_profile_run(kind, tmp_path) / "profile.json").read_text())
    a = p["memory"]["allocator"]
    print(json.dumps({"kind": kind, "allocator": a, "verdict": p["verdict"]}))
    assert p["headline"]["verdict"] == "memory-bound", p["verdict"]
    if kind == "empty_cache":
        assert a["calls_per_step"] >= A.ALLOC_CALLS_PER_STEP and "no torch.cuda.empty_cache()" in p["verdict"]["lever"]
    else:
        assert a["retries"] >= A.ALLOC_RETRIES and a["memory_fraction"] < 1.0
        assert p["verdict"]["reason"].startswith("the caching allocator retried")
