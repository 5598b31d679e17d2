"""`libreyolo profile compare` and `--fail-if` through the CLI on fixture profiles: exit codes 0/1/2,
one JSON object, one-line messages; in process except one real-process case (no torch import)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from testkit import make_profile, run_in_process

from libreyolo.profiler.artifacts import REPEAT_FILE, summary
from libreyolo.profiler.repeat import aggregate


def write(root: Path, name: str, edit=None, **headline) -> Path:
    """A run directory holding make_profile() with other headline figures (and `edit` applied)."""
    p = make_profile()
    p["headline"].update(headline)
    if edit:
        edit(p)
    (root / name).mkdir()
    (root / name / "profile.json").write_text(json.dumps(p))
    return root / name


@pytest.fixture
def pair(tmp_path):
    """A: launch-bound at 16 ms; B: compute-bound at 8 ms (the idle between kernels went)."""
    return (write(tmp_path, "a"),
            write(tmp_path, "b", step_ms_mean=8.0, utilisation=0.5, verdict="compute-bound"))


def test_compare_prints_the_tables_and_the_change(pair, capsys):
    a, b = pair
    code, out, err = run_in_process(["profile", "compare", str(a), str(b)], capsys)
    assert code == 0 and err == ""
    assert out.startswith("compare\nA: yolo9-t  batch 8") and f"({a})" in out and "setup: the same" in out
    assert "figures (per step" in out and "phases (synchronised" in out and "kernels in A's or B's top 10" in out
    assert out.strip().splitlines()[-1] == (
        "change: B is 2x faster (16.0 -> 8.0 ms per step): idle between kernels 11.8 -> 3.8 ms; kernel busy "
        "4.0 -> 4.0 ms (unchanged); data wait 0.20 -> 0.20 ms (unchanged); verdict launch-bound -> compute-bound")
    # profile.json named directly works as the directory does
    again = run_in_process(["profile", "compare", str(a / "profile.json"), str(b)], capsys)[1]
    assert again.replace(str(a / "profile.json"), str(a)) == out


def test_compare_json_is_one_object(pair, capsys):
    a, b = pair
    code, out, err = run_in_process(["profile", "compare", str(a), str(b), "--json", "--top", "1"], capsys)
    assert code == 0 and err == ""
    data = json.loads(out)  # the whole of stdout
    assert data["schema"] == "libreyolo-profile-compare" and data["a"]["path"] == str(a)
    assert data["figures"]["step_ms_mean"]["ratio"] == 0.5 and data["change"]["cause"] == "idle"
    assert {k: data["b"][k] for k in summary(make_profile())} == {**summary(make_profile()), "step_ms_mean": 8.0,
                                                                  "utilisation": 0.5, "verdict": "compute-bound"}
    assert len(data["kernels"]) == 1


def test_compare_gates(pair, capsys):
    a, b = pair
    base = ["profile", "compare", str(a), str(b)]
    code, out, err = run_in_process([*base, "--fail-if", "step_ms>1.05*A", "--fail-if", "verdict!=compute-bound"],
                                    capsys)
    assert code == 0 and "change: B is 2x faster" in out and err == ""
    code, out, err = run_in_process([*base, "--json", "--fail-if", "syncs>=1", "--fail-if", "step_ms>0.4*A"], capsys)
    assert code == 1 and json.loads(out)["change"]["direction"] == "faster"  # the output, then the gate
    assert err == "gate failed: step_ms>0.4*A (B's step_ms_mean is 8; A's is 16, so 0.4*A is 6.4)\n"
    code, _, err = run_in_process([*base, "--fail-if", "verdict!=A"], capsys)
    assert code == 1 and err == "gate failed: verdict!=A (B's verdict is compute-bound; A's is launch-bound)\n"


def test_malformed_gates_answer_before_any_file_is_read(tmp_path, capsys):
    missing = str(tmp_path / "nowhere")
    for argv, message in (
            (["compare", missing, missing, "--fail-if", "step_ms=>2"], "--fail-if 'step_ms=>2': unknown operator '=>'"),
            (["compare", missing, missing, "--fail-if", "speed<3"], "unknown field 'speed'"),
            (["compare", missing, missing, "--fail-if", "verdict==2*A"], "'2*A' multiplies a number"),
            (["summary", missing, "--fail-if", "step_ms>1.05*A"], "'A' is the first profile of 'profile compare"),
            (["summary", missing, "--fail-if", "utilisation<low"], "'low' is not a number")):
        code, out, err = run_in_process(["profile", *argv], capsys)
        assert code == 2 and out == "" and err.startswith("error: ") and message in err, err
        assert len(err.splitlines()) == 1


def test_compare_refusals_and_force(tmp_path, capsys):
    a = write(tmp_path, "a")
    infer = write(tmp_path, "infer", edit=lambda p: p["run"].update(mode="infer"))
    big = write(tmp_path, "big", edit=lambda p: p["run"].update(batch=16))
    for other, message in ((infer, "error: A profiles training and B inference: compare like with like"),
                           (big, "error: A and B differ in batch (8 vs 16): their per-step figures are not like for "
                                 "like; add --force to compare them anyway")):
        code, out, err = run_in_process(["profile", "compare", str(a), str(other)], capsys)
        assert code == 2 and out == "" and err.startswith(message) and len(err.splitlines()) == 1, err
    code, out, _ = run_in_process(["profile", "compare", str(a), str(big), "--force"], capsys)
    assert code == 0 and "note: batch (8 vs 16) differs: compared because of --force" in out
    assert "setup changed: batch 8 -> 16" in out
    assert json.loads(run_in_process(["profile", "compare", str(a), str(big), "--force", "--json"],
                                     capsys)[1])["notes"][0].startswith("batch (8 vs 16) differs")
    code, _, err = run_in_process(["profile", "compare", str(a), str(tmp_path / "nowhere")], capsys)
    assert code == 2 and "no profile at" in err


def test_summary_gates(tmp_path, capsys):
    run = write(tmp_path, "prof")
    code, out, err = run_in_process(["profile", "summary", str(run), "--fail-if", "syncs_per_step>=1",
                                     "--fail-if", "verdict==dataloader-bound"], capsys)
    assert code == 0 and "verdict: launch-bound" in out and err == ""
    code, out, err = run_in_process(["profile", "summary", str(run), "--json", "--fail-if", "utilisation<0.7"], capsys)
    assert code == 1 and json.loads(out)["utilisation"] == 0.25
    assert err == "gate failed: utilisation<0.7 (utilisation is 0.25)\n"
    code, out, err = run_in_process(["profile", "summary", str(run), "--fail-if", "verdict!=compute-bound"], capsys)
    assert code == 1 and "verdict: launch-bound" in out
    assert err == "gate failed: verdict!=compute-bound (verdict is launch-bound)\n"
    unmeasured = write(tmp_path, "skip1", overhead_frac=None)
    code, out, err = run_in_process(["profile", "summary", str(unmeasured), "--fail-if", "overhead_frac>0.1"], capsys)
    assert code == 2 and "verdict:" in out
    assert err.startswith("error: gate 'overhead_frac>0.1' cannot be checked: the profile's overhead_frac is null")


def test_repeat_aggregates_gate_on_means_and_do_not_compare(tmp_path, capsys):
    slow = {**summary(make_profile()), "step_ms_mean": 20.0}
    parent = tmp_path / "prof"
    parent.mkdir()
    rep = aggregate([summary(make_profile()), slow], [parent / "prof_1", parent / "prof_2"])
    (parent / REPEAT_FILE).write_text(json.dumps(rep))
    code, out, err = run_in_process(["profile", "summary", str(parent), "--fail-if", "step_ms>17"], capsys)
    assert code == 1 and "profile over 2 trials" in out
    assert err == "gate failed: step_ms>17 (step_ms_mean is 18, the mean of 2 trials)\n"
    code, _, err = run_in_process(["profile", "summary", str(parent / REPEAT_FILE), "--fail-if", "step_ms>18"], capsys)
    assert code == 0 and err == ""
    code, _, err = run_in_process(["profile", "summary", str(parent), "--fail-if", "precision==fp32"], capsys)
    assert code == 2 and "the --repeat aggregate has no precision" in err
    one = write(tmp_path, "one")
    code, out, err = run_in_process(["profile", "compare", str(parent), str(one)], capsys)
    assert code == 2 and out == ""
    assert err == (f"error: '{parent}' is the aggregate of a --repeat run: compare reads one profile per side; "
                   f"give one trial ({parent / 'prof_1'})\n")


def _traced(argv: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess, set[str]]:
    """The real command under `python -X importtime`: (its result, the modules it imported)."""
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)}
    traced = subprocess.run([sys.executable, "-X", "importtime", "-m", "libreyolo", *argv], capture_output=True,
                            text=True, env=env, cwd=cwd)
    imported = {line.rsplit("|", 1)[-1].strip() for line in traced.stderr.splitlines() if line.startswith("import time:")}
    assert not {m for m in imported if re.match(r"(torch|torchvision|numpy)(\.|$)", m)}
    assert not {m for m in imported if m.startswith(("libreyolo.families", "libreyolo.engine", "libreyolo.model"))}
    return traced, imported


def test_compare_and_gates_import_no_torch(cli, tmp_path):
    """The real command: compare and the gates read JSON only (no torch, numpy or model code)."""
    a, b = write(tmp_path, "a"), write(tmp_path, "b", step_ms_mean=16.5)
    traced, imported = _traced(["profile", "compare", str(a), str(b), "--fail-if", "step_ms>1.02*A"], tmp_path)
    assert traced.returncode == 1 and traced.stdout.strip().splitlines()[-1].startswith("change: B is unchanged")
    assert traced.stderr.splitlines()[-1] == (
        "gate failed: step_ms>1.02*A (B's step_ms_mean is 16.5; A's is 16, so 1.02*A is 16.32)")
    assert {"libreyolo.profiler.compare", "libreyolo.profiler.gates", "typer"} <= imported
    traced, imported = _traced(["profile", "summary", str(b), "--json", "--fail-if", "syncs>=1"], tmp_path)
    assert traced.returncode == 0 and json.loads(traced.stdout)["step_ms_mean"] == 16.5
    assert "libreyolo.profiler.gates" in imported
    real = cli("profile", "compare", str(a), str(b), "--json")  # the installed entry point too
    assert real.returncode == 0 and json.loads(real.stdout)["change"]["direction"] == "unchanged"
