"""`libreyolo profile what-if` and `profile ops` through the CLI on standalone copies of a recorded
profile.json: text, one JSON object, one-line errors (exit code 2), the help; in process except one
real process that checks neither imports torch."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from testkit import make_profile, run_in_process

from libreyolo.profiler.artifacts import SCHEMA_VERSION

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "profiler" / "cpu_yolo9t_b4_64.json"


@pytest.fixture
def copy(tmp_path):
    """The recorded CPU profile, copied away from its run directory."""
    shutil.copy(FIXTURE, tmp_path / "profile.json")
    return tmp_path


def test_what_if_prints_each_lever_and_its_assumption(copy, capsys):
    code, out, err = run_in_process(["profile", "what-if", str(copy)], capsys)
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].startswith("what-if (training): yolo9-t  batch 4  imgsz 64  on cpu  precision float32")
    assert "assumptions:" in lines and any(line.startswith("a dataloader that never waits ") for line in lines)
    assert "- cuda_graph=true: n/a: CUDA graphs need a CUDA device" in out
    data = json.loads(run_in_process(["profile", "what-if", str(copy / "profile.json"), "--json"], capsys)[1])
    assert data["schema"] == "libreyolo-profile-whatif" and data["schema_version"] == SCHEMA_VERSION
    assert [p["lever"] for p in data["predictions"]][0] == "cuda_graph=true"


def test_ops_prints_the_top_host_operators(copy, capsys):
    code, out, err = run_in_process(["profile", "ops", str(copy), "--top", "3"], capsys)
    assert code == 0 and err == ""
    assert out.startswith("host operators: ") and "top 3 host operators by self CPU time per step" in out
    table = json.loads(run_in_process(["profile", "ops", str(copy), "--top", "2", "--json"], capsys)[1])
    recorded = json.loads(FIXTURE.read_text())["host_ops"]
    assert table == {**recorded, "rows": recorded["rows"][:2]}
    assert table["rows"][0]["self_ms_per_step"] >= table["rows"][1]["self_ms_per_step"] > 0


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    old = make_profile()
    old["schema_version"] = 1
    (tmp_path / "old.json").write_text(json.dumps(old))
    (tmp_path / "broken.json").write_text("{\"schema\": ")
    no_ops = make_profile()
    no_ops["host_ops"] = None
    (tmp_path / "no_ops.json").write_text(json.dumps(no_ops))
    truncated = json.loads(FIXTURE.read_text())
    del truncated["host_ops"]["ops"]  # the operator count print_ops names
    (tmp_path / "truncated.json").write_text(json.dumps(truncated))
    cases = [(["what-if", str(tmp_path / "gone")], "no profile at"),
             (["ops", str(tmp_path / "gone")], "no profile at"),
             (["what-if", str(tmp_path / "broken.json")], "is not valid JSON"),
             (["what-if", str(tmp_path / "old.json")], "is profile schema version 1: profile what-if reads version 2"),
             (["ops", str(tmp_path / "old.json")], "is profile schema version 1: profile ops reads version 2"),
             (["ops", str(tmp_path / "no_ops.json")], "has no host-op table"),
             (["ops", str(tmp_path / "truncated.json")], "has no usable data for profile ops: host_ops.ops is missing"),
             (["what-if", str(tmp_path / "no_ops.json")], "has no usable data for profile what-if: utilisation.idle_data_ms is missing")]
    for argv, message in cases:
        code, out, err = run_in_process(["profile", *argv], capsys)
        assert code == 2 and out == "" and err.startswith("error: ") and message in err, (argv, err)
        assert len(err.splitlines()) == 1


def test_help_explains_every_subcommand(capsys):
    code, out, _ = run_in_process(["profile", "--help"], capsys)
    assert code == 0
    for name in ("run", "infer", "summary", "compare", "phases", "kernels", "ops", "what-if"):
        assert f" {name} " in out, name
    for argv, words in ((["what-if", "--help"], ("cuda_graph=true", "amp=true", "assumption")),
                        (["ops", "--help"], ("self time", "--top"))):
        code, out, _ = run_in_process(["profile", *argv], capsys)
        assert code == 0 and all(w in " ".join(out.split()) for w in words), out


@pytest.mark.parametrize(("command", "arguments"), [("run", "DATA"), ("infer", "MODEL"), ("summary", "PATH"),
                                                  ("compare", "A B"), ("phases", "PATH"), ("kernels", "PATH"),
                                                  ("what-if", "PROFILE"), ("ops", "PROFILE")])
def test_usage_names_the_arguments_plainly(command, arguments, capsys):
    code, out, _ = run_in_process(["profile", command, "--help"], capsys)
    assert code == 0 and out.splitlines()[0] == f"Usage: libreyolo profile {command} [OPTIONS] {arguments}"


def test_the_readers_import_no_torch(copy):
    """One real process runs both commands and lists what it imported."""
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)}
    script = ("import contextlib, io, json, sys\n"
              "from libreyolo.cli.app import main\n"
              "for argv in (['profile', 'what-if', sys.argv[1], '--json'], ['profile', 'ops', sys.argv[1], '--json']):\n"
              "    out = io.StringIO()\n"
              "    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):\n"
              "        main(argv)\n"
              "    json.loads(out.getvalue())\n"
              "print(json.dumps(sorted(sys.modules)))\n")
    proc = subprocess.run([sys.executable, "-c", script, str(copy)], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    modules = set(json.loads(proc.stdout.splitlines()[-1]))
    assert {"libreyolo.profiler.whatif", "libreyolo.profiler.artifacts"} <= modules
    assert not {m for m in modules if m.split(".")[0] in ("torch", "torchvision", "numpy")}
    assert not {m for m in modules if m.startswith(("libreyolo.families", "libreyolo.engine", "libreyolo.model"))}
