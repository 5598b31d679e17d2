"""An elastic restart on two GPUs over NCCL: a killed process, torchrun's restart, the resume by itself.

tests/cli/test_elastic_cli.py runs the same on CPU processes over gloo (two nodes, the single-process
equality, a mid-epoch resume that is exact bit for bit). What only CUDA has is checked here: the
process group joined over NCCL before the data are read, rank 0's checkpoint broadcast to the other
GPU's process, the float16 loss scaler and the deferred loss read-back carried through a mid-epoch
checkpoint. The restarted run is held to an uninterrupted two-GPU run of the same command.
"""

import csv
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from testkit import checkpoint_difference, children, environ_of, shapes_subset

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")]

# 3 epochs of 12 steps at 320 px, float16 with its loss scaler, deterministic kernels so that two
# runs of the same command can be compared closely; last.pt after every optimizer step.
ARGS = ["model=yolo9-t", "imgsz=320", "batch=16", "epochs=3", "workers=2", "amp_dtype=float16", "deterministic=true",
        "val=false", "tensorboard=false", "checkpoint_steps=1", "ddp_timeout=120", "no_aug_epochs=1"]


def _torchrun(cwd: Path, args: list[str], restarts: int) -> subprocess.Popen:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "--max-restarts", str(restarts), "--monitor-interval", "0.1", "-m", "libreyolo", "train", *args]
    env = {**os.environ, "LIBREYOLO_DEBUG": "", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    return subprocess.Popen(command, cwd=cwd, env=env, text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def test_a_killed_gpu_process_restarts_and_the_run_goes_on_by_itself(tmp_path):
    (tmp_path / "data").mkdir()
    args = [*ARGS, f"data={shapes_subset(tmp_path / 'data', 192)}", f"project={tmp_path / 'runs'}"]
    plain = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                            "-m", "libreyolo", "train", *args, "name=plain"], cwd=tmp_path, text=True,
                           capture_output=True, timeout=600, env={**os.environ, "LIBREYOLO_DEBUG": ""})
    assert plain.returncode == 0, plain.stderr[-3000:]

    proc = _torchrun(tmp_path, [*args, "name=killed"], restarts=1)
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)
    reader.start()
    last = tmp_path / "runs" / "killed" / "weights" / "last.pt"
    try:
        deadline = time.time() + 400
        while True:  # until epoch 1's end is saved: the kill then lands in epoch 2
            try:
                ckpt = torch.load(last, weights_only=True, mmap=True)
                if ckpt["step"] is None or ckpt["epoch"] >= 1:
                    break
            except Exception:
                pass
            assert proc.poll() is None and time.time() < deadline, "".join(err[-30:])
            time.sleep(0.02)
        [rank1] = [p for p in children(proc.pid) if environ_of(p).get("RANK") == "1"]
        os.kill(rank1, signal.SIGKILL)
        proc.wait(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(timeout=10)
    text = "".join(err)
    assert proc.returncode == 0, text[-4000:]
    assert text.count("torchrun restarted the run (restart 1)") == 1, text[-4000:]
    [resumed] = [ln for ln in err if ln.startswith("resuming from epoch ")]
    print(f"restart: {resumed.strip()}")
    run = tmp_path / "runs" / "killed"
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["killed", "plain"]
    with (run / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["epoch"] for r in rows] == ["1", "2", "3"]
    weights, stats, update = checkpoint_difference(run / "weights" / "last.pt",
                                                   tmp_path / "runs" / "plain" / "weights" / "last.pt")
    print(f"restarted against uninterrupted: parameters {weights:.3g} apart, running statistics {stats:.3g}, "
          f"updates {update:.3g}")
    assert weights < 1e-5 and stats < 1e-3 and update < 1e-2
    a = torch.load(run / "weights" / "last.pt", weights_only=True)
    b = torch.load(tmp_path / "runs" / "plain" / "weights" / "last.pt", weights_only=True)
    assert a["precision"] == b["precision"]  # the loss scaler's scale and growth tracker went on alike
