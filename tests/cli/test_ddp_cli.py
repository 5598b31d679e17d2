"""Multi-process training end to end on CPU: 2 gloo processes under torchrun (YOLOv9-t, 64 px).

What a 2-process run must be: the single-process run of the same global batch (weights equal to
float rounding), rank 0 alone writing and speaking, the CUDA-graph and profiler notices once, a
checkpoint that resumes on the other process count, and a killed rank ending the run with one line.

The reference single-process run computes BatchNorm statistics per half batch (`patch_half_batch_bn`),
which is what two processes without SyncBatchNorm compute (torch has no CPU SyncBatchNorm), and
takes its running statistics from the first half, as DDP broadcasts rank 0's. The learning rate is
small on purpose: YOLOv9-t from scratch at 64 px is chaotic in its first steps (in one process
alone, a 1e-7 relative change of the initial weights grows to 1e-2 in the weights after 4 SGD
steps at lr 0.01), so only a small step keeps float rounding at float rounding; see
docs/architecture.md, "Distributed training".
"""

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch
from testkit import (
    checkpoint_difference,
    checkpoints_close,
    children,
    cli_main,
    environ_of,
    patch_half_batch_bn,
    train_here,
)

ARGS = ["model=yolo9-t", "device=cpu", "workers=0", "imgsz=64", "batch=16", "epochs=2", "optimizer=sgd",
        "lr0=0.0001", "warmup_bias_lr=0.0001", "warmup_epochs=0", "nbs=32", "no_aug_epochs=1", "mixup=0.5",
        "save_period=1", "ddp_timeout=60",
        # The comparisons are of training. precise_bn's statistics (validation's only) of the EMA,
        # measured on two batches of 32 maps of 2x2 at stride 32, came 1.7e-3 of their size apart
        # between the runs where the running averages agree to 6e-5 (measured). Rank 0 alone measures,
        # as it alone validates; the measurement itself is tests/unit/test_precise_bn.py's.
        "precise_bn=0"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]


def _torchrun(args, cwd, timeout=300):
    env = {**os.environ, "LIBREYOLO_DEBUG": ""}
    return subprocess.run([*TORCHRUN, "-m", "libreyolo", "train", *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=timeout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, one_thread):
    """One 2-process torchrun run (cuda_graph and profile asked for) and its single-process reference."""
    from testkit import shapes_subset

    root = tmp_path_factory.mktemp("ddp")
    (root / "data").mkdir()
    common = [*ARGS, f"data={shapes_subset(root / 'data', 64)}", f"project={root / 'runs'}"]
    t0 = time.perf_counter()
    ddp = _torchrun([*common, "name=ddp", "cuda_graph=true", "profile=true"], cwd=root)
    seconds = time.perf_counter() - t0
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    return {"root": root, "common": common, "ddp": ddp, "seconds": seconds}


@pytest.fixture(scope="module")
def reference(runs):
    mp = pytest.MonkeyPatch()
    try:
        patch_half_batch_bn(mp)
        return train_here([*runs["common"], "name=ref"])
    finally:
        mp.undo()


def test_two_processes_write_once_and_say_each_notice_once(runs):
    ddp, root = runs["ddp"], runs["root"]
    assert [p.name for p in (root / "runs").iterdir()] == ["ddp"]  # rank 0 made the one run directory
    run = root / "runs" / "ddp"
    assert sorted(p.name for p in (run / "weights").iterdir()) == ["best.pt", "epoch1.pt", "epoch2.pt", "last.pt"]
    files = sorted(p.name for p in run.iterdir())
    events = [f for f in files if f.startswith("events.out.tfevents.")]  # TensorBoard, where it is installed
    assert len(events) == (1 if importlib.util.find_spec("tensorboard") else 0)  # rank 0's alone
    assert [f for f in files if f not in events] == ["args.yaml", "results.csv", "results.html", "timings.json",
                                                     "weights"]
    rows = (run / "results.csv").read_text().splitlines()
    assert [r.split(",")[0] for r in rows] == ["epoch", "1", "2"]  # one row per epoch, by rank 0 alone
    assert ddp.stdout.splitlines() == [str(run / "weights" / "best.pt")]  # rank 0 prints the result
    err = ddp.stderr.splitlines()
    assert "Traceback" not in ddp.stderr
    for line in ("cuda_graph=true: not available under multi-GPU training (2 processes); training eager",
                 "profile=true: not available under multi-GPU training (2 processes); training without the "
                 "profiler (profile a single-process run)"):
        assert err.count(line) == 1, ddp.stderr
    assert sum(ln.startswith("training YOLOv9-t") for ln in err) == 1
    assert any("on 2 processes (gloo; cpu on rank 0), 8 images each of every batch of 16" in ln for ln in err)
    assert [ln.split()[1] for ln in err if ln.startswith("epoch ") and "/2 " in ln] == ["1/2", "2/2"]
    assert sum(ln.startswith("done: 2 epochs") for ln in err) == 1
    ckpt = torch.load(run / "weights" / "last.pt", map_location="cpu", weights_only=True)
    assert not any(k.startswith("module.") for k in ckpt["model"]) and len(ckpt["rng_ranks"]) == 2


def test_two_process_weights_equal_the_single_process_run(runs, reference):
    ddp = runs["root"] / "runs" / "ddp" / "weights" / "last.pt"
    weights, stats, update = checkpoint_difference(ddp, reference.last)
    print(f"2 processes vs 1: parameters {weights:.3g} apart, running statistics {stats:.3g}, parameter "
          f"updates {update:.3g} (torchrun run {runs['seconds']:.1f} s)")
    assert checkpoints_close(ddp, reference.last) is None
    ours = (runs["root"] / "runs" / "ddp" / "results.csv").read_text().splitlines()[1:]
    theirs = (reference.run_dir / "results.csv").read_text().splitlines()[1:]
    for a, b in zip(ours, theirs):  # the logged losses are the global batch's
        for x, y in list(zip(a.split(","), b.split(",")))[1:4]:
            assert float(x) == pytest.approx(float(y), rel=1e-4)


def test_checkpoints_resume_on_the_other_process_count(runs, reference):
    root = runs["root"]
    # A 2-process checkpoint resumes in one process...
    shutil.copytree(root / "runs" / "ddp", root / "runs" / "ddp_then_1")
    mp = pytest.MonkeyPatch()
    try:
        patch_half_batch_bn(mp)
        one = train_here([f"model={root / 'runs' / 'ddp_then_1' / 'weights' / 'epoch1.pt'}", "resume=true"])
    finally:
        mp.undo()
    assert checkpoints_close(one.last, root / "runs" / "ddp" / "weights" / "last.pt") is None
    # ...and a single-process checkpoint in two.
    shutil.copytree(reference.run_dir, root / "runs" / "ref_then_2")
    two = _torchrun([f"resume={root / 'runs' / 'ref_then_2' / 'weights' / 'epoch1.pt'}"], cwd=root)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "resuming from epoch 2/2" in two.stderr
    assert checkpoints_close(root / "runs" / "ref_then_2" / "weights" / "last.pt", reference.last) is None


KILL_BOUND_S = 60  # measured: about 2 s from the kill to the launcher's exit on this machine


def test_a_killed_rank_ends_the_run_with_one_line(runs):
    """The launcher `libreyolo train ... device=0,1` uses (engine/distributed.launch), on CPU: rank 1
    is killed mid-run; rank 0 says one line and the run exits non-zero within the bound."""
    root = runs["root"]
    args = [a for a in runs["common"] if not a.startswith("epochs=")] + ["epochs=200", "name=killed", "val=false"]
    code = "import sys; from libreyolo.engine.distributed import launch; sys.exit(launch(2, sys.argv[1:]))"
    proc = subprocess.Popen([sys.executable, "-c", code, "-m", "libreyolo", "train", *args], cwd=root,
                            env={**os.environ, "LIBREYOLO_DEBUG": ""}, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    try:
        deadline = time.time() + 240
        while not any(ln.startswith("epoch 2/200") for ln in lines):  # well inside the training loop
            assert proc.poll() is None and time.time() < deadline, "".join(lines)
            time.sleep(0.1)
        [rank1] = [p for p in children(proc.pid) if environ_of(p).get("RANK") == "1"]
        os.kill(rank1, signal.SIGKILL)
        t0 = time.perf_counter()
        proc.wait(timeout=KILL_BOUND_S)
        seconds = time.perf_counter() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=10)
    print(f"killed rank 1: the run ended {seconds:.1f} s later with exit code {proc.returncode}")
    assert proc.returncode != 0
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert len(errors) == 1, "".join(lines)
    assert errors[0].startswith("error: training stopped: ")
    assert "the last good state is" in errors[0] and "/killed/weights/last.pt" in errors[0]
    assert not any("Traceback" in ln for ln in lines), "".join(lines)


def test_other_ranks_keep_quiet_about_what_rank_0_says(monkeypatch, capsys):
    monkeypatch.setenv("RANK", "1")
    assert cli_main(["train", "model=yolo9-t", "data=no_such_dataset"]) == 2
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("RANK", "0")
    assert cli_main(["train", "model=yolo9-t", "data=no_such_dataset"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("error: ") and "no_such_dataset" in line
