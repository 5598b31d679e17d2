"""`profile infer` on a real GPU: YOLOv9-t at 640 px, batch 1, float16, eager and graphed.

Batch 1 eager inference launches every kernel of the network one by one for one small image:
the GPU waits on the launches, so the window must read launch-bound. With cuda_graph=true the
forward is one graph replay, and what is left (decode, letterbox, NMS) is not launching. Every
profiled run is its own process (`python -c DRIVER`): one profiler recording per process, as
`libreyolo profile infer --repeat` does.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

SRC = Path(__file__).resolve().parents[2] / "src"
DRIVER = r"""
import json, sys
from libreyolo.profiler.infer import run_once
print(run_once("yolo9-t", {"batch": 1, "imgsz": 640, "amp": True, "amp_dtype": "float16", "profile_skip": 5,
                           "profile_steps": 20, "project": sys.argv[2], "name": sys.argv[1],
                           **json.loads(sys.argv[3])}))
"""


def _profile_infer(name: str, project: Path, **overrides) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run([sys.executable, "-c", DRIVER, name, str(project), json.dumps(overrides)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = Path(proc.stdout.strip().splitlines()[-1])
    return json.loads((run / "profile.json").read_text())


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return tmp_path_factory.mktemp("gpu_profile_infer")


def _phases(p: dict) -> dict:
    return {r["phase"]: r for r in p["phases"]}


def test_eager_batch_1_is_launch_bound(project):
    p = _profile_infer("eager", project)
    print(json.dumps(p["headline"], indent=1), json.dumps(p["verdict"], indent=1))  # for the results log
    assert p["run"]["mode"] == "infer" and p["run"]["device_name"].startswith("NVIDIA")
    assert p["headline"]["precision"] == "float16 weights" and p["run"]["cuda_graph"]["enabled"] is False
    assert p["verdict"]["name"] == "launch-bound", p["verdict"]
    assert p["verdict"]["lever"].startswith("cuda_graph=true (inference capture")
    assert p["kernels"]["kind"] == "kernel" and p["utilisation"]["kernels_per_step"] > 100
    phases = _phases(p)
    assert [r["phase"] for r in p["phases"]] == ["data", "h2d", "forward", "postprocess", "other"]
    for name in ("forward", "postprocess"):
        assert phases[name]["gpu_ms"] > 0 and phases[name]["busy_ms"] > 0, phases[name]
    # NMS and the copy of the detections sync by design; the step's own phases do not.
    u = p["utilisation"]
    assert u["postprocess_syncs_per_step"] >= 1 and u["syncs_per_step"] - u["postprocess_syncs_per_step"] < 1


def test_graphed_is_not_launch_bound(project):
    p = _profile_infer("graphed", project, cuda_graph=True)
    print(json.dumps(p["headline"], indent=1), json.dumps(p["verdict"], indent=1))
    assert p["run"]["cuda_graph"]["enabled"] is True and p["headline"]["cuda_graph"] is True
    assert p["overhead"]["graphed"] is True  # the window's steps replayed the graph
    assert p["run"]["cuda_graph"]["replayed_steps"] >= 5 + 20  # every step replays: the first captured
    assert p["verdict"]["name"] != "launch-bound", p["verdict"]
    assert isinstance(p["overhead"]["fraction"], float)  # the replayed timed steps are the reference
    phases = _phases(p)
    assert phases["forward"]["gpu_ms"] > 0 and phases["postprocess"]["synced_ms"] > 0
