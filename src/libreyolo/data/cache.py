"""Where LibreYOLO keeps generated/downloaded data, and the decoded-image cache (`cache=auto|ram|disk`).

Both cache modes hold the image exactly as `load_resized` returns it (uint8 [3, h, w], long
side = imgsz), so a cached run produces the same batches as an uncached one. A .npy file stores
it HWC, the layout decoded images have in memory, so a disk-cached tile pastes as cheaply as a
decoded one (augment.fill_image says why that matters). Caches are filled up front
in the main process with a thread pool (JPEG decoding releases the GIL): worker processes then
inherit a read-only RAM cache instead of each filling a private copy.

`cache=auto` (the default) is `ram` for a split (train, and val during training) when its decoded
images fit in AUTO_RAM_SHARE of the memory available when it is built (the machine's, or a
cgroup's limit where that is tighter), shared among the training processes on this machine, and
no cache otherwise. Standalone `val` reads each image once and caches nothing.
On the H200 host (8 workers, YOLOv9-t at 640 px, mosaic) the loader delivers 353 images/s
uncached and 588 from RAM, against the ~400 a graphed YOLOv9-t step at batch 8 consumes
(docs/training-performance.md, "Training loader").
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from ..atomic import atomic_path
from ..errors import ConfigError, DataError

log = logging.getLogger("libreyolo")


def cache_root() -> Path:
    """$LIBREYOLO_CACHE, else ~/.cache/libreyolo."""
    env = os.environ.get("LIBREYOLO_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "libreyolo"


def check_dataset_target(root: Path, name: str, ours: bool = False) -> None:
    """Before a dataset is generated or downloaded into `root`: the folder must be new, empty,
    inside LibreYOLO's cache, or already one LibreYOLO made (`ours`: it holds the generator's
    marker). A stranger's yaml whose `path:` names /etc or climbs out through ../.. then gets one
    DataError line, and nothing there is written, replaced or moved aside."""
    if ours or not root.exists():
        return
    try:
        mine = root.resolve().is_relative_to(cache_root().resolve())
        empty = root.is_dir() and not any(root.iterdir())
    except OSError:
        mine, empty = False, False
    if mine or empty:
        return
    raise DataError(f"dataset {name}: {root} already holds other files, and LibreYOLO only generates or downloads "
                    f"a dataset into a new or empty folder (or its cache): point the yaml's path: at one")


# cache=auto caches in RAM up to this share of the memory available when the dataset is built.
AUTO_RAM_SHARE = 0.25


def available_memory(meminfo: str | Path = "/proc/meminfo", cgroup: str | Path = "/sys/fs/cgroup") -> int | None:
    """Bytes of memory available to new allocations, None where unknown: Linux's MemAvailable,
    or less when this process's cgroup (a container's, a batch job's) has a memory limit closer
    to its use (cgroup v2 memory.max - memory.current; v1 memory.limit_in_bytes - usage_in_bytes)."""
    found = []
    try:
        with open(meminfo) as f:
            found += [int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")]
    except (OSError, ValueError, IndexError):
        pass
    cgroup = Path(cgroup)
    for limit, usage in ((cgroup / "memory.max", cgroup / "memory.current"),
                         (cgroup / "memory" / "memory.limit_in_bytes", cgroup / "memory" / "memory.usage_in_bytes")):
        try:
            cap, used = limit.read_text().strip(), int(usage.read_text())
        except (OSError, ValueError):
            continue
        if cap.isdigit() and int(cap) < 2**60:  # "max" (v2) or a page-rounded 2^63 (v1): no limit
            found.append(max(int(cap) - used, 0))
    if found:
        return min(found)
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def resolve_auto(n: int, imgsz: int, tag: str) -> str | None:
    """`cache=auto` -> "ram" or None, with one log line saying why. The need is an upper bound:
    every image decoded at imgsz x imgsz x 3 bytes (the long side is imgsz)."""
    need = n * imgsz * imgsz * 3
    try:  # each training process on this machine keeps its own (set by torch's elastic launcher)
        procs = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        procs = 1
    avail = available_memory()
    if avail is None:
        log.info("%s: cache=auto: no cache (the available memory is unknown; cache=ram forces it)", tag)
        return None
    budget = AUTO_RAM_SHARE * avail / procs
    share = f"{AUTO_RAM_SHARE:.0%} of the {avail / 1e9:.1f} GB available" + (f", over {procs} processes" if procs > 1 else "")
    if need <= budget:
        log.info("%s: cache=auto: ram (%d images need at most %.0f MB, within %s)", tag, n, need / 1e6, share)
        return "ram"
    log.info("%s: cache=auto: no cache (%d images could need %.1f GB, over %s; cache=disk keeps them "
             "decoded on disk)", tag, n, need / 1e9, share)
    return None


class ImageCache:
    """Decoded, resized images kept in RAM or as .npy files; `None` mode = no cache."""

    def __init__(self, mode, files: list[Path], imgsz: int, loader: Callable[[Path], torch.Tensor],
                 tag: str = "images"):
        self.mode = {False: None, None: None, True: "ram"}.get(mode, mode)  # True: as Ultralytics
        if self.mode not in (None, "auto", "ram", "disk"):
            raise ConfigError(f"bad value for 'cache': {mode!r} (allowed: auto, false, ram, disk)")
        if self.mode == "auto":
            self.mode = resolve_auto(len(files), imgsz, tag) if files else None
        self.files = files
        self.loader = loader
        self.ram: list[torch.Tensor] = []
        self.folder = _disk_folder(files, imgsz) if self.mode == "disk" else None
        if self.mode is not None:
            self._fill(tag)

    def get(self, i: int) -> torch.Tensor:
        if self.mode == "ram":
            return self.ram[i]
        if self.mode == "disk":
            return torch.from_numpy(np.load(self._npy(i))).permute(2, 0, 1)
        return self.loader(self.files[i])

    def _npy(self, i: int) -> Path:
        return self.folder / f"{i:07d}.npy"

    def _fill(self, tag: str) -> None:
        threads = min(8, os.cpu_count() or 1)
        if self.mode == "ram":
            with ThreadPoolExecutor(threads) as pool:
                self.ram = list(pool.map(self.loader, self.files))
            size = sum(t.numel() for t in self.ram)
            log.info("%s: cached %d images in RAM (%.0f MB)", tag, len(self.ram), size / 1e6)
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        todo = [i for i in range(len(self.files)) if not self._npy(i).is_file()]
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(self._write_npy, todo))
        log.info("%s: %d images cached on disk in %s (%d new)", tag, len(self.files),
                 self.folder, len(todo))

    def _write_npy(self, i: int) -> None:
        # Atomic, so an interrupted fill never leaves a torn .npy. Saved through a file object:
        # np.save would append `.npy` to a temp path that lacks it. Decoded first: an image that
        # fails to read is not a failed write.
        image = self.loader(self.files[i]).permute(1, 2, 0).numpy()
        with atomic_path(self._npy(i)) as tmp, tmp.open("wb") as f:
            np.save(f, image)


def _disk_folder(files: list[Path], imgsz: int) -> Path:
    """One folder per (file list, sizes, mtimes, imgsz): any change gets a fresh cache."""
    h = hashlib.sha256(f"v2 {imgsz}".encode())  # v2: HWC files
    for f in files:
        try:
            st = f.stat()
            h.update(f"{f}|{st.st_size}|{st.st_mtime_ns}\n".encode())
        except OSError:
            h.update(f"{f}|missing\n".encode())
    return cache_root() / "images" / h.hexdigest()[:16]
