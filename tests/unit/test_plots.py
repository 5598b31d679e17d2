"""results.html: self-contained, escaped, drawn by headless Chromium without a network."""

import csv

import numpy as np
import pytest
from testkit import CHROMIUM, NEEDS_CHROMIUM, chromium_render, ink

from libreyolo.eval.coco import coco_evaluator
from libreyolo.eval.details import details
from libreyolo.plots import render, write_results_html
from libreyolo.tasks import get_task

DETECT = get_task("detect")

NAMES = ["cat", "dog", "<b>bird</b></script>"]
META = {"arch": "yolo9-t", "data": "shapes", "epoch": "3/3", "imgsz": 64, "batch": 8, "best epoch": 3,
        "run": "runs/train/exp"}


def _write_csv(run_dir, epochs=3):
    rows = [{"epoch": e, "train/box": 3.0 / e, "train/cls": 2.0 / e, "train/dfl": 1.5 / e, "lr": 0.01 / e,
             "map50_95": "" if e == 1 else 0.1 * e, "map50": "" if e == 1 else 0.2 * e, "seconds": 1.0,
             "skipped_steps": 0} for e in range(1, epochs + 1)]
    with (run_dir / "results.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _details():
    gt = [np.array([(1, 10, 10, 40, 40, 0), (1, 50, 50, 90, 90, 1), (2, 10, 10, 60, 60, 2), (2, 60, 60, 90, 90, 0)],
                   dtype=float)]
    dets = [np.array([(1, 10, 10, 40, 40, 0.9, 0), (1, 50, 50, 90, 90, 0.7, 0), (2, 10, 12, 60, 60, 0.6, 2),
                      (2, 0, 0, 9, 9, 0.4, 1)], dtype=float)]
    ev = coco_evaluator(gt, dets, [(100, 100)] * 2, NAMES)
    out = details(gt, dets, 2, NAMES, ev.eval["precision"], np.asarray(ev.params.recThrs))
    out.update(map50_95=float(ev.stats[0]), map50=float(ev.stats[1]), num_images=2)
    return out


def test_page_is_self_contained_and_escapes_names(tmp_path):
    _write_csv(tmp_path)
    page = write_results_html(tmp_path, DETECT, _details(), META).read_text()
    assert page.startswith("<!DOCTYPE html>") and [p.name for p in tmp_path.iterdir()] == ["results.csv",
                                                                                           "results.html"]
    assert "<script src=" not in page and page.count("Plotly.newPlot") == 4  # curves, PR, F1, confusion
    assert page.count("plotly.js v") == 1  # plotly.js inlined once, for the whole page
    assert "<b>bird</b>" not in page and "&lt;b&gt;bird&lt;/b&gt;" in page  # a class name is text
    assert page.count("</script>") == page.count("<script")
    assert "validation per class" in page and "yolo9-t on shapes" in page


def test_a_run_without_validation_gets_its_training_curves():
    page = render([{"epoch": "1", "train/box": "2.0", "lr": "0.01", "map50_95": "", "map50": ""}], DETECT, None, META)
    assert page.count("Plotly.newPlot") == 1 and "No validation has run yet" in page
    assert render([], DETECT, None, {}).count("Plotly.newPlot") == 1  # even an empty results.csv draws


@pytest.mark.skipif(CHROMIUM is None, reason=NEEDS_CHROMIUM)
def test_results_page_renders_in_headless_chromium(tmp_path):
    _write_csv(tmp_path, epochs=5)
    page = write_results_html(tmp_path, DETECT, _details(), META)
    html = page.read_text()
    dom, shot = chromium_render(page, tmp_path, window="1280,2400")
    assert dom.count('class="main-svg"') >= html.count("Plotly.newPlot") == 4  # every figure drawn
    assert "validation per class" in dom and "<td>cat</td>" in dom
    inked, colours = ink(shot)
    assert inked > 0.05 and colours > 20, (inked, colours)
