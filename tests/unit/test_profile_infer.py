"""`profile infer` on CPU: the inference loop drives the profiler hook as the trainer does, and
the profile has the inference phases, verdicts and levers; training profiles read as before."""

import copy
import io
import json
import time

import pytest
from testkit import make_profile

from libreyolo import markers
from libreyolo.errors import ConfigError, DataError
from libreyolo.predict.options import KEYS
from libreyolo.profiler.analyze import analyse_window, verdict
from libreyolo.profiler.artifacts import FILES, load_profile, summary
from libreyolo.profiler.infer import InferenceLoop, image_files, run_once, settings
from libreyolo.profiler.report import print_report
from libreyolo.profiler.window import steps_needed
from libreyolo.tasks.detect import SPEC as DETECT

CPU_VERDICTS = {"compute-bound", "dataloader-bound"}
TINY = {"imgsz": 64, "device": "cpu"}


def _report(profile) -> str:
    out = io.StringIO()
    print_report(profile, file=out)
    return out.getvalue()


class _Events:
    """A hook that records the events it sees, with the loop's counters, and the phases run."""

    def __init__(self):
        self.seen = []

    def __getattr__(self, event):
        def record(loop):
            self.seen.append((event, loop.epoch, loop.batch_index, loop.iteration))
        return record

    def phase(self, name):
        self.seen.append(name)
        return markers._NULL


def test_the_loop_fires_the_trainers_events_in_order(tmp_path, one_thread):
    from libreyolo.model import resolve_model
    from libreyolo.predict.core import Predictor

    source = resolve_model("yolo9-t")
    cfg = settings("yolo9-t", {**TINY, "batch": 2, "workers": 0, "profile_skip": 1, "profile_steps": 4})
    predictor = Predictor(source, imgsz=64, batch=2, device="cpu", workers=0)
    files, images = image_files(None, predictor.task)
    assert len(files) == 32 and images == "shapes val (32 images)"
    events = _Events()
    loop = InferenceLoop(predictor, source, cfg, files[:3], images, tmp_path, [events])
    assert loop.steps_per_epoch == 2 and loop.graphs is None and loop.precision.describe() == "float32"
    markers.set_recorder(events)
    try:
        loop.run()
    finally:
        markers.set_recorder(None)
    step = ["data", ("before_step",), "h2d", "forward", "postprocess", ("after_step",)]
    expected, last = [("before_train", 0, 0, 0)], (0, 0)
    total = steps_needed(1, 4)  # as many steps as a window takes (no hook here stops the loop early)
    for it in range(total):  # 3 images at batch 2: two steps a pass, the images cycling
        epoch, index = divmod(it, 2)
        if index == 0:  # as in the trainer, the counters still hold the last step's
            expected.append(("before_epoch", epoch, *last))
        expected += [s if isinstance(s, str) else (*s, epoch, index, it) for s in step]
        if index == 1 or it == total - 1:
            expected.append(("after_epoch", epoch, index, it))
        last = (index, it)
    expected.append(("after_train", *divmod(total - 1, 2), total - 1))
    assert events.seen == expected


@pytest.fixture(scope="module")
def detector(tmp_path_factory):
    project = tmp_path_factory.mktemp("infer")
    run = run_once("yolo9-t", {**TINY, "project": str(project), "profile_skip": 3, "profile_steps": 4})
    return run, load_profile(run)


def test_a_detector_window_fills_and_writes_the_artifacts(detector):
    run, p = detector
    assert run.name == "infer" and all((run / f).is_file() for f in FILES) and (run / "args.yaml").is_file()
    assert markers._recorder is None
    assert p["run"]["mode"] == "infer" and p["run"]["arch"] == "yolo9-t" and p["run"]["data"] == "shapes val (32 images)"
    assert (p["run"]["batch"], p["run"]["imgsz"], p["run"]["workers"]) == (1, 64, KEYS["workers"].default)
    assert p["window"] == {"skip": 3, "timed": 2, "steps": 4, "first_half": 2, "second_half": 2, "ops_steps": 0,
                           "first_iteration": 3, "last_iteration": 8}
    assert p["capture"]["region"] == "forward" and p["capture"]["forward_host_ms"] > 0  # predict's graph region
    assert [r["phase"] for r in p["phases"]] == ["data", "h2d", "forward", "postprocess", "other"]
    phases = {r["phase"]: r for r in p["phases"]}
    assert phases["forward"]["synced_ms"] > 0 and phases["postprocess"]["synced_ms"] > 0
    assert phases["data"]["host_ms"] > 0  # decoding the JPEG, at least
    assert p["verdict"]["name"] in CPU_VERDICTS and p["headline"]["precision"] == "float32"
    assert "postprocess_syncs_per_step" in p["utilisation"] and p["run"]["cuda_graph"]["enabled"] is False
    assert isinstance(p["overhead"]["fraction"], float)
    assert summary(p)["mode"] == "infer"
    trace = json.loads((run / "profile_trace.json").read_text())
    steps = [e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")]
    assert steps == [f"ProfilerStep#{i}" for i in range(5, 9)]  # the recorded steps, after the 2 timed ones
    text = _report(p)
    assert text.startswith("profile (inference)\n") and "images shapes val (32 images)" in text
    assert f"verdict: {p['verdict']['name']}" in text and "postprocess" in text and "top 10 CPU ops" in text
    assert "inference: yolo9-t" in (run / "timeline.html").read_text()


def test_a_classifier_window(tmp_path, one_thread):
    run = run_once("resnet18", {**TINY, "project": str(tmp_path), "workers": 0, "profile_skip": 1, "profile_steps": 2})
    p = load_profile(run)
    assert p["run"]["data"] == "shapes-cls val (32 images)" and p["verdict"]["name"] in CPU_VERDICTS
    assert [r["phase"] for r in p["phases"]] == ["data", "h2d", "forward", "postprocess", "other"]
    assert "profile (inference)" in _report(p)


def test_a_slow_prepare_is_dataloader_bound(tmp_path, monkeypatch, one_thread):
    from libreyolo.predict import post

    prepare = post.prepare_detect

    def slow(image, imgsz):
        time.sleep(0.3)  # a slow letterbox: far above a 64 px forward, even on a loaded runner
        return prepare(image, imgsz)

    monkeypatch.setattr(post, "prepare_detect", slow)
    (tmp_path / "imgs").mkdir()
    files, _ = image_files(None, DETECT)
    (tmp_path / "imgs" / "a.jpg").write_bytes(files[0].read_bytes())
    run = run_once("yolo9-t", {**TINY, "source": str(tmp_path / "imgs"), "project": str(tmp_path), "workers": 0,
                               "profile_skip": 1, "profile_steps": 2})
    p = load_profile(run)
    assert p["run"]["data"] == f"{tmp_path / 'imgs'} (1 image)"
    assert p["verdict"]["name"] == "dataloader-bound" and p["headline"]["data_wait_frac"] > 0.5
    assert "prepared batch" in p["verdict"]["reason"] and "decode threads (workers=0 now" in p["verdict"]["lever"]


def test_settings_and_sources_are_checked(tmp_path):
    cfg = settings("yolo9-t", {})
    assert (cfg.batch, cfg.imgsz, cfg.workers, cfg.conf, cfg.profile_skip, cfg.profile_steps, cfg.name) == \
           (1, None, KEYS["workers"].default, 0.25, 5, 20, "infer")
    bad = {"epochs": "does not apply to profile infer", "conff": "did you mean 'conf'",
           "batch": "'batch': 0", "imgsz": "a multiple of 32", "workers": "'workers': -1"}
    values = {"epochs": 3, "conff": 0.3, "batch": 0, "imgsz": 70, "workers": -1}
    for key, message in bad.items():
        with pytest.raises(ConfigError, match=message):
            settings("yolo9-t", {key: values[key]})
    with pytest.raises(ConfigError, match="cuda_graph=true needs profile_skip >= 1"):
        settings("yolo9-t", {"cuda_graph": True, "profile_skip": 0})
    assert settings("yolo9-t", {"cuda_graph": True, "profile_skip": 1}).cuda_graph
    (tmp_path / "empty").mkdir()
    (tmp_path / "clip.mp4").write_bytes(b"")
    for source, message in ((tmp_path / "empty", "no images"), (tmp_path / "clip.mp4", "reads still images"),
                            (tmp_path / "gone", "does not exist"), (tmp_path / "*.png", "no images")):
        with pytest.raises(DataError, match=message):
            image_files(str(source), DETECT)


# --- the inference verdicts, on synthetic GPU windows ---------------------------------------------
def _window(post_syncs: int, kernels: int, gap_us: float = 40.0):
    """4 first-half inference steps of 10 ms: 50 us of data, `kernels` 10 us kernels launched every
    `gap_us` in the forward, then a 1 ms postprocess holding `post_syncs` host syncs."""
    steps, events, syncs = [], [], []
    for i in range(4):
        t0 = i * 10_000.0
        cut = [t0, t0 + 50, t0 + 100, t0 + 9_000, t0 + 10_000]
        phases = [{"name": n, "ts": a, "host_end": b, "end": b, "cpu_ms": (b - a) / 1e3}
                  for n, a, b in zip(markers.INFER_PHASES, cut, cut[1:])]
        steps.append({"half": 1, "ts": t0, "cpu_end": t0 + 10_000, "end": t0 + 10_000, "wall_ms": 10.0,
                      "data_ms": 0.05, "phases": phases})
        events += [{"ts": t0 + 100 + gap_us * j + 5, "end": t0 + 100 + gap_us * j + 15, "launch": t0 + 100 + gap_us * j,
                    "name": "k", "cat": "kernel", "stream": 7} for j in range(kernels)]
        syncs += [t0 + 9_100 + 100 * j for j in range(post_syncs)]
    return steps, events, syncs


def test_inference_verdicts_do_not_count_the_postprocess_syncs():
    steps, events, syncs = _window(post_syncs=3, kernels=220)
    train = analyse_window(copy.deepcopy(steps), events, syncs, True, 2, "float16 autocast")
    assert train["verdict"]["name"] == "host-bound"  # the training rule: 3 syncs per step
    infer = analyse_window(steps, events, syncs, True, 2, "float16 autocast", mode="infer")
    assert infer["syncs_per_step"] == 3 and infer["postprocess_syncs_per_step"] == 3
    assert infer["verdict"]["name"] == "launch-bound"
    assert infer["verdict"]["lever"].startswith("cuda_graph=true (inference capture")
    graphed = analyse_window(steps, events, syncs, True, 2, "float16 autocast", graphed=True, mode="infer")
    assert "the forward already replays as a CUDA graph" in graphed["verdict"]["reason"]
    assert "eager postprocess launches" in graphed["verdict"]["lever"]
    # A sync outside postprocess (an unpinned upload, say) is the step's own: host-bound.
    syncs_h2d = sorted(syncs + [i * 10_000.0 + 60 for i in range(4)])
    h2d = analyse_window(steps, events, syncs_h2d, True, 2, "float16 autocast", mode="infer")
    assert h2d["verdict"]["name"] == "host-bound" and "1.0 host syncs per step outside postprocess" in h2d["verdict"]["reason"]
    assert h2d["verdict"]["lever"].startswith("remove the host syncs outside postprocess")


def test_inference_levers():
    base = {"cuda": True, "utilisation": 0.9, "step_ms": 10.0, "data_ms": 0.1, "idle_data_ms": 0.1, "idle_short_ms": 0.5,
            "idle_long_ms": 0.4, "syncs_per_step": 2.0, "postprocess_syncs_per_step": 2.0, "kernels_per_step": 500,
            "kernel_median_us": 10.0, "host_phases": [("forward", 8.0)], "workers": 2, "precision": "float32",
            "mode": "infer"}
    assert verdict(base)["lever"].startswith("amp=true (float16, or amp_dtype=bfloat16)")
    assert verdict({**base, "precision": "float16 autocast"})["lever"].startswith("a smaller imgsz or model")
    data = verdict({**base, "utilisation": 0.3, "data_ms": 6.0, "idle_data_ms": 6.0})
    assert data["name"] == "dataloader-bound" and "workers=2 now" in data["lever"] and "decodes faster" in data["lever"]
    post = verdict({**base, "utilisation": 0.3, "idle_long_ms": 4.0})
    assert post["name"] == "host-bound" and post["lever"].startswith("a larger batch (postprocess")
    assert verdict({**base, "mode": "train"})["lever"].startswith("amp=True with amp_dtype=bfloat16")


def test_training_profiles_without_a_mode_read_as_before():
    old = make_profile()
    assert "mode" not in old["run"]
    text = _report(old)
    assert text.startswith("profile\n") and "inference" not in text and "images " not in text
    assert summary(old)["mode"] == "train"
    infer = copy.deepcopy(old)
    infer["run"].update(mode="infer", data="shapes val (32 images)")
    assert _report(infer).replace("profile (inference)", "profile", 1).replace(
        "  images shapes val (32 images)", "", 1) == text
