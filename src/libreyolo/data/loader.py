"""Loaders: batches in the dense, padded format the trainer consumes.

`Batch.images` is uint8 [B, 3, S, S] (4x fewer bytes to move host-to-device than float; the step
does `.float() / 255` on the GPU). `Batch.targets` is `families.base.Targets` with
M = max boxes in the batch rounded up to a multiple of 8 (at least 8), so assigners see few
distinct shapes. One Batch type serves both loaders: the four mapping fields are None for
training batches and filled for validation batches (letterboxed box -> original pixels:
`x_orig = (x - pads[:, 0]) / ratios`, likewise y with pads[:, 1]).
"""

from __future__ import annotations

import logging
import math
import os
import random
import signal
from dataclasses import replace
from typing import NamedTuple

import numpy as np
import torch
from torchvision.transforms.v2 import functional as TF

from ..families.base import Targets
from ..logs import counted
from .dataset import AUG_KEYS, SampleKey, TrainDataset, ValDataset
from .dataset_yaml import DataConfig
from .labels import Split, scan_split

log = logging.getLogger("libreyolo")


class Batch(NamedTuple):
    images: torch.Tensor  # uint8 [B, 3, S, S]
    targets: Targets
    image_ids: torch.Tensor | None = None  # int64 [B], index into the val split
    orig_sizes: torch.Tensor | None = None  # float32 [B, 2] (h, w) of the original images
    ratios: torch.Tensor | None = None  # float32 [B], letterbox scale
    pads: torch.Tensor | None = None  # float32 [B, 2] (left, top) letterbox padding

    def to(self, device, non_blocking: bool = False) -> Batch:
        def move(t):
            return None if t is None else t.to(device, non_blocking=non_blocking)

        return Batch(move(self.images), self.targets.to(device, non_blocking), *map(move, self[2:]))


def pad_targets(boxes: list[np.ndarray], labels: list[np.ndarray]) -> Targets:
    b = len(boxes)
    m = max(8, math.ceil(max((len(x) for x in boxes), default=0) / 8) * 8)
    out_boxes = torch.zeros((b, m, 4), dtype=torch.float32)
    out_labels = torch.zeros((b, m), dtype=torch.int64)
    valid = torch.zeros((b, m), dtype=torch.bool)
    for i, (bx, lb) in enumerate(zip(boxes, labels)):
        n = len(bx)
        out_boxes[i, :n] = torch.from_numpy(np.asarray(bx, np.float32).reshape(n, 4))
        out_labels[i, :n] = torch.from_numpy(np.asarray(lb, np.int64))
        valid[i, :n] = True
    return Targets(out_boxes, out_labels, valid)


def collate_train(items) -> Batch:
    """Stack samples; a batch whose key asked for another size (multi-scale) is resized here."""
    images = torch.stack([it[0] for it in items])
    boxes = [it[1] for it in items]
    size, current = items[0][3], images.shape[-1]
    if size != current:
        images = TF.resize(images, [size, size], antialias=True)
        boxes = [b * (size / current) for b in boxes]
    return Batch(images, pad_targets(boxes, [it[2] for it in items]))


def collate_val(items) -> Batch:
    images, boxes, labels, ids, sizes, ratios, pads = zip(*items)
    return Batch(torch.stack(images), pad_targets(list(boxes), list(labels)),
                 torch.tensor(ids, dtype=torch.int64), torch.tensor(sizes, dtype=torch.float32),
                 torch.tensor(ratios, dtype=torch.float32), torch.tensor(pads, dtype=torch.float32))


def multi_scale_sizes(imgsz: int) -> list[int]:
    """Square sizes, multiples of 32, within [0.5, 1.5] x imgsz."""
    lo, hi = math.ceil(imgsz * 0.5 / 32), math.floor(imgsz * 1.5 / 32)
    return [32 * k for k in range(max(1, lo), hi + 1)]


# Mosaic/mixup partners come from the batch's images plus random others up to this many
# (dataset.py): small enough that a worker decodes ~2 images per sample at batch 8, large
# enough that a batch's mosaics do not all reuse the same few images.
POOL_MIN = 16


class EpochBatchSampler:
    """Shuffles per (seed, epoch) and emits SampleKeys carrying the epoch's augmentation state.

    It runs in the main process, and DataLoader calls `__iter__` when an epoch's iterator is
    created, so whatever `TrainLoader.set_epoch` set before reaches even persistent workers.

    Under multi-process training (`world_size` > 1) `batch` is the global batch: every rank draws
    the same global batches (same order, sizes and pools, from the same generator) and keeps its
    contiguous share, rank r the r-th, with the keys a single process would give those images, so
    the N ranks together train on exactly what one process trains on. A last batch with fewer
    images than ranks cannot give each an image and is left out (`__len__` says so), on every
    rank alike so their step counts match.

    `start` > 0 (a resume from a checkpoint written mid-epoch) leaves out the epoch's first
    `start` batches: they are still drawn, so the rest are the batches the epoch would have had."""

    def __init__(self, n: int, batch: int, seed: int, imgsz: int, multi_scale: bool,
                 rank: int = 0, world_size: int = 1):
        self.n, self.batch, self.seed, self.imgsz = n, batch, seed, imgsz
        self.rank, self.world_size = int(rank), int(world_size)
        self.sizes = multi_scale_sizes(imgsz) if multi_scale else [imgsz]
        self.epoch, self.mosaic, self.mixup, self.start = 0, 0.0, 0.0, 0

    def __len__(self) -> int:
        full, tail = divmod(self.n, self.batch)
        return full + int(tail >= self.world_size)  # tail 0: no partial batch

    def global_size(self, step: int) -> int:
        """Images in global batch `step` of an epoch, over all ranks."""
        return max(0, min(self.batch, self.n - step * self.batch))

    def __iter__(self):
        rng = np.random.default_rng([self.seed, self.epoch, 7919])  # 7919: the sampler stream
        order = rng.permutation(self.n).tolist()
        for step, start in enumerate(range(0, self.n, self.batch)):
            size = self.sizes[int(rng.integers(len(self.sizes)))] if len(self.sizes) > 1 \
                else self.imgsz
            indices = order[start:start + self.batch]
            pool = ()
            if self.mosaic > 0 or self.mixup > 0:
                extra = rng.integers(self.n, size=max(0, POOL_MIN - len(indices))).tolist()
                pool = tuple(indices + extra)
            if len(indices) < self.world_size:
                return  # the short last batch (see the class doc)
            if step < self.start:
                continue
            lo, hi = shard(len(indices), self.rank, self.world_size)
            yield [SampleKey(i, self.epoch, self.mosaic, self.mixup, size, pool) for i in indices[lo:hi]]


def shard(n: int, rank: int, world_size: int) -> tuple[int, int]:
    """[lo, hi) of rank's contiguous share of n items; the first n % world_size ranks get one more."""
    base, extra = divmod(n, world_size)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (rank < extra)


def _ignore_interrupts_in_worker() -> None:
    """In a data loader worker: a Ctrl-C reaches the whole process group, and each worker would
    print a traceback of its own; it is the main process's to answer (it ends the workers as its
    loader shuts down). A SIGTERM ends the worker at once and quietly: it is how the main
    process's exit terminates its daemon workers (so it must not be ignored, or that exit waits
    for them forever), and a scheduler's SIGTERM to the group reaches them too, where dying by
    the signal would make the main process report a killed worker over its own interrupt."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _end_worker)  # signals.py answers them in the main process


def _end_worker(signum, frame) -> None:
    os._exit(0)


def _seed_worker(worker_id: int) -> None:
    _ignore_interrupts_in_worker()  # Ctrl-C reaches the whole process group: the main process answers it alone
    # torch seeds each worker from the loader's generator; pass it on to numpy and random for
    # any third-party code (our augmentation draws from per-sample generators).
    s = torch.initial_seed() % 2**32
    np.random.seed(s)
    random.seed(s)


def _one_thread(it):
    """Yield from a main-process (workers=0) iterator with torch limited to one thread while it
    produces each batch. The per-image ops are too small to gain from intra-op threads, and on
    a busy machine OpenMP threads waiting for a descheduled peer made them 6x slower here; the
    caller's thread count is restored before the batch is handed over."""
    while True:
        prev = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            batch = next(it)
        except StopIteration:
            return
        finally:
            torch.set_num_threads(prev)
        yield batch


def _dataloader(dataset, cfg, seed: int, **kw) -> torch.utils.data.DataLoader:
    workers = max(0, min(int(cfg.workers), os.cpu_count() or 1))
    return torch.utils.data.DataLoader(
        dataset, num_workers=workers, persistent_workers=workers > 0,
        pin_memory=torch.cuda.is_available(), worker_init_fn=_seed_worker,
        generator=torch.Generator().manual_seed(seed), **kw)


def close_workers(loader) -> None:
    """Stop the worker processes of `loader` (ours, or a torch DataLoader) now, not when it is
    collected.

    Persistent workers live as long as the DataLoader's iterator. A reference cycle that holds
    the loader (a trainer's, through a closure) puts that off to the interpreter's shutdown, and
    there each worker's join waited out torch's 5 s timeout before it was terminated: on an H100,
    16 workers (8 train, 8 val) kept the process of a 45 s training run alive for 78 s more.
    """
    dl = getattr(loader, "loader", loader)  # None (no val loader) passes through
    if getattr(dl, "_iterator", None) is not None:  # torch keeps a persistent_workers iterator here
        dl._iterator._shutdown_workers()
        dl._iterator = None


class EpochLoader:
    """What the training loaders share: an EpochBatchSampler `sampler` behind a DataLoader
    `loader`, `set_epoch(epoch)` at each epoch start (the subclass says what else it reseeds), and
    iterating again without it moves on to the next epoch."""

    sampler: EpochBatchSampler
    loader: torch.utils.data.DataLoader
    _fresh: bool

    def set_epoch(self, epoch: int) -> None:
        self.sampler.epoch, self.sampler.start = epoch, 0
        self._fresh = True

    def start_at(self, step: int) -> None:
        """This epoch's iteration begins at batch `step` (a resume from a mid-epoch checkpoint)."""
        self.sampler.start = int(step)

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self):
        if not self._fresh:
            self.set_epoch(self.sampler.epoch + 1)
        self._fresh = False
        return self._batches()

    def _batches(self):
        it = iter(self.loader)
        return it if self.loader.num_workers else _one_thread(it)


class TrainLoader(EpochLoader):
    """Iterable of training Batches; call `set_epoch(epoch)` at each epoch start."""

    def __init__(self, dataset: TrainDataset, cfg, rank: int = 0, world_size: int = 1):
        self.dataset = dataset
        self.cfg = cfg
        self.num_images = len(dataset)
        self.sampler = EpochBatchSampler(len(dataset), int(cfg.batch), int(cfg.seed),
                                         int(cfg.imgsz), bool(cfg.multi_scale), rank, world_size)
        # seed + rank: each rank's workers get their own base seed (only third-party code draws
        # from it; our augmentation is keyed per sample, the same whichever rank loads it).
        self.loader = _dataloader(dataset, cfg, int(cfg.seed) + int(rank), batch_sampler=self.sampler,
                                  collate_fn=collate_train)
        self._fresh = self._closed = False
        self.set_epoch(0, quiet=True)

    def reconfigure(self, cfg) -> None:
        """Augment as `cfg` says from now on (recipe=auto chose after the scan counted the steps).
        Before the first epoch only: the workers copy the dataset when they start."""
        self.cfg = cfg
        self.dataset.hyp = {k: float(getattr(cfg, k)) for k in AUG_KEYS}
        self.set_epoch(0, quiet=True)

    def set_epoch(self, epoch: int, quiet: bool = False) -> None:
        """Reseed augmentation for `epoch`; close mosaic and mixup for the last no_aug_epochs.
        The closing is said once, by the first epoch set without `quiet` that is closed (set-up
        calls are quiet: their config may not be the one the run trains with yet)."""
        cfg = self.cfg
        closed = epoch >= cfg.epochs - cfg.no_aug_epochs
        if not quiet and closed and not self._closed and (cfg.mosaic or cfg.mixup):
            if epoch == 0:
                log.info("mosaic and mixup off: epochs=%d <= no_aug_epochs=%d", cfg.epochs, cfg.no_aug_epochs)
            else:
                log.info("mosaic and mixup closed for the last %s (from epoch %d of %d)",
                         counted(cfg.no_aug_epochs, "epoch"), epoch + 1, cfg.epochs)
        if not quiet:
            self._closed = closed
        self.sampler.mosaic = 0.0 if closed else float(cfg.mosaic)
        self.sampler.mixup = 0.0 if closed else float(cfg.mixup)
        super().set_epoch(epoch)


class ValLoader:
    """Iterable of validation Batches in file order, with the ground truth for the evaluator."""

    def __init__(self, dataset: ValDataset, cfg, batch: int):
        self.dataset = dataset
        self.num_images = len(dataset)
        self.files = dataset.split.files
        self.loader = _dataloader(dataset, cfg, int(cfg.seed), batch_size=batch, shuffle=False,
                                  collate_fn=collate_val)
        # COCO ids for what validation hands back (val --save-json): each image's, each class's.
        self.image_ids: list[int] | None = None
        self.category_ids: list[int] | None = None
        self.coco_categories = False  # the ids are a COCO json's own (not class + 1)

    def ground_truth(self) -> list[tuple[np.ndarray, np.ndarray]]:
        return self.dataset.ground_truth()

    def crowd(self) -> list[tuple[np.ndarray, np.ndarray]] | None:
        """Per image its COCO iscrowd boxes (as `ground_truth`), or None for a dataset without them."""
        return self.dataset.ground_truth(crowd=True) if self.dataset.split.crowd is not None else None

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        it = iter(self.loader)
        return it if self.loader.num_workers else _one_thread(it)


def build_train_loader(data_cfg: DataConfig, cfg, rank: int = 0, world_size: int = 1) -> TrainLoader:
    """The training loader; under multi-process training, rank's share of every global batch."""
    split = scan_split("train", data_cfg.train, data_cfg.nc, getattr(data_cfg, "annotations", {}).get("train"))
    dataset = TrainDataset(split, int(cfg.imgsz), cfg, seed=int(cfg.seed), cache=cfg.cache)
    return TrainLoader(dataset, cfg, rank, world_size)


def spread(n: int, k: int) -> list[int]:
    """`min(k, n)` indices spread evenly over range(n), in order."""
    k = min(k, n)
    return [i * n // k for i in range(k)]


class _Picked:
    """An image cache read at some of its indices: the training images precise_bn measures on,
    shared with the training dataset's cache (no second copy in memory, nothing decoded twice)."""

    def __init__(self, cache, pick: list[int]):
        self.cache, self.pick = cache, pick

    def get(self, i: int) -> torch.Tensor:
        return self.cache.get(self.pick[i])


def build_stats_loader(data_cfg: DataConfig, cfg, train_loader, images: int, batch: int) -> ValLoader:
    """`images` training images spread evenly over the split (all, if fewer), letterboxed to imgsz
    without augmentation as validation loads images: where precise_bn measures BatchNorm's
    statistics (engine/precise_bn.py). Read in the main process from the training dataset's cache,
    so it starts no workers."""
    train = train_loader.dataset
    whole = train.split
    pick = spread(len(whole), images)
    split = Split(whole.name, [whole.files[i] for i in pick], [whole.labels[i] for i in pick],
                  [whole.sizes[i] for i in pick])
    dataset = ValDataset(split, int(cfg.imgsz), cache=False)
    dataset.cache = _Picked(train.cache, pick)
    return ValLoader(dataset, replace(cfg, workers=0), int(batch))


def build_val_loader(data_cfg: DataConfig, cfg, batch: int | None = None) -> ValLoader:
    from .coco_json import category_ids, image_ids

    split = scan_split("val", data_cfg.val, data_cfg.nc, getattr(data_cfg, "annotations", {}).get("val"))
    dataset = ValDataset(split, int(cfg.imgsz), cache=cfg.cache)
    loader = ValLoader(dataset, cfg, int(batch or cfg.batch))
    listed = image_ids(data_cfg, "val")
    loader.image_ids = [listed[i] for i in split.index]
    loader.category_ids = category_ids(data_cfg)
    loader.coco_categories = getattr(data_cfg, "category_ids", None) is not None
    return loader
