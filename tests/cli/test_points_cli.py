"""Point detection through the command's entry point, in this process: FOMO trains two epochs on a
subset of the built-in `shapes` (a detection set, unchanged), then val prints its per-class F1
table and predict gives points; the point-specific bad inputs are one line and write nothing."""

import csv
import json
from pathlib import Path

import pytest
import yaml
from testkit import run_in_process, shapes_subset

FAST = ["device=cpu", "workers=0", "imgsz=64", "batch=8"]


def test_fomo_trains_two_epochs_then_val_and_predict(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    data = shapes_subset(tmp_path, 16)
    code, out, err = run_in_process(["train", "model=fomo-035", f"data={data}", *FAST, "epochs=2", "--json"], capsys)
    assert code == 0, err
    result = json.loads(out)
    run_dir = Path(result["run_dir"])
    assert result["task"] == "points" and set(result["metrics"]) >= {"f1", "precision", "recall", "num_points"}
    args = yaml.safe_load((run_dir / "args.yaml").read_text())
    # The family's recipe where the user said nothing, the user's values where they did.
    assert (args["task"], args["imgsz"], args["amp"], args["mosaic"], args["optimizer"], args["conf"]) == (
        "points", 64, False, 0.0, "adamw", 0.5)
    with (run_dir / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["epoch"] for r in rows] == ["1", "2"] and 0.0 <= float(rows[-1]["f1"]) <= 1.0
    assert float(rows[0]["train/obj"]) > 0 and float(rows[0]["train/bg"]) > 0
    assert "<th>F1</th>" in (run_dir / "results.html").read_text()

    code, out, err = run_in_process(["val", f"model={run_dir / 'weights' / 'last.pt'}", "device=cpu", "workers=0",
                                     "point_dist=12", "--json"], capsys)
    assert code == 0, err
    metrics = json.loads(out)
    assert (metrics["task"], metrics["imgsz"], metrics["num_images"]) == ("points", 64, 4) and len(metrics["per_class"]) == 10
    table = [ln.split() for ln in err.splitlines()]
    assert ["class", "images", "instances", "P", "R", "F1"] in table and any(ln[:2] == ["all", "4"] for ln in table)

    source = Path((tmp_path / "val.txt").read_text().splitlines()[0])
    # conf=0 after four steps: every cell of every class is on, so each class is one blob over the
    # whole canvas, one point per class at the canvas centre (the image centre, to a network pixel).
    code, out, err = run_in_process(["predict", f"model={result['best']}", f"source={source}", "device=cpu", "conf=0",
                                     f"project={tmp_path / 'pred'}", "--json"], capsys)
    assert code == 0, err
    [line] = out.splitlines()
    answer = json.loads(line)
    assert answer["task"] == "points" and "detections" not in answer and Path(answer["saved"]).is_file()
    assert sorted(p["class"] for p in answer["points"]) == list(range(10))
    px = max(answer["width"], answer["height"]) / 64  # one network pixel in the image
    for p in answer["points"]:
        assert set(p) == {"point", "score", "class", "name"} and p["score"] > 0
        assert abs(p["point"][0] - answer["width"] / 2) <= px and abs(p["point"][1] - answer["height"] / 2) <= px

    from libreyolo import LibreYOLO

    [r] = LibreYOLO(result["best"]).predict(str(source), conf=0.0, device="cpu")
    assert r.task == "points" and len(r) == len(answer["points"])
    assert r.points.flatten().tolist() == pytest.approx([v for p in answer["points"] for v in p["point"]], abs=0.01)


def _files(root: Path) -> set:
    return {p for p in root.rglob("*") if ".cache" not in p.parts}


@pytest.mark.parametrize("args, said", [
    (["model=fomo-035", "data=shapes", "point_dist=0"], "bad value for 'point_dist': 0.0 (allowed: float > 0.0)"),
    (["model=fomo-035", "data=shapes", "point_dist=-2.5"], "bad value for 'point_dist': -2.5"),
    (["model=fomo-035", "data=shapes-cls"], "dataset shapes-cls is a classification dataset"),
    (["model=fomo-035", "data=shapes", "task=detect"], "FOMO cannot do task=detect (it does: points)"),
    (["model=resnet18", "data=shapes", "task=points"], "ResNet cannot do task=points (it does: classify)"),
])
def test_bad_point_inputs_are_one_line_and_write_nothing(tmp_path, monkeypatch, capsys, args, said):
    monkeypatch.chdir(tmp_path)
    before = _files(tmp_path)
    code, out, err = run_in_process(["train", *args, "epochs=1", *FAST], capsys)
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: ") and said in err, err
    assert out == "" and _files(tmp_path) == before


def test_val_refuses_a_distance_that_is_not_positive(capsys):
    code, out, err = run_in_process(["val", "model=fomo-035", "data=shapes", "point_dist=0", "device=cpu"], capsys)
    assert (code, out) == (2, "") and err == "error: bad value for 'point_dist': 0.0 (allowed: float > 0.0)\n"
