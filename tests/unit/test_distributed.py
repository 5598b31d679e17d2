"""Multi-process training pieces (engine/distributed.py, the sampler's shards, device selection).

The gradient test runs two real gloo processes (torch.multiprocessing) on CPU; everything else is
in-process. The end-to-end torchrun runs are in tests/cli/test_ddp_cli.py.
"""

import os
import tempfile

import numpy as np
import pytest
import torch
from torch import nn

from libreyolo.data.loader import EpochBatchSampler, shard
from libreyolo.engine import distributed, elastic
from libreyolo.engine.device import device_list, select_device
from libreyolo.errors import ConfigError


# --- the sampler: rank r's share of each global batch, with the single process's keys -------------
@pytest.mark.parametrize("n, batch, world", [(37, 8, 2), (37, 9, 3), (40, 8, 2), (33, 8, 2), (10, 4, 4)])
def test_shards_put_together_are_the_single_process_batches(n, batch, world):
    def batches(rank, size):
        s = EpochBatchSampler(n, batch, seed=3, imgsz=64, multi_scale=True, rank=rank, world_size=size)
        s.epoch, s.mosaic, s.mixup = 2, 1.0, 0.5
        return len(s), list(s)

    n_single, single = batches(0, 1)
    per_rank = [batches(r, world) for r in range(world)]
    lengths = {length for length, _ in per_rank}
    assert len(lengths) == 1  # every rank steps the same number of times
    tail = n % batch
    dropped = 0 < tail < world  # a last batch with fewer images than ranks is left out
    assert lengths == {n_single - dropped}
    for step in range(n_single - dropped):
        joined = [key for _, keys in per_rank for key in keys[step]]
        assert joined == single[step]  # same images, order, epoch, mosaic/mixup, size and pool
        sizes = [len(keys[step]) for _, keys in per_rank]
        assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
        assert sum(sizes) == EpochBatchSampler(n, batch, 3, 64, True).global_size(step)


@pytest.mark.parametrize("n, batch, world", [(37, 8, 2), (40, 8, 4), (33, 9, 3)])
def test_an_epoch_shows_every_image_once_over_the_ranks_and_a_resume_goes_on_with_the_rest(n, batch, world):
    def keys(rank, start=0):
        s = EpochBatchSampler(n, batch, seed=5, imgsz=64, multi_scale=True, rank=rank, world_size=world)
        s.epoch, s.mosaic, s.start = 3, 1.0, start
        return list(s)

    shown = [k.index for r in range(world) for step in keys(r) for k in step]
    tail = n % batch
    left_out = tail if 0 < tail < world else 0  # the short last batch (fewer images than ranks)
    assert len(shown) == len(set(shown)) == n - left_out  # no image twice in an epoch
    for r in range(world):  # from a mid-epoch checkpoint after 2 batches: the epoch's own remaining batches
        assert keys(r, start=2) == keys(r)[2:]


def test_global_rank_not_local_rank_decides_the_writer_and_the_shard(monkeypatch):
    """Two nodes of one process each: both have LOCAL_RANK 0; the second is global rank 1."""
    from libreyolo.cli.common import process_rank

    for key, value in {"RANK": 1, "WORLD_SIZE": 2, "LOCAL_RANK": 0, "LOCAL_WORLD_SIZE": 1}.items():
        monkeypatch.setenv(key, str(value))
    w = distributed.world()
    assert (w.rank, w.size, w.local_rank, w.local_size, w.main, w.active) == (1, 2, 0, 1, False, True)
    assert process_rank() == 1  # it prints no error line of rank 0's
    assert select_device("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        assert select_device("auto") == torch.device("cpu")  # on a GPU node: cuda:LOCAL_RANK, its own device
    s = EpochBatchSampler(16, 8, seed=0, imgsz=64, multi_scale=False, rank=w.rank, world_size=w.size)
    assert [k.index for k in next(iter(s))] == [k.index for k in next(iter(EpochBatchSampler(16, 8, 0, 64, False)))][4:]


def test_shard_bounds_are_contiguous_and_cover_everything():
    for n in range(1, 20):
        for world in range(1, 6):
            bounds = [shard(n, r, world) for r in range(world)]
            assert bounds[0][0] == 0 and bounds[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))


def test_batch_must_split_evenly_over_the_processes():
    distributed.check_batch(16, distributed.World(0, 2))
    distributed.check_batch(15, distributed.World())  # one process: anything goes
    with pytest.raises(ConfigError, match=r"batch=15 is the global batch .* 2 processes \(e.g. batch=14: 7 per process\)"):
        distributed.check_batch(15, distributed.World(1, 2))


# --- device selection under torchrun ---------------------------------------------------------------
def _torchrun(monkeypatch, local_rank, local_size, size=None):
    monkeypatch.setenv("WORLD_SIZE", str(size or local_size))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_size))
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))
    monkeypatch.setenv("RANK", str(local_rank))


def test_device_lists_parse_and_refuse_duplicates():
    assert device_list("0,1") == [0, 1] and device_list("cuda:2, cuda:3") == [2, 3]
    assert device_list("cuda:0") is None and device_list("auto") is None
    for bad in ("0,0", "0,x", "0,"):
        with pytest.raises(ConfigError, match="distinct indices"):
            device_list(bad)


def test_a_gpu_list_outside_torchrun_says_how_to_run_it(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ConfigError, match=r"device=0,1 trains on 2 GPUs.*torchrun --nproc_per_node 2"):
        select_device("0,1")


def test_devices_under_torchrun(monkeypatch):
    _torchrun(monkeypatch, 1, 2)
    assert select_device("cpu") == torch.device("cpu")  # gloo processes
    if not torch.cuda.is_available():
        assert select_device("auto") == torch.device("cpu")
    with pytest.raises(ConfigError, match="names 3 GPUs but torchrun started 2 processes"):
        select_device("0,1,2")
    with pytest.raises(ConfigError, match="names one GPU but torchrun started 2 processes"):
        select_device("cuda:1")


def test_the_cli_launch_refuses_gpus_this_machine_lacks(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"device=0,1 asks for 2 GPUs but CUDA is not available here: .*"
                                          r"`torchrun --nproc_per_node 2 -m libreyolo train \.\.\. device=0,1`"):
        distributed.launch_for_devices("0,1", ["model=yolo9-t"])
    assert distributed.launch_for_devices("cpu", []) is None and distributed.launch_for_devices(None, []) is None
    _torchrun(monkeypatch, 0, 2)  # one of torchrun's processes trains; it never launches again
    assert distributed.launch_for_devices("0,1", []) is None


# --- failures: one line ----------------------------------------------------------------------------
GLOO = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error [127.0.0.1]:22912: "
        "Connection reset by peer. This is typically caused by a remote worker hanging or bugs in the application.")


def test_a_dead_peer_is_one_line_naming_the_last_good_state():
    w = distributed.World(0, 2)
    with pytest.raises(distributed.PeerFailure) as info:
        with distributed.failures_as_error(w, 30, lambda: "the last good state is runs/x/last.pt"):
            raise RuntimeError(GLOO)
    assert str(info.value) == ("training stopped: another process of this 2-process run ended or did not answer "
                               "within ddp_timeout=30 s (Read error [127.0.0.1]:22912: Connection reset by peer); "
                               "the last good state is runs/x/last.pt")
    with pytest.raises(ValueError):  # anything else is not dressed up as a peer failure
        with distributed.failures_as_error(w, 30, str):
            raise ValueError("a bug")
    with pytest.raises(RuntimeError, match="shape mismatch"):
        with distributed.failures_as_error(w, 30, str):
            raise RuntimeError("shape mismatch")


WATCHED = """
import os, sys
from libreyolo.engine import distributed as d
d._watch_sigterm(int(sys.argv[1]))
with d.failures_as_error(d.World(int(sys.argv[1]), 2), 30, lambda: "the last good state is runs/x/last.pt"):
    print("ready", flush=True)
    r, w = os.pipe()
    os.read(r, 1)  # blocked in C for good, like a CUDA sync on an NCCL kernel whose peer died
"""


@pytest.mark.parametrize("rank", [0, 1])
def test_torchruns_sigterm_ends_a_process_stuck_in_c_with_one_line_on_rank_0(rank):
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-c", WATCHED, str(rank)], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == "ready\n"
        t0 = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 2 and time.perf_counter() - t0 < 10
    expected = ("error: training stopped: this process was told to end (SIGTERM; under torchrun another process "
                "of the run failed or the run was interrupted); the last good state is runs/x/last.pt\n")
    assert err == (expected if rank == 0 else "")


# --- DDP over flat gradients: the single-process gradient, in the optimizer's flat tensors ---------
def _frozen_bn_model():
    from libreyolo.families import get_family

    torch.manual_seed(0)
    model = get_family("yolo9").build("t", 10).to(memory_format=torch.channels_last).train()
    for m in model.modules():  # per-image forward: the two-rank and one-process runs are then exact
        if isinstance(m, nn.BatchNorm2d):
            m.eval()
    return model


def _context(model, world_size):
    from libreyolo.config import build_config
    from libreyolo.engine.builder import build_step_context
    from libreyolo.families import get_family

    cfg = build_config({"optimizer": "sgd", "ema": False, "clip_grad": 0.0})
    ctx = build_step_context(cfg, get_family("yolo9"), model, torch.device("cpu"))
    captured = []
    # Record the flat gradients the optimizer is about to read, then step as usual.
    real_step = ctx.precision.step
    ctx.precision.step = lambda opt, params, clip: (captured.append([p.grad.clone() for p in params]),
                                                    real_step(opt, params, clip))
    return ctx, captured


def _micro_batches():
    from testkit import random_targets

    from libreyolo.data import Batch

    out = []
    for seed in (1, 2):
        g = torch.Generator().manual_seed(seed)
        images = torch.randint(0, 255, (4, 3, 64, 64), dtype=torch.uint8, generator=g)
        out.append(Batch(images, random_targets(g, 4, 8, 64, 10, [3, 0, 8, 1], min_wh=8.0)))
    return out


def _rank_grads(rank, world_size, init_file, out_file):
    import torch.distributed as dist

    from libreyolo.data import Batch
    from libreyolo.engine.step import train_step
    from libreyolo.families.base import Targets

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    model = _frozen_bn_model()
    ctx, captured = _context(model, world_size)
    ctx.ddp = distributed.wrap(model, torch.device("cpu"))
    ctx.criterion = distributed.GlobalLoss(ctx.criterion, world_size)
    flat = [p.grad for p in ctx.params]
    views = [p.grad for p in model.parameters()]
    lo, hi = shard(4, rank, world_size)
    local = None
    for update, b in zip((False, True), _micro_batches()):  # accumulation: no_sync, then the all-reduce
        part = Batch(b.images[lo:hi], Targets(*(t[lo:hi] for t in b.targets)))
        items = train_step(ctx, part, update)
        local = [g.clone() for g in flat] if local is None else local
    # DDP copied the all-reduced buckets into the very .grad views of the flat tensors.
    same_views = all(p.grad is v for p, v in zip(model.parameters(), views))
    inside = all(any(f.data_ptr() <= v.data_ptr() < f.data_ptr() + f.numel() * f.element_size() for f in flat)
                 for v in views)
    torch.save({"grads": captured[0], "local": local, "items": items, "views": same_views and inside},
               f"{out_file}.{rank}")
    dist.destroy_process_group()


def test_ddp_gradients_are_the_single_process_gradients_in_the_flat_tensors():
    import torch.multiprocessing as mp

    from libreyolo.engine.step import train_step

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "grads")
        mp.spawn(_rank_grads, args=(2, os.path.join(tmp, "init"), out), nprocs=2, join=True)
        ranks = [torch.load(f"{out}.{r}", weights_only=True) for r in range(2)]
    assert all(r["views"] for r in ranks)
    # The first micro-batch ran under no_sync: each rank still held its own gradients after it.
    assert not torch.allclose(ranks[0]["local"][0], ranks[1]["local"][0])

    model = _frozen_bn_model()
    ctx, captured = _context(model, 1)
    for update, b in zip((False, True), _micro_batches()):
        items = train_step(ctx, b, update)
    [ref] = captured
    for r in ranks:
        torch.testing.assert_close(r["items"], items, rtol=1e-5, atol=1e-6)  # global loss items on every rank
        for got, want in zip(r["grads"], ref):
            scale = want.abs().max()
            assert scale > 0 and (got - want).abs().max() <= 1e-5 * scale


def test_global_loss_refuses_a_loss_without_a_per_image_form():
    class Plain:
        item_names = ("loss",)

    with pytest.raises(ConfigError, match="no per-image form"):
        distributed.GlobalLoss(Plain(), 2)


def test_sync_batch_norm_says_why_not_on_cpu_and_keeps_checkpoint_keys(monkeypatch):
    from libreyolo.families import get_family

    model = get_family("yolo9").build("t", 10)
    keys = set(model.state_dict())
    same, line = distributed.sync_batch_norm(model, True, torch.device("cpu"), distributed.World(0, 2))
    assert same is model and "runs on CUDA devices only" in line
    assert distributed.sync_batch_norm(model, True, torch.device("cpu"), distributed.World()) == (model, None)
    # The conversion itself (CUDA in real runs) keeps the plain BatchNorm keys in the state dict.
    converted, line = distributed.sync_batch_norm(model, True, torch.device("cuda", 0), distributed.World(0, 2))
    assert any(isinstance(m, nn.SyncBatchNorm) for m in converted.modules())
    assert set(converted.state_dict()) == keys and "SyncBatchNorm over the 2 processes" in line
    assert np.all([m.num_batches_tracked is not None for m in converted.modules() if isinstance(m, nn.SyncBatchNorm)])


# --- elastic restarts: which run directory a restart of this job goes on in ------------------------
def _marked(folder, run_id, since, last=False):
    import json

    (folder / "weights").mkdir(parents=True)
    (folder / elastic.MARKER).write_text(json.dumps({"run_id": run_id, "since": since}))
    if last:
        (folder / "weights" / "last.pt").write_bytes(b"not read unless asked")


def test_a_restart_finds_this_jobs_newest_run_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "2")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job7")
    for key in ("WORLD_SIZE", "RANK"):
        monkeypatch.delenv(key, raising=False)
    _marked(tmp_path / "exp", "job7", 1.0, last=True)
    _marked(tmp_path / "exp2", "job7", 2.0)  # newer, no checkpoint yet
    _marked(tmp_path / "exp3", "job8", 3.0, last=True)  # another job's
    _marked(tmp_path / "other", "job7", 4.0, last=True)  # another name=
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert elastic.previous_attempt(str(tmp_path), "exp") == elastic.Attempt(tmp_path / "exp2", None)
    (tmp_path / "exp2" / elastic.MARKER).unlink()
    found = elastic.previous_attempt(str(tmp_path), "exp")  # a last.pt torch cannot read: resume says what is wrong
    assert found == elastic.Attempt(tmp_path / "exp", tmp_path / "exp" / "weights" / "last.pt", False, {})
    # A first start is no restart ...
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    assert elastic.previous_attempt(str(tmp_path), "exp").run_dir == tmp_path / "exp"  # ... unless its id names one
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")  # torchrun's default id names no job
    assert elastic.previous_attempt(str(tmp_path), "exp") is None
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "0")  # no restarts asked for: nothing is looked for or marked
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert elastic.previous_attempt(str(tmp_path), "exp") is None
    elastic.mark(tmp_path / "other")
    assert "job7" in (tmp_path / "other" / elastic.MARKER).read_text()

