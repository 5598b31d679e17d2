"""The profiler hook's CUDA path on a CPU machine: torch.cuda's clocks, counters and the profiler
replaced by fakes that write what a step does into a Kineto-like trace. It checks the window's
layout end to end (timed steps timed by events, recorded steps, op steps in their own recording),
the allocator figures (a graph capture's allocations left out) and the memory-bound verdict; the
figures themselves are the real GPU tests' (tests/gpu/test_profiler_gpu.py)."""

import itertools
import json
import logging
import threading
import time
import types

import pytest
import torch

from libreyolo import markers
from libreyolo.families.base import CapturePlan
from libreyolo.profiler.artifacts import load_profile
from libreyolo.profiler.window import OPS_STEPS, ProfilerHook

STEP_S = 0.004  # host time of one fake step


class FakeEvent:
    def __init__(self, enable_timing=True):
        self.t = None

    def record(self):
        self.t = time.perf_counter()

    def elapsed_time(self, other):
        return (other.t - self.t) * 1e3


class FakeProfile:
    """torch.profiler.profile: collects the events the fake step writes while it is active."""

    active = None

    def __init__(self, activities):
        self.cpu_only = activities == [torch.profiler.ProfilerActivity.CPU]
        self.events = []

    def start(self):
        FakeProfile.active = self

    def stop(self):
        FakeProfile.active = None

    def export_chrome_trace(self, path):
        with open(path, "w") as f:
            json.dump({"traceEvents": self.events, "baseTimeNanoseconds": 0}, f)


class FakeAllocator:
    def __init__(self):
        self.stats = {"num_alloc_retries": 0, "num_ooms": 0, "num_device_alloc": 0, "num_device_free": 0}

    def memory_stats(self, device=None):
        return dict(self.stats)


def _now_us():
    return time.time_ns() / 1e3  # the fake trace's clock: baseTimeNanoseconds 0


class FakeLoop:
    """Trainer-shaped: the events and attributes the hook reads. Each step: a data phase, a forward
    through the step's capturable (a real autograd graph, so the region's gradient hook fires; it
    launches one kernel), a backward; `allocs` device allocations (and frees) per step, and a capture at
    each step of `capture_at` with 50 more (graphs are on when it names any)."""

    def __init__(self, hook, run_dir, allocator, allocs=1, capture_at=()):
        self.hooks, self.run_dir, self.allocator = [hook], run_dir, allocator
        self.allocs, self.capture_at = allocs, capture_at
        self.device = torch.device("cuda", 0)
        self.cfg = types.SimpleNamespace(model="yolo9-t", batch=8, imgsz=640, workers=4, cache=False, channels_last=True)
        self.family = types.SimpleNamespace(name="yolo9", capture=CapturePlan("network", note="the whole network"))
        self.size, self.arch, self.data_cfg = "t", "yolo9-t", types.SimpleNamespace(name="shapes")
        self.precision = types.SimpleNamespace(describe=lambda: "float32")
        self.graphs = types.SimpleNamespace(enabled=bool(capture_at), captures=0, replayed_steps=0,
                                            stats=lambda: {"enabled": self.graphs.enabled, "replayed_steps": 0})
        self.weight = torch.ones(4, requires_grad=True)
        self.model = types.SimpleNamespace(host_syncs=0)
        # A step context as the builder makes it on CUDA: a fused optimizer step, no whole-step graphs.
        self.ctx = types.SimpleNamespace(capturable=self.network, model=self.model, device=self.device, whole=None,
                                         optimizer=types.SimpleNamespace(param_groups=[{"fused": True}]))
        self.steps_per_epoch, self.epoch, self.stop = 100, 0, False
        self.corr = itertools.count(1)

    def remove_hook(self, hook):
        self.hooks.remove(hook)

    def network(self, x):
        """The captured region: one kernel launched."""
        c = next(self.corr)
        self.emit("cuda_runtime", "cudaLaunchKernel", 3.0, correlation=c)
        self.emit("kernel", "fake_kernel", 1000.0, device=0, stream=7, correlation=c)
        return (x * self.weight,)

    def emit(self, cat, name, dur, **args):
        prof = FakeProfile.active
        if prof is not None and (cat == "cpu_op") == prof.cpu_only:
            prof.events.append({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": threading.get_native_id(),
                                "ts": _now_us(), "dur": dur, "args": args})

    def step(self, i):
        self.iteration = self.batch_index = i
        with markers.phase("data"):
            time.sleep(STEP_S / 4)
        for hook in list(self.hooks):
            hook.before_step(self)
        with markers.phase("forward"):
            self.emit("cpu_op", "aten::mul", 50.0)
            out = self.ctx.capturable(torch.ones(4))
            for _ in range(self.allocs):
                self.emit("cuda_runtime", "cudaMalloc", 20.0, correlation=next(self.corr))
            self.allocator.stats["num_device_alloc"] += self.allocs
            self.allocator.stats["num_device_free"] += self.allocs
            if i in self.capture_at:  # a graph's pool, then the capture itself replays
                self.allocator.stats["num_device_alloc"] += 50
                self.graphs.captures += 1
            if self.graphs.captures:
                self.graphs.replayed_steps += 1
            time.sleep(STEP_S / 2)
        with markers.phase("backward"):
            out[0].sum().backward()
            time.sleep(STEP_S / 4)
        for hook in list(self.hooks):
            hook.after_step(self)

    def run(self, steps):
        for hook in list(self.hooks):
            hook.before_train(self)
        for i in range(steps):
            self.step(i)
            if self.stop:
                break
        for event in ("after_epoch", "after_train"):  # as the Trainer ends its last epoch
            for hook in list(self.hooks):
                getattr(hook, event)(self)


@pytest.fixture
def fake_cuda(monkeypatch):
    allocator = FakeAllocator()
    for name, value in {"synchronize": lambda device=None: None, "Event": FakeEvent,
                        "memory_stats": allocator.memory_stats, "memory_reserved": lambda device=None: 900 * 2**20,
                        "get_device_properties": lambda device=None: types.SimpleNamespace(total_memory=1000 * 2**20),
                        "get_per_process_memory_fraction": lambda device=None: 1.0,
                        "get_device_name": lambda device=None: "Fake GPU",
                        "max_memory_allocated": lambda device=None: 800 * 2**20,
                        "max_memory_reserved": lambda device=None: 900 * 2**20}.items():
        monkeypatch.setattr(torch.cuda, name, value)
    monkeypatch.setattr(torch.profiler, "profile", FakeProfile)
    monkeypatch.setenv("LIBREYOLO_DEBUG", "1")  # a failure inside the hook raises here instead of warning
    yield allocator
    markers.set_recorder(None)


def test_the_cuda_window_end_to_end(fake_cuda, tmp_path):
    hook = ProfilerHook(skip=1, steps=4, stop_after_window=True, print_report=False)
    loop = FakeLoop(hook, tmp_path, fake_cuda, allocs=1, capture_at=(1,))  # the first timed step captures
    loop.run(20)
    assert loop.stop and loop.iteration == 1 + 2 + 4 + OPS_STEPS - 1  # skipped, timed, recorded, op steps
    assert loop.ctx.capturable == loop.network  # the step's own capturable is back
    p = load_profile(tmp_path)
    assert p["window"] == {"skip": 1, "timed": 2, "steps": 4, "first_half": 2, "second_half": 2,
                           "ops_steps": OPS_STEPS, "first_iteration": 1, "last_iteration": 6}
    timed = [s for s in p["steps"] if s["half"] == 0]
    assert [s["excluded"] for s in timed] == [True, False]  # the capture step stays out of the step time
    assert p["headline"]["step_ms_mean"] == pytest.approx(timed[1]["wall_ms"])
    assert timed[1]["wall_ms"] >= STEP_S * 1e3  # start event to the end event
    # One 1 ms kernel per recorded step, attributed by its launch.
    assert p["headline"]["kernel_busy_ms"] == pytest.approx(1.0)
    assert p["utilisation"]["kernels_per_step"] == 1.0 and p["kernels"]["rows"][0]["name"] == "fake_kernel"
    assert p["capture"]["busy_ms"] == pytest.approx(1.0) and p["capture"]["backward_host_ms"] > 0
    # The allocator: 2 calls per counted step (the capture's 50 left out), 1 cudaMalloc per recorded step.
    a = p["memory"]["allocator"]
    assert (a["steps"], a["device_allocs"], a["device_frees"]) == (3, 3, 3)
    assert a["counter_calls_per_step"] == 2.0 and a["trace_calls_per_step"] == 1.0 and a["calls_per_step"] == 2.0
    assert a["trace_ms_per_step"] == pytest.approx(0.02) and a["reserved_mb"] == 900 and a["limit_mb"] == 1000
    assert p["verdict"]["name"] == "memory-bound"
    assert p["verdict"]["reason"].startswith("2.0 cudaMalloc/cudaFree calls per step")
    # The op steps' own recording: the host operators per step.
    ops = p["host_ops"]
    assert ops["steps"] == OPS_STEPS and ops["rows"][0]["name"] == "aten::mul"
    assert ops["rows"][0]["calls_per_step"] == 1.0 and "op steps after the window" in ops["source"]
    assert p["overhead"]["graphed"] is True and len(p["overhead"]["reference_ms"]) == 1


def test_a_calm_allocator_is_no_memory_verdict(fake_cuda, tmp_path):
    loop = FakeLoop(ProfilerHook(skip=1, steps=2, stop_after_window=True, print_report=False), tmp_path, fake_cuda,
                    allocs=0)
    loop.run(20)
    p = load_profile(tmp_path)
    assert p["memory"]["allocator"]["calls_per_step"] == 0 and p["verdict"]["name"] != "memory-bound"
    assert p["memory"]["allocator"]["steps"] == 2  # one timed, one recorded unsynchronised


def test_a_re_capture_drops_its_own_step_alone(fake_cuda, tmp_path):
    """A capture after the first (an invalidation's re-capture, a new multi_scale size) forgets that
    step's allocations only: the counted steps before it keep theirs."""
    loop = FakeLoop(ProfilerHook(skip=1, steps=4, stop_after_window=True, print_report=False), tmp_path, fake_cuda,
                    allocs=1, capture_at=(1, 4))  # the first timed step, then the second recorded one
    loop.run(20)
    p = load_profile(tmp_path)
    a = p["memory"]["allocator"]
    assert (a["steps"], a["device_allocs"], a["device_frees"]) == (2, 2, 2)  # steps 2 and 3
    assert a["counter_calls_per_step"] == 2.0 and p["verdict"]["name"] == "memory-bound"


@pytest.mark.parametrize("op_steps", [1, 0])
def test_training_that_ends_in_the_op_steps_still_writes_the_profile(fake_cuda, tmp_path, capsys, caplog, op_steps):
    """`train profile=true` does not budget for the op steps: the recorded window is whole, so the
    profile is written and the report printed, with the op steps that ran (or no host-op table)."""
    hook = ProfilerHook(skip=1, steps=2)
    loop = FakeLoop(hook, tmp_path, fake_cuda, allocs=0)
    with caplog.at_level(logging.INFO, logger="libreyolo"):
        loop.run(1 + 1 + 2 + op_steps)  # skipped, timed, recorded, then the run ends
    assert hook.state == "done" and loop.hooks == [] and markers._recorder is None
    p = load_profile(tmp_path)
    assert p["window"]["ops_steps"] == op_steps and p["window"]["last_iteration"] == 3
    assert (p["host_ops"] or {}).get("steps") == (op_steps or None)
    assert capsys.readouterr().err.startswith("profile\n")
    said = [r.message for r in caplog.records if r.message.startswith("profile: ")]
    assert said == [f"profile: training ended after {op_steps} of the {OPS_STEPS} op steps; the profile is written "
                    + ("with a host-op table over 1 step(s)" if op_steps else "without a host-op table")]
