"""`libreyolo export`: the real command on a small checkpoint (its file beside the checkpoint, the
checkpoint's training size, --json), the path alone on stdout, and bad input as one line, exit 2,
with nothing written."""

import json
import shutil

import onnx
import pytest
import torch
from testkit import run_in_process

from libreyolo.engine.checkpoint import save_checkpoint
from libreyolo.export import read_metadata
from libreyolo.families import get_family

NAMES = ["circle", "square", "triangle"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A ResNet-18 checkpoint (the quickest family to export) with 3 classes, trained at 64 px."""
    torch.manual_seed(0)
    state = get_family("resnet").build("18", len(NAMES)).state_dict()
    path = tmp_path_factory.mktemp("run") / "weights" / "best.pt"
    save_checkpoint(path, {"family": "resnet", "size": "18", "names": NAMES, "model": state, "task": "classify",
                           "config": {"imgsz": 64}})
    return path


def test_export_writes_beside_the_checkpoint_at_its_training_size(cli, checkpoint, tmp_path):
    """The command in a real process: pt2, the quickest format to write (no ONNX conversion)."""
    shutil.copy(checkpoint, tmp_path / "best.pt")
    run = cli("export", "model=best.pt", "format=pt2", "dynamic=true", "--json")
    assert run.returncode == 0, run.stderr
    [line] = run.stdout.splitlines()
    result = json.loads(line)
    assert result["path"] == "best.pt2" and sorted(p.name for p in tmp_path.iterdir()) == ["best.pt", "best.pt2"]
    assert (result["imgsz"], result["input_shape"], result["checked_batches"]) == (64, ["batch", 3, 64, 64], [1, 2])
    assert result["output_shape"] == ["batch", len(NAMES)] and set(result["max_abs_diff"]) == {"probs"}
    assert read_metadata(tmp_path / "best.pt2")["names"] == json.dumps(NAMES)
    assert "exported resnet18 (classify, 3 classes)" in run.stderr and "max |diff| vs PyTorch probs" in run.stderr


def test_onnx_with_the_path_alone_on_stdout(checkpoint, tmp_path, capfd):
    """stdout holds the path and nothing the exporters might print (C++ logs included: capfd)."""
    target = tmp_path / "out" / "m.onnx"
    code, out, err = run_in_process(["export", f"model={checkpoint}", f"output={target}"], capfd)
    assert code == 0, err
    assert out == f"{target}\n" and sorted(p.name for p in target.parent.iterdir()) == ["m.onnx"]
    meta = {p.key: p.value for p in onnx.load(str(target)).metadata_props}
    assert json.loads(meta["names"]) == NAMES and meta["task"] == "classify" and meta["imgsz"] == "64"


@pytest.mark.parametrize("args, said", [
    (["format=tflite"], "unknown export format 'tflite' (formats: onnx, pt2)"),
    (["imgsz=100"], "imgsz=100 is not a multiple of 32, the largest stride of resnet18: use 96 or 128"),
    (["batch=0"], "bad value for 'batch': 0"),
    (["dynamic=maybe"], "bad value for 'dynamic': 'maybe'"),
    (["epochs=3"], "key 'epochs' does not apply here"),
    (["imgz=64"], "unknown key 'imgz' (did you mean 'imgsz'?)"),
    (["opset=12"], "bad value for 'opset': 12"),
])
def test_bad_input_is_one_line_and_writes_nothing(args, said, checkpoint, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    beside = sorted(checkpoint.parent.iterdir())
    code, out, err = run_in_process(["export", f"model={checkpoint}", *args], capsys)
    lines = err.splitlines()
    assert code == 2 and out == "" and len(lines) == 1 and lines[0].startswith("error: "), err
    assert said in lines[0]
    assert list(tmp_path.iterdir()) == [] and sorted(checkpoint.parent.iterdir()) == beside


@pytest.mark.parametrize("args, said", [
    ([], "no model given"),
    (["model=missing.pt"], "weights file 'missing.pt' does not exist"),
])
def test_no_model_is_one_line(args, said, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_in_process(["export", *args], capsys)
    assert code == 2 and out == "" and err.startswith("error: ") and said in err and len(err.splitlines()) == 1
    assert list(tmp_path.iterdir()) == []
