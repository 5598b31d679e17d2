"""The real `libreyolo` command trains, validates, resumes and benchmarks on tiny data (CPU)."""

import csv
import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from testkit import run_in_process, shapes_subset

from libreyolo.families import REGISTRY, arch_name

COMMON = ["model=yolo9-t", "data=shapes", "device=cpu", "workers=0", "amp=false"]
TINY = [*COMMON, "imgsz=128", "batch=4"]  # the acceptance run
FAST = [*COMMON, "imgsz=64", "batch=8"]


def _rows(run_dir):
    with (run_dir / "results.csv").open() as f:
        return list(csv.DictReader(f))


def test_train_two_epochs_then_val(cli, tmp_path, monkeypatch, capsys, one_thread):
    result = cli("train", *TINY, "epochs=2", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    run_dir = tmp_path / out["run_dir"]
    assert run_dir == tmp_path / "runs" / "train" / "exp"
    assert (run_dir / "weights" / "last.pt").is_file()
    assert (run_dir / "weights" / "best.pt").is_file()
    args = yaml.safe_load((run_dir / "args.yaml").read_text())
    assert args["epochs"] == 2 and args["imgsz"] == 128 and args["model"] == "yolo9-t"
    rows = _rows(run_dir)
    assert [r["epoch"] for r in rows] == ["1", "2"]
    assert all(float(r["train/box"]) > 0 for r in rows)
    assert 0.0 <= float(rows[-1]["map50_95"]) <= 1.0
    assert set(out["metrics"]) >= {"map50_95", "map50"}

    # Without a terminal: plain lines, an epoch's own line once it ends (a slow epoch also prints
    # progress lines, `epoch 1/2  8/32 steps (25%) ...`).
    assert "\x1b[" not in result.stderr
    ends = [ln.split("  ")[0] for ln in result.stderr.splitlines() if ln.startswith("epoch ") and " steps (" not in ln]
    assert ends == ["epoch 1/2", "epoch 2/2"]
    page = (run_dir / "results.html").read_text()
    assert "<td>all</td><td>32</td><td>506</td>" in page and page.count("Plotly.newPlot") == 4

    # The checkpoint was trained at 128 px on shapes: val takes both from it, and says so. last.pt
    # holds the EMA weights the last epoch validated (best.pt may be an earlier epoch's).
    val = cli("val", f"model={run_dir / 'weights' / 'last.pt'}", "batch=8", "device=cpu", "workers=0", "--json")
    assert val.returncode == 0, val.stderr
    metrics = json.loads(val.stdout)
    assert (metrics["imgsz"], metrics["data"], metrics["num_images"]) == (128, "shapes", 32)
    assert ("imgsz 128 (from the checkpoint's training arguments), data shapes (from the checkpoint's "
            "training arguments)") in val.stderr
    # Two epochs at 128 px leave a near-random model (mAP50-95 ~3e-5, a match or two): the last
    # digits of val's scores move one of them, so "the same" is within a tenth, which still tells
    # the last epoch's figure from the first's (twice as high in this run).
    assert metrics["map50_95"] == pytest.approx(out["metrics"]["map50_95"], rel=0.1)
    rows = metrics["per_class"]
    assert len(rows) == 10 and sum(r["instances"] for r in rows) == 506 and "curves" not in metrics
    table = [ln.split() for ln in val.stderr.splitlines()]
    assert ["class", "images", "instances", "P", "R", "mAP50", "mAP50-95"] in table
    assert any(ln[:3] == ["all", "32", "506"] for ln in table)
    # The rest through the command's entry point in this process (the real process ran both
    # commands above; a start-up costs seconds of torch import).
    monkeypatch.chdir(tmp_path)
    code, _, err = run_in_process(["val", f"model={out['best']}", "imgsz=64", "batch=8", "device=cpu", "workers=0"],
                                  capsys)
    assert code == 0 and "imgsz 64 (as given)" in err, err

    # A second run gets a fresh directory (two steps on a 16-image subset).
    (tmp_path / "sub").mkdir()
    subset = [a for a in FAST if not a.startswith("data=")] + [f"data={shapes_subset(tmp_path / 'sub', 16)}"]
    code, stdout, err = run_in_process(["train", *subset, "epochs=1", "val=false"], capsys)
    assert code == 0, err
    assert " for 1 epoch on " in err and "done: 1 epoch, results in" in err, err
    assert (tmp_path / "runs" / "train" / "exp2" / "weights" / "last.pt").is_file()
    assert stdout.strip().endswith("exp2/weights/last.pt")


def test_resume_after_kill_continues_schedule(cli, cli_command, cli_env, tmp_path, monkeypatch, capsys, one_thread):
    # 64 images: 8 steps an epoch. The uninterrupted reference runs through the command's entry point
    # in this process (one intra-op thread, as the real processes below: OMP_NUM_THREADS=1).
    (tmp_path / "data").mkdir()
    data = shapes_subset(tmp_path / "data", 64)
    base = [*[a for a in FAST if not a.startswith("data=")], f"data={data}", "epochs=3", "val=false",
            "warmup_epochs=0.5", "lr_schedule=cosine"]
    monkeypatch.chdir(tmp_path)
    code, _, err = run_in_process(["train", *base, "name=ref"], capsys)
    assert code == 0, err
    ref_rows = _rows(tmp_path / "runs" / "train" / "ref")

    proc = subprocess.Popen([*cli_command, "train", *base, "name=cut"], cwd=tmp_path, env=cli_env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    last = tmp_path / "runs" / "train" / "cut" / "weights" / "last.pt"
    deadline = time.time() + 300
    while not last.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.01)
    assert last.exists(), "first epoch never finished"
    # last.pt appears after its epoch's results.csv row (ResultsHook runs before CheckpointHook):
    # killed now, the run is in epoch 2, a whole epoch from its next row.
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    cut_rows = _rows(tmp_path / "runs" / "train" / "cut")
    assert len(cut_rows) == 1, "the kill must land mid-run"

    # cuda_graph may change on resume (what the out-of-memory line suggests); the run is the same.
    resumed = cli("train", f"resume={last}", "cuda_graph=false")
    assert resumed.returncode == 0, resumed.stderr
    rows = _rows(tmp_path / "runs" / "train" / "cut")
    assert [r["epoch"] for r in rows] == ["1", "2", "3"]
    for got, want in zip(rows, ref_rows):
        assert float(got["lr"]) == pytest.approx(float(want["lr"]), rel=1e-9)
        assert float(got["train/box"]) == pytest.approx(float(want["train/box"]), rel=1e-3)

    # The refusals in this process too.
    code, _, err = run_in_process(["train", f"resume={last}", "epochs=9"], capsys)
    assert code == 2 and "cannot change epochs when resuming" in err
    code, _, err = run_in_process(["train", f"resume={last}"], capsys)
    assert code == 2 and "nothing to resume" in err


def test_python_api(tmp_path, monkeypatch):
    from libreyolo import LibreYOLO

    monkeypatch.chdir(tmp_path)
    model = LibreYOLO("YOLOv9-t")
    assert model.arch == "yolo9-t"
    data = shapes_subset(tmp_path, 16)  # two steps: the API is under test, not the learning
    result = model.train(data=data, epochs=1, imgsz=64, batch=8, device="cpu", workers=0, amp=False,
                         project=str(tmp_path / "p"))
    assert result.best.is_file() and result.run_dir == tmp_path / "p" / "exp"
    assert 0.0 <= result.metrics["map50_95"] <= 1.0
    trained = LibreYOLO(str(result.best))
    assert trained.arch == "yolo9-t"
    metrics = trained.val(data=data, imgsz=64, batch=8, device="cpu", workers=0)
    assert metrics["map50_95"] == pytest.approx(result.metrics["map50_95"], abs=1e-6)


def _bench_records(records, arms):
    assert [r["arm"] for r in records] == arms
    for r in records:
        assert r["step_ms_min"] <= r["step_ms_median"]
        assert r["kernel_busy_ms"] is None and r["utilisation"] is None  # no CUDA here
        assert set(r["synced_ms"]) == {"h2d", "forward", "loss", "backward", "optimizer+ema"}
        assert 0 < r["network_share"] < 1
        assert r["precision"] == "float32" and r["graph"]["enabled"] is False


def test_bench_step_cpu(cli, capsys, monkeypatch, one_thread):
    # The real command, its arm in a process of its own.
    result = cli("bench", "step", "model=yolo9-t", "batch=2", "imgsz=64", "device=cpu", "amp=false",
                 "--steps", "3", "--warmup", "1", "arms=eager", "--json")
    assert result.returncode == 0, result.stderr
    _bench_records(json.loads(result.stdout), ["eager"])
    # Two arms, the table and --repeat through the command's entry point in this process, each
    # arm's run in this process too (a real arm process ran above): no interpreter and torch
    # start-up each.
    from libreyolo import bench

    monkeypatch.setattr(bench, "_run_arm_process", bench.run_arm)
    code, stdout, err = run_in_process(["bench", "step", "model=yolo9-t", "batch=2", "imgsz=64", "device=cpu",
                                        "amp=false", "--steps", "3", "--warmup", "1", "arms=eager,nchw", "--json"],
                                       capsys)
    assert code == 0, err
    _bench_records(json.loads(stdout), ["eager", "nchw"])
    code, stdout, err = run_in_process(["bench", "step", "model=yolo9-t", "batch=2", "imgsz=64", "device=cpu",
                                        "--steps", "2", "--warmup", "1", "--repeat", "2", "arms=eager"], capsys)
    assert code == 0, err
    assert "step ms (min/med)" in stdout and "yolo9-t" in stdout
    assert "run spread" in stdout and "median of 2 runs per arm" in stdout
    assert err.count("bench: arm 1/1 'eager' run ") == 2
    # The refusals through the command's entry point in this process (no start-up each).
    for arms in ("turbo", "float16+turbo"):
        code, _, err = run_in_process(["bench", "step", "model=yolo9-t", f"arms={arms}"], capsys)
        assert code == 2 and f"unknown arm '{arms}'" in err
    # On a CPU, float16/bfloat16 autocast and CUDA graphs would run float32 eager: refused, one line,
    # before any arm runs.
    code, out, err = run_in_process(["bench", "step", "model=yolo9-t", "batch=2", "imgsz=64", "device=cpu",
                                     "arms=eager,float16+graph,bfloat16+graph"], capsys)
    assert code == 2 and not out and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: bench arms whose lever cannot act on cpu: 'float16+graph' (float16 "
                          "autocast needs a CUDA device, CUDA graphs need a CUDA device (training on cpu))")
    assert "arms that act on cpu: eager, fp32, compile, nchw, nhwc" in err


# Every detector but YOLOv9 (the runs above): its first size, two epochs of one step on 4 images
# (a DETR's step takes seconds on a CPU; the command's plumbing is under test, not the learning).
OTHER_DETECTORS = [arch_name(spec, spec.sizes[0]) for name, spec in REGISTRY.items()
                   if "detect" in spec.tasks and name != "yolo9"]


@pytest.mark.parametrize("model", OTHER_DETECTORS)
def test_other_families_train_two_epochs(tmp_path, model, capsys, one_thread):
    # The command's own entry point, in this process: no interpreter and torch start-up per family.
    code, stdout, stderr = run_in_process(["train", f"model={model}", f"data={shapes_subset(tmp_path, 4)}",
                                           "device=cpu", "workers=0", "imgsz=64", "batch=4", "epochs=2",
                                           f"project={tmp_path / 'runs'}", "--json"], capsys)
    assert code == 0, stderr
    out = json.loads(stdout)
    rows = _rows(Path(out["run_dir"]))
    assert [r["epoch"] for r in rows] == ["1", "2"] and rows[-1]["map50_95"] != ""
    assert all(float(v) >= 0 for r in rows for k, v in r.items() if k.startswith("train/"))
