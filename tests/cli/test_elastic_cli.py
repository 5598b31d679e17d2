"""Scale-out end to end on CPU: two torchrun "nodes" on loopback, elastic restarts, mid-epoch checkpoints.

The two-node run is two torchrun agents (`--nnodes 2 --nproc_per_node 1`, c10d rendezvous on
127.0.0.1), each in its own working directory with a relative `project=`, as two machines that
share no filesystem: both processes have LOCAL_RANK 0, and only global rank 0 may write. The run
asks for restarts (`--max-restarts 2`, `checkpoint_steps=1`); the test kills the other node's
process with SIGKILL in the middle of epoch 2, both agents start the group again, and the run
must go on from the mid-epoch last.pt by itself: the same run directory, one row per epoch, and
weights equal to the single-process run within the tolerance of tests/cli/test_ddp_cli.py (the
single-process reference computes BatchNorm per half batch, as two processes do). The reference
run also checks, in this process, that a mid-epoch checkpoint resumes to the identical weights.

torchrun runs with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: torch's agent-shared store can hand a
restarted process the previous attempt's addresses (engine/elastic.py, "torch's shared store").
"""

import contextlib
import csv
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from testkit import (
    checkpoint_difference,
    checkpoints_close,
    children,
    cli_main,
    environ_of,
    patch_half_batch_bn,
    shapes_subset,
    train_here,
)

from libreyolo.engine import hooks

# 48 images, batch 8: 6 batches an epoch, an optimizer step every 2 after a half-epoch warmup
# that ramps the accumulation; mosaic in epoch 1 only. The small learning rate keeps float
# rounding at rounding (docs/architecture.md, "Equality, and its tolerance").
ARGS = ["model=yolo9-t", "device=cpu", "workers=0", "imgsz=64", "batch=8", "epochs=2", "optimizer=sgd",
        "lr0=0.0001", "warmup_bias_lr=0.0001", "warmup_epochs=0.5", "nbs=16", "no_aug_epochs=1", "val=false",
        "tensorboard=false", "checkpoint_steps=1", "ddp_timeout=60"]


class _KeepMidEpoch(hooks.Hook):
    """Copies the first mid-epoch last.pt of epoch 1 after step 2 (warmup, mosaic, accumulation)."""

    def __init__(self, to: Path):
        self.to = to

    def after_step(self, trainer):
        if trainer.epoch == 0 and trainer.checkpoint_step == 2:
            trainer.checkpoints.wait()
            shutil.copy(trainer.run_dir / "weights" / "last.pt", self.to)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, one_thread):
    """The single-process run of the same global batch, and the mid-epoch checkpoint it wrote."""
    root = tmp_path_factory.mktemp("elastic")
    (root / "data").mkdir()
    common = [*ARGS, f"data={shapes_subset(root / 'data', 48)}"]
    mp = pytest.MonkeyPatch()
    try:
        patch_half_batch_bn(mp)
        result = train_here([*common, f"project={root / 'ref'}"], hooks=[_KeepMidEpoch(root / "mid.pt")])
    finally:
        mp.undo()
    return {"root": root, "common": common, "result": result, "mid": root / "mid.pt"}


def _rows(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "results.csv").open() as f:
        return list(csv.DictReader(f))


def test_a_mid_epoch_checkpoint_resumes_to_the_uninterrupted_weights(reference):
    ref = reference["result"]
    mid = torch.load(reference["mid"], weights_only=True)
    assert (mid["epoch"], mid["step"], mid["updates"]) == (0, 2, 2) and mid["losses"]["count"] == 2
    copy = reference["root"] / "resumed"
    shutil.copytree(ref.run_dir, copy)
    shutil.copy(reference["mid"], copy / "weights" / "last.pt")
    mp = pytest.MonkeyPatch()
    try:
        patch_half_batch_bn(mp)
        resumed = train_here([f"model={copy / 'weights' / 'last.pt'}", "resume=true"])
    finally:
        mp.undo()
    a, b = (torch.load(p, weights_only=True) for p in (ref.last, resumed.last))
    for part in ("model", "ema"):  # sampler position, schedule, accumulation, EMA, RNG: all exact
        assert all(torch.equal(a[part][k], b[part][k]) for k in a[part]), part
    assert a["ema_updates"] == b["ema_updates"] and a["updates"] == b["updates"]
    drop = ("seconds",)
    assert [{k: v for k, v in r.items() if k not in drop} for r in _rows(resumed.run_dir)] == \
           [{k: v for k, v in r.items() if k not in drop} for r in _rows(ref.run_dir)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Node:
    """One torchrun agent ("node") in its own working directory, its output read as it comes."""

    def __init__(self, cwd: Path, port: int, args: list[str]):
        cwd.mkdir(parents=True)
        self.cwd = cwd
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
                   "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "elastic-test",
                   "--max-restarts", "2", "--monitor-interval", "0.1", "-m", "libreyolo", "train", *args]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "LIBREYOLO_DEBUG": "", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
        self.proc = subprocess.Popen(command, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        self.out: list[str] = []
        self.err: list[str] = []
        self.readers = [threading.Thread(target=lambda s=s, d=d: d.extend(s), daemon=True)
                        for s, d in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]
        for reader in self.readers:
            reader.start()

    def worker(self) -> int | None:
        """The pid of the training process this agent runs now, if it has one."""
        pids = [p for p in children(self.proc.pid) if "RANK" in environ_of(p)]
        return pids[0] if pids else None

    def last(self) -> Path:
        return self.cwd / "runs" / "exp" / "weights" / "last.pt"

    def finish(self, timeout: float) -> None:
        try:
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            for reader in self.readers:
                reader.join(timeout=10)


def _position(last: Path) -> tuple[int, int]:
    """(epochs done, steps of the next epoch done) by a last.pt: (0, 0) while there is none. A
    mid-epoch checkpoint holds its epoch's index and `step`; one at an epoch's end, `step` None."""
    try:
        ckpt = torch.load(last, weights_only=True, mmap=True)
    except Exception:  # not there yet
        return 0, 0
    return (ckpt["epoch"], ckpt["step"]) if ckpt["step"] else (ckpt["epoch"] + 1, 0)


def _kill_mid_epoch_2(nodes: list[_Node]) -> tuple[_Node, _Node] | None:
    """Run the two nodes into epoch 2 and kill the other node's worker after a step of it that
    global rank 0 saved: (main, other). The victim is stopped (SIGSTOP) as soon as epoch 1 has
    ended, so the run cannot pass its next all-reduce while this process looks, and is then let
    on in short slices until rank 0 has saved a step of epoch 2. None when the race was lost
    anyway (a loaded machine can starve this process through all of epoch 2)."""
    deadline = time.time() + 300
    while True:  # until the first checkpoint: the training loop runs, with both workers
        lasts = [n for n in nodes if n.last().is_file()]
        if lasts:
            break
        assert all(n.proc.poll() is None for n in nodes) and time.time() < deadline, \
            "".join(nodes[0].err[-30:] + nodes[1].err[-30:])
        time.sleep(0.1)
    [main] = lasts
    [other] = [n for n in nodes if n is not main]
    victim = other.worker()  # global rank 1, LOCAL_RANK 0 on its node; found before the window opens
    # Until epoch 1's line: reading last.pt is too slow to poll (0.3-1 s a load on a busy machine,
    # against 2-3 s an epoch); the line is logged right after the epoch's checkpoint was handed over.
    while not any(ln.startswith("epoch 1/2 ") and "steps (" not in ln for ln in main.err):
        assert main.proc.poll() is None and time.time() < deadline, "".join(main.err[-30:])
        time.sleep(0.02)
    killed = False
    try:
        os.kill(victim, signal.SIGSTOP)
        while True:
            time.sleep(0.5)  # rank 0 finishes its step and its checkpoint, then waits at the all-reduce
            # (1, 0) or below: epoch 1's last.pt not yet on disk, or no step of epoch 2 saved yet.
            at = _position(main.last())
            if at > (1, 0) or any(ln.startswith("done: ") for ln in main.err):
                break
            assert time.time() < deadline, "".join(main.err[-30:])
            os.kill(victim, signal.SIGCONT)  # a slice: about a step
            time.sleep(0.05)
            os.kill(victim, signal.SIGSTOP)
        if at[0] != 1 or any(ln.startswith("done: ") for ln in main.err):
            return None  # epoch 2 ended before the victim was stopped
        os.kill(victim, signal.SIGKILL)
        killed = True
        return main, other
    except ProcessLookupError:  # its run had already ended
        return None
    finally:
        if not killed:  # never leave it stopped: torch starts workers in a session of their own
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGCONT)


def test_two_nodes_restarted_after_a_kill_resume_by_themselves(reference, tmp_path):
    args = [*reference["common"], "project=runs"]
    t0 = time.perf_counter()
    for attempt in range(3):
        port = _free_port()
        nodes = [_Node(tmp_path / f"try{attempt}" / f"node{i}", port, args) for i in range(2)]
        try:
            killed = _kill_mid_epoch_2(nodes)
            for node in nodes:
                node.finish(timeout=300)
        finally:
            for node in nodes:
                if node.proc.poll() is None:
                    for pid in children(node.proc.pid):  # its workers: a session of their own
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
                    node.proc.kill()
        if killed is not None:
            break
        print(f"attempt {attempt + 1}: the run passed epoch 2 before the kill; again")
    else:
        pytest.fail("three runs in a row passed epoch 2 before this process could stop them")
    main, other = killed
    print(f"two nodes, killed and restarted: {time.perf_counter() - t0:.1f} s")
    err = "".join(main.err)
    assert [n.proc.returncode for n in nodes] == [0, 0], err[-4000:] + "".join(other.err)[-3000:]
    # One writer: global rank 0's node holds the run directory; the other node wrote nothing at
    # all, and said nothing of its own.
    assert list(other.cwd.iterdir()) == []
    assert [p.name for p in (main.cwd / "runs").iterdir()] == ["exp"]  # the restart went on in the same one
    run = main.cwd / "runs" / "exp"
    printed = [(main.cwd / line.strip()).resolve() for line in main.out]  # the resume's path, as typed or absolute
    assert printed == [run.resolve() / "weights" / "last.pt"] and other.out == []
    assert not any(ln.startswith("error:") or ln.startswith("training ") for ln in other.err)
    # The failed attempt's line names the mid-epoch state; the restart resumes from it by itself.
    assert "(epoch 2, after its step" in err and "Traceback" not in err
    assert err.count("torchrun restarted the run (restart ") == 1
    assert err.count("resuming from epoch 2/2, step ") == 1
    rows = _rows(run)
    assert [r["epoch"] for r in rows] == ["1", "2"]  # each epoch once
    assert sum(ln.startswith("done: ") for ln in main.err) == 1
    # The sharding, the loss over the global batch and the resume together: the single process's run.
    weights, stats, update = checkpoint_difference(run / "weights" / "last.pt", reference["result"].last)
    print(f"against one process: parameters {weights:.3g} apart, running statistics {stats:.3g}, updates {update:.3g}")
    # Against the single process, two processes with these settings land 2.5e-6 / 1.04e-3 / 9.95e-3
    # apart, killed and restarted or not (2-core machine, 2026-12-04). That is float rounding (the
    # all-reduce's order, convolutions over 4 images instead of 8) compounded by the optimizer steps:
    # the runs are bit-identical after step 1, and the relative update difference grows 2-3x a step
    # (1e-5, 8e-4, ..., 4e-3 after step 6, 1e-2 after step 7). These settings take 7 steps (48
    # images, batch 8, the accumulation ramp), test_ddp_cli's 4, hence its 1.5e-7 / 8e-5 / 9e-4; its
    # batch over 7 steps (96 images) lands at 5e-6 / 3e-4 / 1e-2. Ruled out by measurement: the data,
    # the sharding, the loss normaliser, per-process BatchNorm (the reference normalises per half
    # batch too), the launch, the restart and sync_bn. The value sat at the old 1e-3 bound, so any
    # other rounding source moves it past; the bounds leave it 2.5x room and still catch a missing
    # factor or an unreduced gradient (137 % in the updates).
    problem = checkpoints_close(run / "weights" / "last.pt", reference["result"].last, max_stat=2.5e-3,
                                max_update=2.5e-2)
    assert problem is None, problem
    # The logged losses are the global batch's. Measured: within 1.3e-4 of the single process's
    # (epoch 2, where the box loss jumps as mosaic closes; an uninterrupted two-process run logs
    # the same digits as this restarted one).
    for ours, theirs in zip(rows, _rows(reference["result"].run_dir)):
        for key in ("train/box", "train/cls", "train/dfl", "lr"):
            assert float(ours[key]) == pytest.approx(float(theirs[key]), rel=1e-3)


# --- bad input: one line, exit code 2, nothing written ----------------------------------------------
def _as_rank(monkeypatch, rank: int, size: int, port: int | None = None) -> None:
    """This process as torchrun's process `rank` of `size`, one per node."""
    for key, value in {"RANK": rank, "WORLD_SIZE": size, "LOCAL_RANK": 0, "LOCAL_WORLD_SIZE": 1}.items():
        monkeypatch.setenv(key, str(value))
    if port is not None:
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", str(port))


def test_a_rendezvous_the_other_node_never_joins_is_one_line_within_ddp_timeout(reference, tmp_path, monkeypatch,
                                                                                 capsys):
    _as_rank(monkeypatch, 0, 2, _free_port())  # rank 1 never starts
    t0 = time.perf_counter()
    args = [a for a in reference["common"] if not a.startswith("ddp_timeout=")]
    code = cli_main(["train", *args, "ddp_timeout=2", f"project={tmp_path / 'runs'}"])
    seconds = time.perf_counter() - t0
    [line] = capsys.readouterr().err.splitlines()
    print(f"rendezvous without its other node: exit {code} after {seconds:.1f} s")
    assert code == 2 and seconds < 2 + 10
    assert line.startswith("error: the 2-process group did not form within ddp_timeout=2 s (")
    assert "never started or cannot reach 127.0.0.1:" in line
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("rank", [0, 1])
def test_a_world_size_that_does_not_divide_the_batch_is_one_line_before_anything(reference, tmp_path, monkeypatch,
                                                                                   capsys, rank):
    _as_rank(monkeypatch, rank, 3)  # no rendezvous address: a process that got to it would fail otherwise
    code = cli_main(["train", *reference["common"], f"project={tmp_path / 'runs'}"])
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and not (tmp_path / "runs").exists()
    assert err == ([] if rank else ["error: batch=8 is the global batch and must split evenly over the 3 processes "
                                    "(e.g. batch=6: 2 per process)"])
