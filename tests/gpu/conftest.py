"""The GPU suite in lanes: `make test-gpu LANE=<name>` (or `pytest -m gpu tests/gpu --lane <name>`)
runs one lane's files, and each lane fits one device call of under 9 minutes on an H200. Every
file of tests/gpu is in exactly one lane (tests/unit/test_gpu_lanes.py holds the table to that);
`make test-gpu` without LANE runs all five, one after the other.

The sizes, from the H200 logs in benchmarks/results/h200/ (gpu_tests_*.txt). Those logs hold
totals, not per-test durations, so the sizes are estimates; a lane now prints its slowest tests
(`--durations`), and its log is what the next rebalancing reads.
- profiler (about 6.5 min): seven `profile run` processes (the eager and graphed windows, two
  more eager ones for the agreement test's median, three planted faults) and six `bench step`
  processes (two arms, three repeats); the agreement test and its fixtures alone took 258 s
  (gpu_tests_profile_bench_agreement_2026-12-02.txt). It runs alone: its figures are timings,
  which another lane's processes on the same host would move.
- whole (about 6 min): the 13 whole-step tests took 96 s on an H100
  (h100/fullstep/gpu_tests_fullstep_2026-12-06.txt), and the compile test adds a first inductor
  compile of about 245 s; in the train lane they would have pushed it past one call.
- train, models, predict (about 3-4 min each): a run of the whole suite in one 6.5-minute call
  got through 119 of its 142 tests, every test of the train, models and predict files but the
  step, segmentation and RTMDet ones and one of profile infer's two. Those took about 1.5 min
  more: gpu_tests_full.txt ran the graph, step, family, RTMDet and three profiler tests in 217 s,
  gpu_tests_dense.txt the segmentation, LingBot and FOMO files in 102 s.
"""

from __future__ import annotations

from pathlib import Path

import pytest

LANES = {
    # CUDA graphs against eager, the step's host syncs and scaler, every family's step and predict
    "train": ("test_graphs_gpu.py", "test_step_gpu.py", "test_families_gpu.py",
              "test_rtmdet_gpu.py", "test_elastic_gpu.py"),  # the last skips on a machine with one GPU
    # cuda_graph=full against eager for every family it captures, and compile=true inside the graphs
    # (its first inductor compile of YOLOv9-t took about 245 s on an H100)
    "whole": ("test_fullstep_gpu.py",),
    # the classifiers, the DETRs, the segmenters and the point detector, each through its own file
    "models": ("test_classifiers_gpu.py", "test_detr_gpu.py", "test_lingbot_gpu.py", "test_points_gpu.py",
               "test_segment_gpu.py"),
    # predict on CUDA (graphs, half weights, every family against CPU) and `profile infer`
    "predict": ("test_predict_gpu.py", "test_profile_infer_gpu.py"),
    # `profile run` and `bench step` on the GPU: verdicts, planted faults, their agreement
    "profiler": ("test_profiler_gpu.py",),
}


def pytest_addoption(parser):
    parser.addoption("--lane", choices=sorted(LANES), default=None,
                     help="run one lane of the GPU suite (tests/gpu/conftest.py LANES): " + ", ".join(LANES))


def pytest_ignore_collect(collection_path: Path, config):
    """Under --lane, the GPU test files of other lanes are not collected (nor imported)."""
    lane = config.getoption("--lane", default=None)
    here = Path(__file__).parent
    if lane is None or collection_path.parent != here or not collection_path.name.startswith("test_"):
        return None
    return collection_path.name not in LANES[lane]


@pytest.fixture
def deterministic_cudnn():
    """Deterministic cuDNN algorithms and no autotuning for one test, restored afterwards: the
    tests that hold a graphed run to an eager one step by step need both sides to pick the same
    kernels."""
    import torch

    saved = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    yield
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved
