"""The classifiers from the real `libreyolo` command and from Python: train on the built-in set
and on a hand-made class-folder dataset, validate, resume, bench, profile, and every bad input
(one line, exit code 2, nothing written)."""

import json
from pathlib import Path

import pytest
import torch
from testkit import run_in_process
from torchvision.io import write_png

from libreyolo import LibreYOLO
from libreyolo.families import REGISTRY, arch_name

FAST = ["imgsz=64", "batch=8", "workers=0", "device=cpu"]
# Every registered classifier, by its architecture name: a new one is tested the day it registers.
ARCHS = [arch_name(spec, size) for spec in REGISTRY.values() if "classify" in spec.tasks for size in spec.sizes]


def _folder(root: Path, classes=("cat", "dog"), per_class: int = 6, val_classes=None) -> Path:
    """A tiny class-folder dataset: train/<class>/*.png and val/<class>/*.png, each class its own
    colour so it can be learned."""
    gen = torch.Generator().manual_seed(0)
    for split, names in (("train", classes), ("val", val_classes or classes)):
        for c, name in enumerate(names):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                img = (torch.rand(3, 40, 40, generator=gen) * 60).to(torch.uint8)
                img[c % 3] += 150
                write_png(img, str(folder / f"{i}.png"))
    return root


def _files(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*")}


# The built-in set with its cheapest classifier (MobileNetV4-s trains it in about a third of
# ResNet-18's time); every classifier trains on a folder in test_python_trains_two_epochs.
@pytest.mark.parametrize("arch", ["mobilenetv4-s"])
def test_cli_trains_two_epochs_on_the_builtin_set_then_val(cli, tmp_path, arch, capsys, one_thread):
    # 32 px, batch 32: 1,000 images an epoch, kept to a few seconds on a 2-core runner.
    proc = cli("train", f"model={arch}", "data=shapes-cls", "epochs=2", "imgsz=32", "batch=32", "workers=0",
               "device=cpu", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["task"] == "classify" and set(out["metrics"]) >= {"top1", "top5", "loss", "num_images"}
    assert out["metrics"]["num_images"] == 200 and 0.0 <= out["metrics"]["top1"] <= out["metrics"]["top5"] <= 1.0
    run = tmp_path / out["run_dir"]
    header = (run / "results.csv").read_text().splitlines()[0].split(",")
    assert header == ["epoch", "train/cls", "lr", "top1", "top5", "seconds", "skipped_steps"]
    page = (run / "results.html").read_text()
    assert "top-1" in page and "circle" in page  # the per-class table of the last validation
    assert "on shapes-cls (1000 train images, image classification)" in proc.stderr
    assert "top-1 " in proc.stderr and "mAP" not in proc.stderr
    # val through the command's entry point in this process (a detector's val runs as a real process
    # in test_train_cli.py; a start-up costs seconds of torch import).
    code, stdout, stderr = run_in_process(["val", f"model={tmp_path / out['best']}", "device=cpu", "workers=0"], capsys)
    assert code == 0, stderr[-2000:]
    assert stdout.startswith("top-1 ") and "top-5" in stdout and "(200 images)" in stdout
    assert "imgsz 32 (from the checkpoint's training arguments)" in stderr
    assert "triangle_outline" in stderr  # the per-class table


# The built-in set's 2-epoch run is the CLI's above; Python trains every classifier on a folder.
@pytest.mark.parametrize("arch", ARCHS)
def test_python_trains_two_epochs(tmp_path, arch):
    result = LibreYOLO(arch).train(data=str(_folder(tmp_path / "pets")), epochs=2, imgsz=32, batch=8, workers=0,
                                   device="cpu", project=str(tmp_path / "runs"))
    assert result.task == "classify" and result.epochs_run == 2 and result.best.is_file()
    assert result.metrics["num_images"] == 12
    assert 0.0 <= result.metrics["top1"] <= result.metrics["top5"] <= 1.0
    metrics = LibreYOLO(str(result.best)).val(device="cpu", workers=0)
    assert metrics["task"] == "classify" and [r["class"] for r in metrics["per_class"]] == ["cat", "dog"]
    assert metrics["top5"] == 1.0  # two classes: the label is always among the top 5


def test_a_folder_named_without_a_slash_and_resume(cli, tmp_path, monkeypatch, capsys, one_thread):
    _folder(tmp_path / "pets")
    proc = cli("train", "model=mobilenetv4-s", "data=pets", "epochs=3", "save_period=1", *FAST, "name=r")
    assert proc.returncode == 0, proc.stderr[-2000:]
    weights = tmp_path / "runs/train/r/weights"
    ckpt = torch.load(weights / "epoch1.pt", map_location="cpu", weights_only=True)
    assert ckpt["task"] == "classify" and ckpt["names"] == ["cat", "dog"] and ckpt["config"]["task"] == "classify"
    assert ckpt["hooks"]["ValidationHook"]["best_epoch"] == 0
    # The resume through the command's entry point in this process (one intra-op thread, as the
    # real process above); a detector's resume runs as a real process in test_train_cli.py.
    monkeypatch.chdir(tmp_path)  # data=pets is relative, as the run was given it
    code, _, err = run_in_process(["train", f"resume={weights / 'epoch1.pt'}"], capsys)
    assert code == 0, err[-2000:]
    assert "resuming from epoch 2/3" in err and "top-1" in err
    rows = (tmp_path / "runs/train/r/results.csv").read_text().splitlines()
    assert [r.split(",")[0] for r in rows[1:]] == ["1", "2", "3"]  # the resumed epochs replace the first run's


@pytest.mark.parametrize("model, task, said", [
    ("resnet18", "detect", "ResNet cannot do task=detect (it does: classify)"),
    ("yolo9-t", "classify", "YOLOv9 cannot do task=classify (it does: detect)"),
])
def test_a_task_the_family_cannot_do_is_one_line(tmp_path, monkeypatch, capsys, model, task, said):
    _folder(tmp_path / "pets")
    err = _one_line_error(tmp_path, monkeypatch, capsys, f"model={model}", "data=pets", f"task={task}")
    assert said in err and "Traceback" not in err


def _one_line_error(tmp_path, monkeypatch, capsys, *args) -> str:
    """`libreyolo train ARGS epochs=1 FAST` in this process (the command's entry point without its
    start-up): exit code 2, one line on stderr, nothing written; returns the line."""
    monkeypatch.chdir(tmp_path)
    before = _files(tmp_path)
    code, out, err = run_in_process(["train", *args, "epochs=1", *FAST], capsys)
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: "), err
    assert out == "" and _files(tmp_path) == before
    return err


def test_a_detector_on_a_classification_set_is_one_line(tmp_path, monkeypatch, capsys):
    err = _one_line_error(tmp_path, monkeypatch, capsys, "model=yolo9-t", "data=shapes-cls")
    assert "classification" in err


def _corrupt(root):
    (root / "train/cat/0.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 40)


def _empty_class(root):
    for p in (root / "train/dog").iterdir():
        p.unlink()


def _no_class_folders(root):
    for d in (root / "train").iterdir():
        for p in d.iterdir():
            p.rename(root / "train" / f"{d.name}_{p.name}")
        d.rmdir()


def _clash(root):
    (root / "val/cat").rename(root / "val/kitten")


@pytest.mark.parametrize("damage, said", [
    (_corrupt, "0.png"), (_empty_class, "dog"), (_no_class_folders, "class folder"), (_clash, "kitten"),
])
def test_bad_classification_data_is_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys, damage, said):
    data = _folder(tmp_path / "pets")
    damage(data)
    assert said in _one_line_error(tmp_path, monkeypatch, capsys, "model=resnet18", f"data={data}")


def test_bench_step_times_a_classifier(tmp_path, monkeypatch, capsys):
    # The command's entry point in this process, its arm in a real process (`libreyolo bench step`
    # itself runs as a real process in test_train_cli.py).
    _folder(tmp_path / "pets")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the arm's process: one intra-op thread, as conftest's command_env
    code, stdout, err = run_in_process(["bench", "step", "model=resnet18", "data=pets", "batch=4", "imgsz=64",
                                        "device=cpu", "arms=eager", "--steps", "3", "--warmup", "1", "--json"], capsys)
    assert code == 0, err[-2000:]
    [record] = json.loads(stdout)
    assert record["arch"] == "resnet18" and record["step_ms_median"] > 0


def test_profile_run_on_a_classifier(tmp_path, monkeypatch, capsys, one_thread):
    # The command's entry point in this process (`libreyolo profile run` runs as a real process in
    # test_profile_cli.py).
    _folder(tmp_path / "pets", per_class=12)
    monkeypatch.chdir(tmp_path)
    code, stdout, err = run_in_process(["profile", "run", "pets", "--weights", "resnet18", "batch=4", "imgsz=64",
                                        "device=cpu", "workers=0", "profile_skip=1", "profile_steps=4",
                                        "optimizer=sgd", "--json"], capsys)
    assert code == 0, err[-3000:]
    summary = json.loads(stdout)
    assert summary["arch"] == "resnet18" and summary["verdict"]


def test_a_detector_on_a_class_folder_is_one_line(tmp_path, monkeypatch, capsys):
    _folder(tmp_path / "pets")
    err = _one_line_error(tmp_path, monkeypatch, capsys, "model=yolo9-t", "data=pets")
    assert "data=pets is a folder: a detector reads a dataset yaml" in err
