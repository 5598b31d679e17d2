"""The real `libreyolo profile` command: run a window on CPU, then read the results anywhere."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from testkit import run_in_process, shapes_subset

COMMON = ["device=cpu", "workers=0"]


def _ok(result):
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_profile_run_writes_four_files_and_a_copy_reads_back(cli, tmp_path):
    result = _ok(cli("profile", "run", "shapes", "--size", "t", "imgsz=128", "batch=4", *COMMON,
                     "profile_skip=3", "profile_steps=4"))
    run = tmp_path / "runs" / "profile" / "prof"
    for name in ("profile.json", "profile_summary.json", "profile_trace.json", "timeline.html"):
        assert (run / name).is_file(), name
    assert "verdict: compute-bound" in result.stdout and "lever:" in result.stdout
    assert "USDT" not in result.stdout + result.stderr  # torch's profiler_start/stop markers stay out
    assert result.stdout.strip().endswith(f"artifacts in {os.path.join('runs', 'profile', 'prof')}")
    args = (run / "args.yaml").read_text()
    assert "model: yolo9-t" in args and "no_aug_epochs: 0" in args and "profile: true" in args and "val: false" in args
    profile = json.loads((run / "profile.json").read_text())
    assert profile["run"]["arch"] == "yolo9-t" and profile["window"]["steps"] == 4

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(run / "profile.json", elsewhere / "profile.json")
    summary = json.loads(_ok(cli("profile", "summary", str(elsewhere), "--json")).stdout)
    assert summary == json.loads((run / "profile_summary.json").read_text())
    assert {k: summary[k] for k in profile["headline"]} == profile["headline"]
    phases = json.loads(_ok(cli("profile", "phases", str(elsewhere / "profile.json"), "--json")).stdout)
    assert phases == profile["phases"]
    kernels = json.loads(_ok(cli("profile", "kernels", str(elsewhere), "--top", "3", "--json")).stdout)
    assert kernels == profile["kernels"]["rows"][:3]
    text = _ok(cli("profile", "summary", str(elsewhere))).stdout
    assert "verdict: compute-bound" in text and "utilisation" in text
    # A copy says where it was read from; the recorded run_dir is relative to the run's directory.
    assert text.strip().endswith(f"read from {elsewhere}; the run wrote its artifacts in runs/profile/prof")
    assert "forward" in _ok(cli("profile", "phases", str(elsewhere))).stdout
    assert "top 3" in _ok(cli("profile", "kernels", str(elsewhere), "--top", "3")).stdout

    # The readers import no torch and no model code: instant, and fine on a machine without either.
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)}
    traced = subprocess.run([sys.executable, "-X", "importtime", "-m", "libreyolo", "profile", "summary",
                             str(elsewhere), "--json"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert traced.returncode == 0, traced.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in traced.stderr.splitlines() if line.startswith("import time:")}
    assert "libreyolo.profiler.artifacts" in imported and "typer" in imported
    assert not {m for m in imported if re.match(r"(torch|torchvision|numpy)(\.|$)", m)}
    assert not {m for m in imported if m.startswith(("libreyolo.families", "libreyolo.engine", "libreyolo.model"))}


def test_profile_repeat_trials_and_numbered_runs(cli, tmp_path, monkeypatch, capsys):
    data = shapes_subset(tmp_path, 8)
    (tmp_path / "runs" / "profile" / "prof").mkdir(parents=True)  # an earlier run: this one is prof2
    tiny = ["imgsz=64", "batch=4", *COMMON, "profile_skip=1", "profile_steps=2"]
    # The command's entry point in this process, each trial in its real process (the command itself
    # runs as a real process above).
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the trials' processes: one intra-op thread, as conftest's command_env
    code, stdout, err = run_in_process(["profile", "run", data, "--weights", "yolov9", "--size", "tiny", "--repeat",
                                        "2", *tiny, "--json"], capsys)
    assert code == 0, err[-3000:]
    out = json.loads(stdout)
    parent = tmp_path / "runs" / "profile" / "prof2"
    assert out["run_dir"] == str(parent.relative_to(tmp_path))
    assert [p.name for p in sorted(parent.iterdir())] == ["prof_1", "prof_2", "profile_repeat.json"]
    rep = json.loads((parent / "profile_repeat.json").read_text())
    assert rep == {k: v for k, v in out.items() if k != "run_dir"}
    assert rep["trials"] == 2 and len(rep["verdicts"]) == 2 and rep["arch"] == "yolo9-t"
    for key in ("step_ms_mean", "utilisation", "data_wait_ms", "syncs_per_step"):
        values = rep["figures"][key]["values"]
        assert len(values) == 2 and rep["figures"][key]["mean"] == pytest.approx(sum(values) / 2)
    # The overhead figure compares each trial's recorded step with its timed ones, even at profile_skip=1.
    assert all(isinstance(v, float) for v in rep["figures"]["overhead_frac"]["values"])
    for i in (1, 2):
        assert json.loads((parent / f"prof_{i}" / "profile_summary.json").read_text())["verdict"] == rep["verdicts"][i - 1]
    text = _ok(cli("profile", "summary", str(parent / "prof_1"))).stdout
    assert f"verdict: {rep['verdicts'][0]}" in text
    # The --repeat run's directory and its profile_repeat.json (where the run points the user).
    for path in (parent, parent / "profile_repeat.json"):
        assert json.loads(_ok(cli("profile", "summary", str(path), "--json")).stdout) == rep
        text = _ok(cli("profile", "summary", str(path))).stdout
        assert "profile over 2 trials" in text and f"verdict: {rep['verdict']} ({rep['verdict_count']} of 2" in text
    phases = cli("profile", "phases", str(parent))
    assert phases.returncode == 2 and "holds the trials of a --repeat run" in phases.stderr, phases.stderr


def test_bad_profiles_and_arguments_are_one_line_errors(cli, tmp_path, monkeypatch, capsys):
    cases = {"malformed.json": "{oops", "foreign.json": json.dumps({"traceEvents": []}),
             "newer.json": json.dumps({"schema": "libreyolo-profile", "schema_version": 99})}
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        result = cli("profile", "summary", str(tmp_path / name))
        assert result.returncode == 2 and result.stderr.startswith("error: "), result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert "schema version 99" in cli("profile", "kernels", str(tmp_path / "newer.json")).stderr
    expected = {("shapes", "epochs=3"): "'epochs' cannot be set for profile run",
                ("imgsz=64", "shapes"): "is a key=value, not a dataset",
                ("shapes", "--size", "xl"): "unknown size 'xl' for YOLOv9 (allowed: t, s, m, c)",
                ("shapes", "--weights", "yolo9-t", "--size", "s"): "--size s contradicts 'yolo9-t', which is yolo9-t"}
    # Through the command's entry point in this process: two of these resolve the model, which
    # imports torch (seconds a process); the readers' refusals above are real processes.
    monkeypatch.chdir(tmp_path)
    for args, message in expected.items():
        code, _, err = run_in_process(["profile", "run", *args], capsys)
        assert code == 2 and message in err, err
