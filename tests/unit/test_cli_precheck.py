"""The checks that run before torch is imported say exactly what the full checks would say."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from libreyolo.cli import precheck
from libreyolo.errors import LibreYOLOError
from libreyolo.names import OFFICIAL_PREFIX


def _message(fn, *args) -> str:
    with pytest.raises(LibreYOLOError) as err:
        fn(*args)
    return f"{type(err.value).__name__}: {err.value}"


@pytest.mark.parametrize("value", ["missing/data.yaml", "missing.yml", "no_such_dataset", "~/nowhere/d.yaml"])
def test_a_missing_dataset_is_the_full_checks_error(value):
    from libreyolo.data import load_data_config

    assert _message(precheck.check_data, value) == _message(load_data_config, value)


@pytest.mark.parametrize("value", ["missing.pt", "runs/x/weights/best.pt", "old.pth"])
def test_a_missing_weights_file_is_the_full_checks_error(value):
    from libreyolo.model import resolve_model

    assert _message(precheck.check_model, value) == _message(resolve_model, value)


def test_a_missing_resume_checkpoint_is_the_full_checks_error():
    from libreyolo.engine.checkpoint import load_checkpoint

    assert _message(precheck.check_resume, "gone/last.pt") == _message(load_checkpoint, Path("gone/last.pt"))


def test_what_only_the_full_checks_can_decide_passes(tmp_path):
    from libreyolo.families import REGISTRY

    # Official names may still be downloaded: every family's prefix is one the precheck leaves alone.
    assert all(spec.weights_prefix.startswith(OFFICIAL_PREFIX) for spec in REGISTRY.values())
    (tmp_path / "w.pt").write_bytes(b"not a checkpoint")  # exists: its contents need torch
    for name in ("LibreYOLO9s.pt", "yolo9-t", "foo", str(tmp_path / "w.pt"), ""):
        precheck.check_model(name)
    for data in ("shapes", "coco128", str(tmp_path / "w.pt")):
        precheck.check_data(data)
    for resume in (True, False, "true", "", str(tmp_path / "w.pt")):
        precheck.check_resume(resume)


def test_a_missing_file_is_reported_without_importing_torch(tmp_path):
    src = Path(__file__).resolve().parents[2] / "src"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(src), os.environ.get("PYTHONPATH")) if p)}
    for args in (["train", "model=yolo9-t", "data=missing/data.yaml"], ["val", "model=runs/best.pt"],
                 ["bench", "step", "model=yolo9-t", "data=nope.yaml"], ["profile", "run", "nope.yaml"]):
        run = subprocess.run([sys.executable, "-X", "importtime", "-m", "libreyolo", *args], capture_output=True,
                             text=True, env=env, cwd=tmp_path)
        errors = [ln for ln in run.stderr.splitlines() if not ln.startswith("import time:")]
        assert run.returncode == 2 and len(errors) == 1 and errors[0].startswith("error: "), run.stderr[-2000:]
        imported = {ln.rsplit("|", 1)[-1].strip() for ln in run.stderr.splitlines() if ln.startswith("import time:")}
        assert not {m for m in imported if re.match(r"(torch|torchvision|numpy)(\.|$)", m)}, args
