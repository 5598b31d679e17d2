"""The profiler hook on real tiny CPU training runs, and its analysis on synthetic GPU windows."""

import io
import json
import logging
import time
import types

import pytest
from testkit import shapes_subset

from libreyolo import LibreYOLO, markers
from libreyolo.profiler import analyze as A
from libreyolo.profiler.analyze import analyse_window
from libreyolo.profiler.artifacts import FILES, load_profile
from libreyolo.profiler.report import print_report
from libreyolo.profiler.window import ProfilerHook, profiler_hooks

# optimizer=sgd: on a CPU, torch's AdamW (what optimizer=auto picks for short runs) reads its step
# count with .item() in every step, which the CPU analysis counts as a would-be host sync.
FAST = dict(imgsz=64, batch=4, device="cpu", workers=0, amp=False, val=False, no_aug_epochs=0, optimizer="sgd")


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    """8 train images: 2 steps per epoch at batch 4."""
    return shapes_subset(tmp_path_factory.mktemp("tiny"), 8)


@pytest.fixture(scope="module")
def profiled(tiny_data, tmp_path_factory, one_thread):
    """One profiled run: 4 epochs of 2 steps; the window (1 skipped, 2 timed, 2 + 2 recorded) crosses
    three epoch ends, one inside the timed steps."""
    project = tmp_path_factory.mktemp("profiled")
    return LibreYOLO("yolo9-t").train(data=tiny_data, project=str(project), epochs=4, profile=True,
                                      profile_skip=1, profile_steps=4, **{**FAST, "imgsz": 128})


def _nested(trace, tid):
    """True when every X slice on thread `tid` is strictly nested in the one enclosing it."""
    stack = []
    for ev in sorted((e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("tid") == tid),
                     key=lambda e: (e["ts"], -e["dur"])):
        start, end = ev["ts"], ev["ts"] + ev["dur"]
        while stack and stack[-1] <= start:
            stack.pop()
        if stack and end > stack[-1] + 1e-3:
            return False
        stack.append(end)
    return True


def test_profile_window_writes_artifacts_and_training_continues(profiled):
    run = profiled.run_dir
    assert all((run / f).is_file() for f in FILES)
    assert not list(run.glob(".*tmp")) and not list(run.glob(".profile_trace*"))
    assert profiled.epochs_run == 4  # the hook removed itself and training went on
    assert markers._recorder is None
    p = load_profile(run)
    assert p["window"] == {"skip": 1, "timed": 2, "steps": 4, "first_half": 2, "second_half": 2, "ops_steps": 0,
                           "first_iteration": 1, "last_iteration": 6}
    assert [(s["half"], s["iteration"], s["epoch"]) for s in p["steps"]] == [
        (0, 1, 0), (0, 2, 1), (1, 3, 1), (1, 4, 2), (2, 5, 2), (2, 6, 3)]
    h, u = p["headline"], p["utilisation"]
    assert h["verdict"] == p["verdict"]["name"] == "compute-bound"  # a plain CPU run computes
    assert 0 < h["data_wait_ms"] < h["step_ms_mean"] and 0.8 <= h["utilisation"] <= 1.0
    assert h["utilisation"] == pytest.approx(1 - h["data_wait_ms"] / h["step_ms_mean"])
    # The verdict's step and data wait are the unrecorded timed steps'; the overhead compares them
    # with the recorded unsynchronised ones.
    timed = [s for s in p["steps"] if s["half"] == 0]
    assert u["basis"] == "(step - data wait) / step time (unrecorded steps)" and u["timed_steps"] == 2
    assert h["step_ms_mean"] == pytest.approx(sum(s["wall_ms"] for s in timed) / 2)
    assert h["data_wait_ms"] == pytest.approx(sum(s["data_ms"] for s in timed) / 2)
    assert p["overhead"]["reference_ms"] == pytest.approx([s["wall_ms"] for s in timed])
    assert p["overhead"]["profiled_ms"] == pytest.approx([s["wall_ms"] for s in p["steps"] if s["half"] == 1])
    assert isinstance(p["overhead"]["fraction"], float)
    assert h["syncs_per_step"] == 0 and h["peak_memory_mb"] > 0 and h["precision"] == "float32"
    assert h["cuda_graph"] is False and p["run"]["cuda_graph"] == {"enabled": False, "replayed_steps": 0, "pool_mb": None}
    assert p["run"]["cache"] == "ram"  # cache=auto resolved: 8 images of at most 128 x 128 x 3 bytes fit
    # The captured region (YOLOv9: the network) timed around the step's capturable, inside its phases.
    cap = p["capture"]
    assert cap["region"] == "network" and cap["forward_host_ms"] > 0 and cap["backward_host_ms"] > 0
    for s in timed:
        assert 0 < s["region_ms"]["forward"] <= s["host_ms"]["forward"]
        assert 0 < s["region_ms"]["backward"] <= s["host_ms"]["backward"]
    assert cap["busy_ms"] is None and p["memory"]["allocator"] is None  # CPU: no kernels, no caching allocator
    ops = p["host_ops"]
    assert ops["steps"] == 2 and ops["rows"][0]["self_ms_per_step"] > 0 and "recorded unsynchronised" in ops["source"]
    assert any(r["name"].startswith("aten::") and "backward" in r["name"] for r in ops["rows"])  # autograd's ops count
    phases = {r["phase"]: r for r in p["phases"]}
    assert set(phases) == {*markers.PHASES, "other"}
    assert phases["forward"]["synced_ms"] > 0 and phases["backward"]["host_ms"] > 0
    assert sum(r["share"] for r in p["phases"]) == pytest.approx(1.0)
    assert p["kernels"]["kind"] == "cpu_op" and p["kernels"]["rows"][0]["total_ms"] > 0
    summary = json.loads((run / "profile_summary.json").read_text())
    assert {k: summary[k] for k in ("verdict", "utilisation", "step_ms_mean")} == \
           {k: h[k] for k in ("verdict", "utilisation", "step_ms_mean")}
    trace = json.loads((run / "profile_trace.json").read_text())
    steps = [e for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")]
    assert [e["name"] for e in steps] == [f"ProfilerStep#{i}" for i in range(3, 7)]  # the recorded steps
    assert trace["distributedInfo"]["rank"] == 0
    assert _nested(trace, steps[0]["tid"])  # our slices nest with the profiler's CPU ops
    html = (run / "timeline.html").read_text()
    assert "compute-bound" in html and "<script src=" not in html and "timed, unrecorded" in html
    text = io.StringIO()
    print_report(p, file=text)
    assert "window: 2 timed (unrecorded) + 2 recorded unsynchronised + 2 synchronised steps after 1 skipped" in \
        text.getvalue()


def test_profiling_does_not_change_training(profiled, tiny_data, tmp_path):
    import torch

    plain = LibreYOLO("yolo9-t").train(data=tiny_data, project=str(tmp_path), epochs=4, **{**FAST, "imgsz": 128})
    assert not (plain.run_dir / "profile.json").exists()
    a = torch.load(plain.run_dir / "weights" / "last.pt", weights_only=True)["model"]
    b = torch.load(profiled.run_dir / "weights" / "last.pt", weights_only=True)["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_window_steps_never_overlap_a_checkpoint_write(tiny_data, tmp_path, one_thread):
    """The checkpoint thread writes while later steps run, except inside the profiler's window:
    there each epoch's writes finish at the epoch end, so they cannot read as the steps' time."""
    from libreyolo.engine.hooks import Hook

    class Watch(Hook):
        def __init__(self):
            self.seen = []

        def before_step(self, trainer):
            profiler = next((h for h in trainer.hooks if isinstance(h, ProfilerHook)), None)
            self.seen.append((trainer.iteration, profiler.state if profiler else "gone",
                              bool(trainer.checkpoints._pending)))

    watch = Watch()
    hooks = [*profiler_hooks(types.SimpleNamespace(profile=True, profile_skip=1, profile_steps=4)), watch]
    LibreYOLO("yolo9-t").train(data=tiny_data, project=str(tmp_path), epochs=6, hooks=hooks,
                               **{**FAST, "imgsz": 128})
    window = [pending for it, state, pending in watch.seen if state in ("timed", "first", "second")]
    after = [pending for it, state, pending in watch.seen if state == "gone" and it % 2 == 0]  # epochs' first steps
    assert len(window) == 6 and not any(window)
    assert after and any(after)  # outside the window the writes still run beside the steps


def test_planted_faults_show_up(tmp_path, monkeypatch, one_thread):
    """A slow dataset makes the run dataloader-bound; an `.item()` in the loss is one sync per step."""
    from libreyolo.data.dataset import TrainDataset
    from libreyolo.families.yolo9.loss import YOLO9Loss

    get_item, loss_call = TrainDataset.__getitem__, YOLO9Loss.__call__

    def slow(self, key):
        # A slow disk or decoder: 1 s per batch against ~0.03 s of compute idle (0.5 s seen on a
        # 2-core machine running two suites), so the data wait stays well over half the step.
        time.sleep(0.5)
        return get_item(self, key)

    def with_sync(self, preds, targets):
        loss, items = loss_call(self, preds, targets)
        loss.detach().item()  # a host sync in the step, as a careless logging line would add
        return loss, items

    data = shapes_subset(tmp_path, 4)
    monkeypatch.setattr(TrainDataset, "__getitem__", slow)
    monkeypatch.setattr(YOLO9Loss, "__call__", with_sync)
    run = LibreYOLO("yolo9-t").train(data=data, project=str(tmp_path), epochs=2, profile=True,
                                     profile_skip=1, profile_steps=2, **{**FAST, "batch": 2}).run_dir
    p = load_profile(run)
    assert p["verdict"]["name"] == "dataloader-bound"
    assert "workers=0" in p["verdict"]["lever"] and p["headline"]["data_wait_frac"] > 0.5
    assert p["headline"]["syncs_per_step"] == 1.0
    assert len(p["overhead"]["reference_ms"]) == 1  # one timed step against one recorded: even at profile_skip=1


class _FakeTrainer(types.SimpleNamespace):
    def remove_hook(self, hook):
        self.hooks.remove(hook)


def _fake_trainer(hook):
    import torch

    return _FakeTrainer(hooks=[hook], device=torch.device("cpu"), iteration=0, epoch=0, batch_index=0,
                        steps_per_epoch=100, stop=False)


def test_no_hook_without_profile_and_none_under_distributed(monkeypatch, caplog):
    assert profiler_hooks(types.SimpleNamespace(profile=False, profile_skip=5, profile_steps=20)) == []
    [hook] = profiler_hooks(types.SimpleNamespace(profile=True, profile_skip=5, profile_steps=20))
    assert (hook.skip, hook.steps, hook.first) == (5, 20, 10)
    monkeypatch.setenv("WORLD_SIZE", "2")
    trainer = _fake_trainer(hook)
    with caplog.at_level(logging.INFO, logger="libreyolo"):
        hook.before_train(trainer)
    assert trainer.hooks == [] and hook.state == "skip"
    assert [r.message for r in caplog.records if "multi-GPU" in r.message] == [
        "profile=true: not available under multi-GPU training (2 processes); training without the profiler "
        "(profile a single-process run)"]


def test_training_that_ends_inside_the_window_warns_and_stops_the_profiler(caplog):
    hook = ProfilerHook(skip=1, steps=6)
    trainer = _fake_trainer(hook)
    hook.before_train(trainer)
    for i in range(3):
        assert (markers._recorder is None) == (i == 0)  # live once the skipped step is done
        trainer.iteration = trainer.batch_index = i
        with markers.phase("data"):
            pass
        hook.before_step(trainer)
        hook.after_step(trainer)
    with caplog.at_level(logging.WARNING, logger="libreyolo"):
        hook.after_train(trainer)
    assert markers._recorder is None
    assert [r.message for r in caplog.records] == [
        "profile: training ended 2 steps into the 9-step window (after 1 of 1 skipped steps); no profile written: "
        "train longer or lower profile_skip/profile_steps"]


# --- the GPU path of the analysis, on synthetic windows -----------------------------------------
def _window(kernels_per_step, wall_us=10_000.0, data_us=50.0, steps=4, syncs_per_step=0):
    """Synthetic first-half steps and busy events; kernels_per_step(t0) -> [(launch, start, dur)]."""
    out, events, syncs = [], [], []
    for i in range(steps):
        t0 = i * wall_us
        phases = [{"name": "data", "ts": t0, "host_end": t0 + data_us, "end": t0 + data_us, "cpu_ms": data_us / 1e3},
                  {"name": "loss", "ts": t0 + data_us, "host_end": t0 + wall_us, "end": t0 + wall_us,
                   "cpu_ms": (wall_us - data_us) / 1e3}]
        out.append({"half": 1, "ts": t0, "cpu_end": t0 + wall_us, "end": t0 + wall_us, "wall_ms": wall_us / 1e3,
                    "data_ms": data_us / 1e3, "phases": phases})
        for launch, start, dur in kernels_per_step(t0 + data_us):
            events.append({"ts": start, "end": start + dur, "launch": launch, "name": "k", "cat": "kernel", "stream": 7})
        syncs += [t0 + data_us + 100 * (j + 1) for j in range(syncs_per_step)]
    return out, sorted(events, key=lambda e: e["ts"]), syncs


def _verdict(kernels, **kw):
    steps, events, syncs = _window(kernels, **kw)
    return analyse_window(steps, events, syncs, True, 4, "float32")


def test_gpu_window_verdicts():
    # many 10 us kernels, one every 40 us: the GPU waits on launches
    launch = _verdict(lambda t: [(t + 40 * j, t + 40 * j + 5, 10) for j in range(240)])
    assert launch["verdict"]["name"] == "launch-bound" and launch["utilisation"] == pytest.approx(0.24, abs=0.01)
    assert launch["kernels_per_step"] == 240 and launch["kernel_median_us"] == 10
    # the same kernels back to back, then 7 ms of CPU work with nothing launched
    host = _verdict(lambda t: [(t + j, t + 10 * j, 10) for j in range(240)])
    assert host["verdict"]["name"] == "host-bound" and host["idle_long_gap_ms"] > host["idle_short_gap_ms"]
    synced = _verdict(lambda t: [(t + 40 * j, t + 40 * j + 5, 10) for j in range(240)], syncs_per_step=2)
    assert synced["verdict"]["name"] == "host-bound" and synced["syncs_per_step"] == 2
    # 6 ms of each 10 ms step waiting for data, the rest busy
    data = _verdict(lambda t: [(t + j, t + 40 * j, 40) for j in range(98)], data_us=6000)
    assert data["verdict"]["name"] == "dataloader-bound" and data["idle_data_ms"] == pytest.approx(6.0)
    # kernels launched ahead cover 95 % of the step
    busy = _verdict(lambda t: [(t + j, t + 100 * j, 100) for j in range(95)])
    assert busy["verdict"]["name"] == "compute-bound" and busy["utilisation"] == pytest.approx(0.95, abs=0.01)
    assert "amp=True" in busy["verdict"]["lever"]


def test_kernels_launched_late_in_a_step_count_for_that_step():
    # Each step launches 9 ms of kernels but the GPU runs them 5 ms late (the CPU ran ahead):
    # they still belong to the step that launched them, so utilisation stays 0.9.
    steps, events, syncs = _window(lambda t: [(t + j, t + 5000 + 100 * j, 100) for j in range(90)])
    figures = analyse_window(steps, events, syncs, True, 4, "float32")
    assert figures["utilisation"] == pytest.approx(0.9, abs=0.01)
    assert [s["kernels"] for s in steps] == [90] * 4 and A.stats(s["busy_ms"] for s in steps)["mean"] == pytest.approx(9.0)


def test_the_verdict_reads_the_timed_steps_time_and_the_recorded_steps_kernels():
    """Recorded steps 10 ms long (the profiler's host cost in them), 8 of it in 40 us gaps; the
    same steps unrecorded take 6 ms. Utilisation and the idle split use the unrecorded time."""
    steps, events, syncs = _window(lambda t: [(t + 40 * j, t + 40 * j + 5, 10) for j in range(200)])
    timed = [{"half": 0, "wall_ms": 6.0, "data_ms": 0.05, "host_step_ms": 6.0, "excluded": False,
              "phases": [{"name": "data", "cpu_ms": 0.05}, {"name": "loss", "cpu_ms": 5.9}]} for _ in range(3)]
    figures = analyse_window(timed + steps, events, syncs, True, 4, "float32")
    assert figures["busy_ms"] == pytest.approx(2.0) and figures["utilisation"] == pytest.approx(2.0 / 6.0)
    assert figures["step_ms"]["mean"] == 6.0 and figures["step_ms_recorded"]["mean"] == 10.0
    assert figures["utilisation_recorded"] == pytest.approx(0.2) and figures["timed_steps"] == 3
    assert figures["basis"] == "kernel busy (recorded steps) / step time (unrecorded steps)"
    assert figures["idle_short_gap_ms"] + figures["idle_long_gap_ms"] + figures["idle_data_ms"] == pytest.approx(4.0)
    assert figures["host_phases_ms"] == {"loss": pytest.approx(5.9)} and figures["host_step_ms"] == 6.0
    assert figures["verdict"]["name"] == "launch-bound" and "GPU busy 33%" in figures["verdict"]["reason"]
    # Timed steps of the other kind (excluded) leave the recorded steps' time, and the basis says so.
    for t in timed:
        t["excluded"] = True
    fallback = analyse_window(timed + steps, events, syncs, True, 4, "float32")
    assert fallback["utilisation"] == pytest.approx(0.2) and "no unrecorded step of the window's kind" in fallback["basis"]


def _steps(*rows):
    """Window step records as assemble.step_records leaves them: (half, wall ms, replayed, captured)."""
    return [{"half": h, "wall_ms": ms, "replayed": r, "captured": c} for h, ms, r, c in rows]


def test_overhead_compares_recorded_with_timed_steps_of_the_same_kind():
    from libreyolo.profiler.assemble import mark_kind, overhead

    # A graphed window: the first timed step captures (and replays), the rest replay.
    steps = _steps((0, 900.0, True, True), (0, 20.0, True, False), (0, 20.0, True, False),
                   (1, 22.0, True, False), (1, 22.0, True, False), (1, 23.0, True, False), (2, 30.0, True, False))
    mark_kind(steps)
    assert [s["excluded"] for s in steps] == [True] + [False] * 6
    o = overhead(steps)
    assert o["graphed"] is True and o["reference_ms"] == [20.0, 20.0] and o["profiled_ms"] == [22.0, 22.0, 23.0]
    assert o["fraction"] == pytest.approx(0.1)
    # Eager: every step is of the window's kind, the slow first one included (a median reads past it).
    steps = _steps((0, 900.0, False, False), (0, 20.0, False, False), (0, 20.0, False, False), (1, 22.0, False, False))
    mark_kind(steps)
    o = overhead(steps)
    assert o["graphed"] is False and o["reference_ms"] == [900.0, 20.0, 20.0] and o["fraction"] == pytest.approx(0.1)
    # Graphed recorded steps, but every timed step still eager (the capture came late): nothing to compare.
    steps = _steps((0, 40.0, False, False), (0, 900.0, True, True), (1, 22.0, True, False), (1, 22.0, True, False))
    mark_kind(steps)
    o = overhead(steps)
    assert o["fraction"] is None and o["reference_ms"] == [] and "raise profile_skip" in o["note"]


@pytest.mark.parametrize(("asked", "autotunes"), [({}, True), ({"cudnn_benchmark": "auto"}, True),
                                                  ({"cudnn_benchmark": False}, False),
                                                  ({"deterministic": True}, False)])
def test_profile_run_and_bench_step_autotune_alike(tiny_data, asked, autotunes):
    """A profile window times a long run's steady step, as `bench step` does: `auto` autotunes
    there (a profile run's own few steps would leave cuDNN untuned), an explicit false does not."""
    from libreyolo.config import build_config
    from libreyolo.engine.builder import steady_autotune
    from libreyolo.profile_run import plan

    user = plan(LibreYOLO("yolo9-t"), tiny_data, {**FAST, **asked})
    assert user["cudnn_benchmark"] is autotunes
    assert steady_autotune(build_config({"model": "yolo9-t", **FAST, **asked})) is autotunes


def test_a_whole_step_run_counts_its_replays_and_captures_and_says_whether_full_applies():
    """Under cuda_graph=full the network's manager is held (no replay, no capture of its own): the
    window reads the whole step's counts, so its steps are judged graphed and a capture step is
    left out. And the verdict learns whether switching cuda_graph=full on would capture the step:
    never for a run that has it on (whatever its window replayed), that fell back or was refused,
    a family that cannot, a CPU run or a torch without a fused step."""
    import torch
    from torch import nn

    from libreyolo.profiler import window as W
    from libreyolo.profiler.assemble import _whole

    held = types.SimpleNamespace(enabled=True, replayed_steps=0, captures=0)
    whole = types.SimpleNamespace(enabled=True, replayed_steps=5, captures=2, fallback_reason=None)
    family = types.SimpleNamespace(display="YOLOv9", capture=types.SimpleNamespace(region="network", whole=""))
    cfg = types.SimpleNamespace(cuda_graph="full")
    trainer = types.SimpleNamespace(graphs=held, ctx=types.SimpleNamespace(whole=whole), family=family, cfg=cfg)
    assert W._graph_counts(trainer) == (5, 2) and W._graphs_enabled(trainer)
    assert _whole(trainer, "train") == (True, "cuda_graph=full is on") and _whole(trainer, "infer") == (False, None)
    whole.replayed_steps = 0  # on, but nothing replayed yet: still not a lever to suggest
    assert _whole(trainer, "train") == (True, "cuda_graph=full is on")
    whole.enabled, whole.fallback_reason = False, "a host read at step.py:98"
    assert _whole(trainer, "train") == (False, "a host read at step.py:98")
    trainer.ctx.whole = None  # refused at the start (its line said why)
    assert "refused at the start" in _whole(trainer, "train")[1]

    ctx = types.SimpleNamespace(whole=None, model=nn.Linear(2, 2), device=torch.device("cuda"),
                                optimizer=types.SimpleNamespace(param_groups=[{"fused": True}]))
    network_only = types.SimpleNamespace(graphs=types.SimpleNamespace(enabled=True, replayed_steps=3, captures=1),
                                         ctx=ctx, family=family, cfg=types.SimpleNamespace(cuda_graph=True))
    assert W._graph_counts(network_only) == (3, 1) and W._graphs_enabled(network_only)
    assert _whole(network_only, "train") == (False, "")  # cuda_graph=full would capture it
    ctx.optimizer.param_groups = [{"foreach": True}]
    assert "fused optimizer" in _whole(network_only, "train")[1]
    ctx.optimizer.param_groups, ctx.device = [{"fused": True}], torch.device("cpu")
    assert "CUDA device" in _whole(network_only, "train")[1]
    ctx.device, family.capture.whole = torch.device("cuda"), "YOLOX's reason"
    assert "YOLOX's reason" in _whole(network_only, "train")[1]
    assert _whole(types.SimpleNamespace(ctx=ctx, family=None), "train") == (False, None)
