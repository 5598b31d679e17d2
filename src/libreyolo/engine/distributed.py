"""Multi-GPU training: PyTorch's DistributedDataParallel, one process per device, under torchrun.

`torchrun --nproc_per_node N -m libreyolo train ...` starts N processes and tells each its RANK,
LOCAL_RANK and WORLD_SIZE; `libreyolo train ... device=0,1` starts them itself through torch's
elastic launcher (`launch`, what torchrun runs). Each process trains on its own device
(engine/device.py: cuda:LOCAL_RANK, or the LOCAL_RANK-th of device=a,b); `device=cpu` processes
talk over gloo, which is how the CPU tests run it. What changes under N processes, and why it is
the single-process run of the same global batch (docs/architecture.md, "Distributed training"):

- `batch` is the global batch. The sampler (data/loader.py) draws each global batch exactly as a
  single process does and hands rank r its contiguous share, with the batch's own keys (epoch,
  mosaic/mixup state, pool): every image gets the augmentation a single process gives it.
- The loss (`GlobalLoss`) is each rank's share of the single-process loss: its per-image sums over
  the *global* normaliser, times the global batch. The normaliser, the batch count and the loss
  items ride in one all-reduce of a few floats per step (device-side, no host sync), so every
  rank holds the same global loss items and the trainer's once-per-interval read-back needs no
  collective of its own. DDP averages gradients over ranks; the loss carries a factor N that the
  average divides back out, so the gradient is the single-process gradient.
- Gradients: DDP all-reduces `.grad` of every parameter in buckets during backward. Our
  parameters and their `.grad` are views of one flat tensor per optimizer group (optim.flatten);
  with `gradient_as_bucket_view=False` (torch's default, kept on purpose) DDP copies each
  gradient into its bucket and the all-reduced bucket back *into the existing `.grad` view*
  (`grad.copy_`), so the flat gradients the optimizer, unscaling and clipping read hold the
  all-reduced values. `gradient_as_bucket_view=True` would rebind `.grad` to DDP's buckets and
  leave the flat gradients stale: never set it. Accumulation micro-batches run under `no_sync`
  (engine/step.py); the last one all-reduces the sum.
- BatchNorm: per-rank statistics by default, rank 0's running statistics broadcast before each
  forward (DDP's `broadcast_buffers`). `sync_bn=true` (RTMDet's recipe) converts to torch's
  SyncBatchNorm, statistics over the global batch; torch has it for CUDA only.
- Rank 0 validates, writes checkpoints, results and logs; the others run no hooks and wait for it
  at the epoch-end broadcast of its decisions (trainer.py). Checkpoints hold the plain module, so
  they resume on any number of devices.
- A rank that dies or hangs: gloo/NCCL errors (`failures_as_error`) and torchrun's SIGTERM (a
  watcher thread, even while the main thread is stuck in C) become one line on rank 0;
  `ddp_timeout` bounds every wait in a collective.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import re
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..errors import ConfigError, LibreYOLOError

log = logging.getLogger("libreyolo")


@dataclass(frozen=True)
class World:
    """This process's place in the run, from torchrun's environment: (0, 1, 0, 1) alone."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1

    @property
    def active(self) -> bool:
        return self.size > 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name) or default)
    except ValueError:
        return default


def world() -> World:
    """The process group's view when one exists, else what torchrun put in the environment."""
    if dist.is_available() and dist.is_initialized():
        return World(dist.get_rank(), dist.get_world_size(), _env_int("LOCAL_RANK", 0),
                     _env_int("LOCAL_WORLD_SIZE", 1))
    size = _env_int("WORLD_SIZE", 1)
    if size <= 1:
        return World()
    return World(_env_int("RANK", 0), size, _env_int("LOCAL_RANK", 0), _env_int("LOCAL_WORLD_SIZE", size))


class PeerFailure(LibreYOLOError):
    """Another process of the run ended, or stopped answering within `ddp_timeout`."""


class GroupNotFormed(PeerFailure):
    """The process group did not form within `ddp_timeout`: a process of the run never came."""

    per_rank = True  # the missing one may be rank 0: every process that waited says it (cli/common.py)


def quiet_other_ranks(w: World | None = None) -> None:
    """Logs come from rank 0 only: every rank runs the same checks on the same inputs, and the
    progress, epoch lines and notices would otherwise appear N times."""
    if (w or world()).rank > 0:
        logging.getLogger("libreyolo").setLevel(logging.ERROR)


def check_batch(batch: int, w: World) -> None:
    """`batch` is the global batch; it must split evenly so every process steps the same load."""
    if w.active and batch % w.size:
        lower = max(w.size, batch // w.size * w.size)
        raise ConfigError(f"batch={batch} is the global batch and must split evenly over the {w.size} processes "
                          f"(e.g. batch={lower}: {lower // w.size} per process)")


# --- the process group ----------------------------------------------------------------------------
def join(cfg: Any, device: torch.device) -> World:
    """At a training command's start, under torchrun: the global batch must split over the
    processes (one line, before any process waits for another), then the process group, which
    waits at most `ddp_timeout` for every process: one that never comes is one line before
    anything is read or written."""
    w = world()
    check_batch(cfg.batch, w)
    if w.active:
        init(w, device, cfg.ddp_timeout)
    return w


_STATE: dict[str, Any] = {"owned": False, "handler": None, "wakeup": None, "pipe": None, "rank": 0,
                          "stopping": False, "last_good": None}
_SPEAK = threading.Lock()


def init(w: World, device: torch.device, timeout_s: float) -> str:
    """Join the process group (NCCL on CUDA, gloo on CPU) unless the caller's script already has;
    returns the backend. Joining waits at most `timeout_s` for every rank to arrive (torch's
    rendezvous on MASTER_ADDR:MASTER_PORT, which torchrun sets), and so does every collective."""
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        kwargs: dict[str, Any] = {"timeout": datetime.timedelta(seconds=float(timeout_s))}
        if device.type == "cuda":
            torch.cuda.set_device(device)
            kwargs["device_id"] = device  # NCCL binds its communicator to this device up front
        try:
            dist.init_process_group(backend, **kwargs)
        except (ValueError, RuntimeError) as exc:
            if isinstance(exc, RuntimeError) and is_peer_failure(exc):  # the store's wait ran out
                raise GroupNotFormed(f"the {w.size}-process group did not form within ddp_timeout={timeout_s:g} s "
                                     f"({_reason(exc)}): {_why_not_formed()}") from None
            raise ConfigError(f"cannot join the {w.size}-process group ({_reason(exc)}): start multi-process "
                              "training with torchrun (or libreyolo train ... device=0,1)") from None
        _STATE["owned"] = True
    _watch_sigterm(w.rank)
    return dist.get_backend()


def _why_not_formed() -> str:
    if _env_int("TORCHELASTIC_RESTART_COUNT", 0) > 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # engine/elastic.py, "torch's shared store"
        return ("torchrun restarted the run, and torch's shared rendezvous store can hand a restarted process the "
                "previous attempt's addresses (pytorch/pytorch#135712); start torchrun with "
                "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1")
    where = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    return (f"a process of the run (another node's?) never started or cannot reach {where}; start every node "
            "with the same rendezvous endpoint, or raise ddp_timeout")


def shutdown() -> None:
    """Leave the process group we joined (a caller's own group stays theirs)."""
    _unwatch_sigterm()
    if _STATE["owned"] and dist.is_initialized():
        dist.destroy_process_group()
    _STATE["owned"] = False


def _claim_the_line() -> bool:
    """True for the first caller only: one failure, one line, whoever sees it first."""
    with _SPEAK:
        if _STATE["stopping"]:
            return False
        _STATE["stopping"] = True
        return True


# torchrun's agent sends SIGTERM to the surviving processes when one fails (and when the run is
# interrupted). A Python signal handler runs only when the main thread returns to the interpreter,
# and a process whose peer died may be blocked in C for good (a CUDA sync waiting on an NCCL
# kernel that never ends). So the handler does nothing itself; Python's C-level handler writes
# the signal number to the wakeup fd at delivery, and a watcher thread (the GIL is free while the
# main thread waits in C) says the one line and ends the process.
def _watch_sigterm(rank: int) -> None:
    if _STATE["handler"] is not None or threading.current_thread() is not threading.main_thread():
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    _STATE.update(rank=rank, stopping=False, pipe=(read_fd, write_fd))
    _STATE["handler"] = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    _STATE["wakeup"] = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    threading.Thread(target=_watcher, args=(read_fd,), name="libreyolo-sigterm", daemon=True).start()


def _unwatch_sigterm() -> None:
    if _STATE["handler"] is None or threading.current_thread() is not threading.main_thread():
        return
    signal.set_wakeup_fd(_STATE["wakeup"])
    signal.signal(signal.SIGTERM, _STATE["handler"])
    _STATE["handler"] = None
    os.close(_STATE["pipe"][1])  # the watcher's read ends: it returns


def _watcher(read_fd: int) -> None:
    while True:
        try:
            data = os.read(read_fd, 64)
        except OSError:
            return
        if not data:
            os.close(read_fd)
            return
        if signal.SIGTERM in data and _claim_the_line():
            if _STATE["rank"] == 0:  # the others' ends are rank 0's news
                last_good = _STATE["last_good"]
                print("error: training stopped: this process was told to end (SIGTERM; under torchrun another "
                      "process of the run failed or the run was interrupted)"
                      + (f"; {last_good()}" if last_good else ""), file=sys.stderr, flush=True)
            os._exit(2)  # a checkpoint write cut short leaves a temp file the next run removes


_PEER_MARKERS = ("gloo", "nccl", "connection reset", "connection closed", "closed by peer", "timed out",
                 "timeout", "broken pipe", "processgroup", "socket", "watchdog")


def is_peer_failure(exc: BaseException) -> bool:
    if isinstance(exc, dist.DistError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(m in text for m in _PEER_MARKERS)


def _reason(exc: BaseException, limit: int = 140) -> str:
    """A gloo/NCCL message as a short clause: no source location, no advice paragraph."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    text = re.sub(r"^\[[^\]]*\]\s*", "", text).split(". This is typically")[0].rstrip(". ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


@contextlib.contextmanager
def failures_as_error(w: World, timeout_s: float, last_good: Callable[[], str]) -> Iterator[None]:
    """Around the training loop: a dead or hung peer is one line naming the last good checkpoint
    instead of a traceback or a hang (torchrun's SIGTERM is the watcher thread's same line)."""
    if not w.active:
        yield
        return
    _STATE["last_good"] = last_good
    try:
        yield
    except RuntimeError as exc:
        if not is_peer_failure(exc):
            raise
        if not _claim_the_line():
            time.sleep(30)  # the SIGTERM watcher is saying it and ending the process
        raise PeerFailure(f"training stopped: another process of this {w.size}-process run ended or did not "
                          f"answer within ddp_timeout={timeout_s:g} s ({_reason(exc)}); {last_good()}") from None
    finally:
        _STATE["last_good"] = None


# --- the model and the loss -----------------------------------------------------------------------
class _TrainForward(nn.Module):
    """What the step runs forward, as one module for DDP to wrap: every parameter the training
    forward uses is inside DDP's forward, whatever part of it a family makes `capturable`."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor, targets: Any) -> Any:
        return self.model.forward_train(self.model.capturable(images), targets)


def wrap(model: nn.Module, device: torch.device) -> nn.parallel.DistributedDataParallel:
    """DDP around the training forward of `model`, built after the optimizer flattened the
    parameters (DDP hooks the views the optimizer's flat tensors hold)."""
    # Left at torch's defaults on purpose, named here because the design depends on them:
    # buffers are synced from rank 0 before every forward (BatchNorm running statistics; the
    # keyword is `broadcast_buffers` before torch 2.14, `forward_sync_buffers` from it), and
    # gradient_as_bucket_view=False copies the all-reduced buckets into our flat .grad views.
    return nn.parallel.DistributedDataParallel(
        _TrainForward(model), device_ids=[device.index] if device.type == "cuda" else None,
        gradient_as_bucket_view=False)


class GlobalLoss:
    """This rank's share of the single-process loss of the global batch.

    A family loss is `B * sum_i raw_i / max(sum_i norm_i, 1)` over the batch (PerImageLoss). With
    the batch split over N ranks, rank r returns `N * B * sum_{i in r} raw_i / max(sum_i norm_i, 1)`
    with B and the normaliser summed over every rank: DDP's gradient average (sum / N) is then the
    single-process gradient exactly. The normaliser is a constant of the assigners' detached
    targets in every family, so no gradient flows through it in either form. One all-reduce of
    K + 2 floats per step also makes the loss items global on every rank."""

    def __init__(self, criterion: Any, world_size: int):
        if not callable(getattr(criterion, "per_image", None)):
            raise ConfigError(f"{type(criterion).__name__} has no per-image form (per_image): multi-GPU "
                              "training needs it to normalise over the global batch")
        self.criterion, self.world_size = criterion, int(world_size)
        self.item_names = criterion.item_names

    def __getattr__(self, name: str) -> Any:  # the family loss's other attributes
        if name == "criterion":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.criterion, name)

    def __call__(self, preds: tuple[torch.Tensor, ...], targets: Any) -> tuple[torch.Tensor, torch.Tensor]:
        raw, norm = self.criterion.per_image(preds, targets)  # [b, K] with grad, [b]
        k = raw.shape[1]
        stats = torch.cat((raw.detach().sum(0), norm.detach().to(raw.dtype).sum().reshape(1),
                           raw.new_full((1,), raw.shape[0])))
        dist.all_reduce(stats)  # sums over ranks; the device waits for it, the host does not
        denom = stats[k].clamp(min=1)
        loss = raw.sum() * (stats[k + 1] * self.world_size / denom)
        return loss, stats[:k] / denom


def sync_batch_norm(model: nn.Module, enabled: bool, device: torch.device, w: World) -> tuple[nn.Module, str | None]:
    """torch's SyncBatchNorm in place of every BatchNorm when `sync_bn` (and a line when it cannot)."""
    if not enabled or not w.active:
        return model, None
    if device.type != "cuda":
        return model, (f"sync_bn=true: torch's SyncBatchNorm runs on CUDA devices only; on {device.type} each "
                       "process normalises over its own share of the batch")
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    for m in model.modules():
        if isinstance(m, nn.SyncBatchNorm) and m.track_running_stats and m.num_batches_tracked is None:
            # SyncBatchNorm insists on the counter that drop_batch_counters_ removed; as a
            # non-persistent buffer it stays out of checkpoints, which keep the plain keys.
            m.register_buffer("num_batches_tracked", torch.zeros((), dtype=torch.long, device=m.weight.device),
                              persistent=False)
            m.register_load_state_dict_pre_hook(_drop_counter_key)
    return model, f"sync_bn=true: SyncBatchNorm over the {w.size} processes' global batch"


def _drop_counter_key(module: nn.Module, state_dict: dict, prefix: str, *_) -> None:
    state_dict.pop(prefix + "num_batches_tracked", None)  # older checkpoints carry the counter


# --- collectives the trainer uses once per epoch --------------------------------------------------
def broadcast_object(obj: Any) -> Any:
    """Rank 0's `obj` on every rank (the others wait here until rank 0 arrives)."""
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def from_rank0(read: Callable[[], Any]) -> Any:
    """`read()` on rank 0 only, its result on every rank: what only rank 0 may read (the run
    directory, which other nodes need not see). A LibreYOLOError it raises is raised on every rank
    (rank 0 alone prints it)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return read()
    outcome: tuple[Any, LibreYOLOError | None] = (None, None)
    if dist.get_rank() == 0:
        try:
            outcome = (read(), None)
        except LibreYOLOError as exc:
            outcome = (None, exc)
    value, error = broadcast_object(outcome)
    if error is not None:
        raise error
    return value


def gather_object(obj: Any) -> list[Any] | None:
    """Every rank's `obj`, in rank order, on rank 0; None elsewhere."""
    out = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out


# --- starting the processes -----------------------------------------------------------------------
def launch_for_devices(device: Any, argv: list[str]) -> int | None:
    """`libreyolo train ... device=0,1`: run this command as one process per listed GPU under
    torch's elastic launcher and return its exit code; None when this process should train itself
    (one device, or already one of torchrun's processes)."""
    from .device import device_list

    ids = device_list(device) if isinstance(device, str) else None
    if ids is None or world().active or "TORCHELASTIC_RUN_ID" in os.environ:
        return None
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if have < len(ids) or max(ids) >= have:
        found = "CUDA is not available here" if not have else f"this machine has {have} ({', '.join(map(str, range(have)))})"
        raise ConfigError(f"device={device} asks for {len(ids)} GPUs but {found}: on a machine with them this "
                          f"command starts one process per GPU itself, or run it as `torchrun --nproc_per_node "
                          f"{len(ids)} -m libreyolo train ... device={device}`")
    return launch(len(ids), ["-m", "libreyolo", "train", *argv])


def launch(nproc: int, args: list[str]) -> int:
    """`python ARGS` as `nproc` processes on this machine, as `torchrun --standalone` starts them;
    the exit code. The processes print their own lines (rank 0's error line when one fails); the
    launcher adds one only when rank 0 itself was killed, and keeps torch's agent logs quiet."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    os.environ.setdefault("OMP_NUM_THREADS", "1")  # as torchrun: N processes must not each take every core
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=f"libreyolo-{uuid.uuid4().hex[:12]}",
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0, monitor_interval=0.1,
                          start_method="spawn")
    agent_log = logging.getLogger("torch.distributed.elastic")
    level = agent_log.level
    agent_log.setLevel(logging.CRITICAL)
    try:
        elastic_launch(config, sys.executable)(*args)
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        if rank == 0 and failure.exitcode < 0:
            print(f"error: rank 0 ended with {failure.signal_name()}; the run stopped", file=sys.stderr)
        return failure.exitcode if failure.exitcode > 0 else 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        agent_log.setLevel(level)
    return 0
