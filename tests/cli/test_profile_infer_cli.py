"""The real `libreyolo profile infer` command on CPU: a window of inference steps, its report and
JSON, `profile summary` of its directory, and bad input as one line with exit code 2."""

import json
import os

import pytest
from testkit import run_in_process

TINY = ["--imgsz", "64", "device=cpu", "profile_skip=1", "profile_steps=4"]


def _ok(result):
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_profile_infer_reports_and_its_directory_reads_back(cli, tmp_path, monkeypatch, capsys):
    result = _ok(cli("profile", "infer", "yolo9-t", *TINY))
    run = tmp_path / "runs" / "profile" / "infer"
    for name in ("profile.json", "profile_summary.json", "profile_trace.json", "timeline.html", "args.yaml"):
        assert (run / name).is_file(), name
    out = result.stdout
    assert out.startswith("profile (inference)\n") and "yolo9-t  batch 1  imgsz 64" in out
    assert "verdict: compute-bound" in out or "verdict: dataloader-bound" in out
    assert "lever:" in out and "postprocess" in out and "top 10 CPU ops" in out
    assert out.strip().endswith(f"artifacts in {os.path.join('runs', 'profile', 'infer')}")
    profile = json.loads((run / "profile.json").read_text())
    assert profile["run"]["mode"] == "infer" and profile["window"]["steps"] == 4
    assert [r["phase"] for r in profile["phases"]] == ["data", "h2d", "forward", "postprocess", "other"]

    # The second run through the command's entry point in this process (no torch start-up again).
    monkeypatch.chdir(tmp_path)
    code, stdout, err = run_in_process(["profile", "infer", "yolo9-t", *TINY, "workers=0", "--batch", "2", "--json"],
                                       capsys)
    assert code == 0, err[-3000:]
    as_json = json.loads(stdout)
    assert as_json["run_dir"] == os.path.join("runs", "profile", "infer2")  # numbered like profile run
    assert (as_json["mode"], as_json["batch"], as_json["workers"], as_json["steps"]) == ("infer", 2, 0, 4)
    written = json.loads((tmp_path / "runs" / "profile" / "infer2" / "profile_summary.json").read_text())
    assert as_json == {"run_dir": as_json["run_dir"], **written}

    text = _ok(cli("profile", "summary", str(run))).stdout
    assert text.startswith("profile (inference)\n") and f"verdict: {profile['verdict']['name']}" in text
    assert text.strip().endswith(f"artifacts in {run}")


# The settings' other checks (cuda_graph with profile_skip < 1, sources) are unit tests:
# tests/unit/test_profile_infer.py.
@pytest.mark.parametrize("args, message", [
    (("yolo9-t", "epochs=3"), "key 'epochs' does not apply here"),
    (("yolo9-t", "conff=0.3"), "unknown key 'conff' (did you mean 'conf'?)"),
    (("yolo9-t", "batch=4"), "'batch' is not a key=value of profile infer: give it as --batch N"),
    (("yolo9-t", "--batch", "0"), "bad value for 'batch': 0 (allowed: an int >= 1)"),
    (("yolo9-t", "--imgsz", "100"), "bad value for 'imgsz': 100 (allowed: a multiple of 32)"),
    (("missing.pt",), "weights file 'missing.pt' does not exist"),
])
def test_bad_input_is_one_line(tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.chdir(tmp_path)  # in this process: the command's entry point, without its start-up
    code, _, err = run_in_process(["profile", "infer", *args], capsys)
    assert code == 2 and err.startswith("error: ") and message in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "runs").exists()
