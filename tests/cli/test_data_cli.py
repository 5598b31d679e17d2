"""`libreyolo data check|convert`, COCO json through `train` and `val --save-json`, in process."""

import json
import shutil

import pytest
from coco_kit import CATEGORY_IDS, write_coco, write_yolo
from testkit import CHROMIUM, NEEDS_CHROMIUM, chromium_render, ink, run_in_process


def _flawed(root):
    """A YOLO dataset with one of each problem the check names."""
    yaml = write_yolo(root)
    (root / "images" / "train" / "train1.jpg").write_bytes(b"not an image at all")
    (root / "labels" / "train" / "train2.txt").write_text("0 1.2 0.5 0.3 0.3\n")  # past the right border
    with (root / "labels" / "train" / "train0.txt").open("a") as f:
        f.write("1 0.5 0.5 0.02 0.02\n")  # 1.6 x 1.2 px at imgsz 64
    shutil.copy(root / "images" / "train" / "train3.jpg", root / "images" / "val" / "leak.jpg")
    return yaml


@pytest.mark.parametrize("command", ["check", "convert"])
def test_help_lists_the_keys_it_accepts(command, capsys):
    import re

    code, out, _ = run_in_process(["data", command, "--help"], capsys)
    assert code == 0 and "Keys (key=, default, meaning):" in out
    rows = {line.split()[0][:-1]: line for line in out.splitlines() if re.match(r"\s+[a-z_]+=\s", line)}
    code, _, err = run_in_process(["data", command, "bogus=1"], capsys)
    allowed = re.search(r"\(allowed: ([a-z_, ]+)\)", err).group(1).split(", ")
    assert code == 2 and sorted(rows) == allowed  # the table is what the command parses
    if command == "convert":
        from libreyolo.data.convert import FORMATS

        assert all(f in rows["to"] for f in FORMATS)


def test_check_names_each_problem_and_strict_fails(tmp_path, capsys):
    yaml = _flawed(tmp_path / "d")
    page = tmp_path / "page.html"
    code, out, err = run_in_process(["data", "check", f"data={yaml}", "imgsz=64", f"out={page}", "--json", "--strict"],
                                    capsys)
    assert code == 1, err
    report = json.loads(out)
    keys = {p["key"]: p for p in report["problems"]}
    assert set(keys) == {"train_unreadable_images", "train_skipped_label_files", "train_outside_boxes",
                         "train_tiny_boxes", "train_val_duplicates"}
    assert keys["train_unreadable_images"]["examples"][0].endswith("train1.jpg: undecodable image")
    assert "coordinates outside [0, 1]" in keys["train_skipped_label_files"]["examples"][0]
    assert keys["train_tiny_boxes"]["count"] == 1 and "leak.jpg" in keys["train_val_duplicates"]["examples"][0]
    assert report["verdict"].startswith("data check: 5 problems: 1 corrupt or undecodable train image; 1 train label")
    assert report["splits"]["val"]["backgrounds"] == 2  # its own, and the leaked image (no label file)
    assert report["html"] == str(page) and page.is_file()
    assert sum(report["box_sizes"]["counts"]["train"]) == report["splits"]["train"]["boxes"]  # every box drawn
    code, out, _ = run_in_process(["data", "check", f"data={yaml}", "imgsz=64", f"out={page}"], capsys)
    assert code == 0 and out.strip() == report["verdict"]  # without --strict: the verdict, exit 0


def test_a_clean_coco_dataset_checks_ok_with_its_crowd_counted(tmp_path, capsys):
    val_json = write_coco(tmp_path / "coco", crowd={"val": [(0, 3, 1)]})
    code, out, err = run_in_process(["data", "check", f"data={val_json}", "imgsz=64", f"out={tmp_path / 'p.html'}",
                                     "--json", "--strict"], capsys)
    assert code == 0, err
    report = json.loads(out)
    assert report["ok"] and report["verdict"].startswith("data check: ok (6 train / 6 val images")
    assert report["splits"]["val"]["crowd"] == 1 and report["names"] == ["cat", "dog", "bird"]


@pytest.mark.skipif(CHROMIUM is None, reason=NEEDS_CHROMIUM)
def test_check_page_renders_in_headless_chromium(tmp_path, capsys):
    page = tmp_path / "page.html"
    code, _, err = run_in_process(["data", "check", f"data={_flawed(tmp_path / 'd')}", "imgsz=64", f"out={page}"], capsys)
    assert code == 0, err
    html = page.read_text()
    assert "<script src=" not in html  # plotly inlined: no network
    dom, shot = chromium_render(page, tmp_path, window="1280,2200")
    assert dom.count('class="main-svg"') >= html.count("Plotly.newPlot") == 3
    assert "5 problems" in dom and "<td>cat</td>" in dom and "leak.jpg" in dom
    inked, colours = ink(shot)
    assert inked > 0.05 and colours > 20, (inked, colours)


def test_convert_cli_prints_the_new_yaml_and_refuses_bad_input(tmp_path, capsys):
    yaml = write_yolo(tmp_path / "y")
    code, out, err = run_in_process(["data", "convert", f"data={yaml}", "to=coco", f"out={tmp_path / 'c'}"], capsys)
    assert code == 0, err
    assert out.strip() == str(tmp_path / "c" / "data.yaml") and "val: 6 images" in err
    for args, needle in ((["to=xml", f"out={tmp_path / 'x'}"], "to= must be one of coco, yolo"),
                         (["to=yolo"], "no out= given"),
                         (["to=yolo", f"out={tmp_path / 'c'}"], "already exists")):
        code, out, err = run_in_process(["data", "convert", f"data={yaml}", *args], capsys)
        assert code == 2 and err.startswith("error: ") and needle in err and err.count("\n") == 1, err


@pytest.mark.parametrize("broken", ["bad json", "missing image"])
def test_train_on_broken_coco_is_one_line_and_writes_nothing(tmp_path, capsys, broken):
    val_json = write_coco(tmp_path / "coco")
    if broken == "bad json":
        (val_json.parent / "instances_train.json").write_text("{\"images\": [")
    else:
        (tmp_path / "coco" / "train" / "train4.jpg").unlink()
    code, out, err = run_in_process(["train", "model=yolo9-t", f"data={val_json}", "epochs=1", "imgsz=64",
                                     f"project={tmp_path / 'runs'}"], capsys)
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: "), err
    assert ("not valid json" if broken == "bad json" else "images listed in instances_train.json are missing") in err
    assert not (tmp_path / "runs").exists()


def test_val_save_json_writes_coco_results_with_the_json_ids(tmp_path, capsys):
    val_json = write_coco(tmp_path / "coco")
    out_file = tmp_path / "preds.json"
    code, out, err = run_in_process(["val", "model=yolo9-t", f"data={val_json}", "imgsz=64", "batch=6", "workers=0",
                                     "--save-json", str(out_file), "--json"], capsys)
    assert code == 0, err
    metrics = json.loads(out)
    rows = json.loads(out_file.read_text())
    assert metrics["saved_json"] == str(out_file) and len(rows) == metrics["num_dets"] > 0
    assert {r["category_id"] for r in rows} <= set(CATEGORY_IDS) and {r["image_id"] for r in rows} <= \
        {1000 + 10 * i for i in range(6)}
    assert [r["category_id"] for r in metrics["per_class"]] == CATEGORY_IDS
    assert f"COCO results: {len(rows)} detections in {out_file}" in err


def test_check_refuses_what_it_does_not_read_in_one_line(tmp_path, capsys):
    for data, needle in ((str(tmp_path), "is a folder: data check reads detection datasets"),
                         (str(tmp_path / "nope.json"), "annotations not found"),
                         ("shapes-cls", "is a classification dataset")):
        code, out, err = run_in_process(["data", "check", f"data={data}"], capsys)
        assert code == 2 and out == "" and err.startswith("error: ") and needle in err and err.count("\n") == 1, err
    assert not (tmp_path / "runs").exists()
