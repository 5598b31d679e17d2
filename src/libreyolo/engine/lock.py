"""One training per run directory: a lock file, and a check that the directory is still there.

A run (or a resume) holds `<run_dir>/.lock` for as long as it trains: an exclusive `flock` on the
open file, which the kernel releases when the process ends however it ends (exit, Ctrl-C, kill
-9, a crash). A second training given the same directory (`exist_ok=true` with the same
`project/name`, or a resume of a run still going) finds it held and is refused in one line
naming the holder, before it writes anything: two jobs never interleave their epochs in one
results.csv. A lock file left by a process that died is not held by anyone: it is stale, taken
over, and said so. The file holds the holder's pid, host and start time, for that line only.

Where the filesystem has no flock (some network mounts answer ENOLCK), the file's pid decides:
a holder on this host that is still alive keeps it, one that is gone left a stale file.

While the run trains, `check()` (RunDirGuard, at each epoch end before anything is written)
makes sure the directory is the one it locked: deleted, emptied or replaced under the job, the
run stops with one RunDirError line, naming the last checkpoint if it is still there, instead
of writing a fresh half of a run directory (or failing on the first write with a traceback).
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import time
from pathlib import Path

from ..errors import RunDirError
from .run import Hook, Run

log = logging.getLogger("libreyolo")

LOCK_NAME = ".lock"


class RunLock:
    """The lock of one run directory, held from `acquire()` to `release()` (or the process's end)."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self._fd: int | None = None
        self._inode: tuple[int, int] | None = None

    def acquire(self) -> RunLock:
        for _ in range(10):  # a holder may release (and unlink) between our open and our lock
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                held = self._lock(fd)
                if held is None and _same_file(fd, self.path):
                    self._take(fd)
                    return self
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)
            if held is not None:
                raise RunDirError(f"run directory {self.run_dir} is in use by another training ({held}); "
                                  f"wait for it to end, or train under another name= (or exist_ok=false, "
                                  f"which numbers a new directory)")
        raise RunDirError(f"cannot lock run directory {self.run_dir}: its lock file keeps changing")

    def _lock(self, fd: int) -> str | None:
        """None when this process now holds `fd`'s lock, else who holds it (for the line)."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return None
        except BlockingIOError:
            return _describe(_read(fd))
        except OSError as exc:
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                raise
        # No flock here: the pid in the file decides.
        holder = _read(fd)
        if holder and holder.get("host") == socket.gethostname() and _alive(holder.get("pid")) \
                and holder.get("pid") != os.getpid():
            return _describe(holder)
        return None

    def _take(self, fd: int) -> None:
        previous = _read(fd)
        if previous and previous.get("pid") != os.getpid():
            log.info(f"{self.path}: the lock of a training that ended without releasing it "
                     f"({_describe(previous)}) was stale; taken over")
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                  "since": time.strftime("%Y-%m-%dT%H:%M:%S")}).encode(), 0)
        st = os.fstat(fd)
        self._fd, self._inode = fd, (st.st_dev, st.st_ino)

    def check(self) -> str | None:
        """None while the run directory is the one locked, else what happened to it."""
        if self._fd is None:
            return None
        if not self.run_dir.is_dir():
            return "was deleted"
        try:
            st = os.stat(self.path)
        except OSError:
            return "was emptied (its lock file is gone)"
        if (st.st_dev, st.st_ino) != self._inode:
            return "was replaced (its lock file is another one)"
        return None

    def release(self) -> None:
        """Remove the lock file (if it is still ours) and let go of it."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            if _same_file(fd, self.path):
                self.path.unlink(missing_ok=True)  # before unlocking: a waiter then finds a new file
        except OSError:
            pass
        finally:
            os.close(fd)  # releases the flock

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


class RunDirGuard(Hook):
    """At each epoch end, before the results and checkpoints are written (it runs right after the
    validation), stop the run if its directory was deleted, emptied or replaced under it."""

    def after_epoch(self, trainer: Run) -> None:
        lock = getattr(trainer, "run_lock", None)
        if lock is None:
            return
        last = lock.run_dir / "weights" / "last.pt"
        problem = lock.check()
        if problem is None and trainer.epoch > trainer.start_epoch:  # an earlier epoch of this run wrote last.pt
            trainer.checkpoints.wait()  # its write, if still pending (a failed one raises its own line)
            if last in trainer.checkpoints.written and not last.is_file():  # `rm -r run/*` spares .lock
                problem = "was emptied (the last.pt this run wrote is gone)"
        if problem is None:
            return
        kept = (f"{last} is still there: resume from it (resume={last})" if last.is_file()
                else "no checkpoint of it is left")
        raise RunDirError(f"run directory {lock.run_dir} {problem} while training (found at the end of epoch "
                          f"{trainer.epoch + 1}): stopped without writing there again; {kept}")


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _read(fd: int) -> dict | None:
    try:
        data = os.pread(fd, 4096, 0)
        holder = json.loads(data.decode("utf-8")) if data.strip() else None
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) else None


def _describe(holder: dict | None) -> str:
    if not holder:
        return "its lock file names no process"
    return f"pid {holder.get('pid')} on {holder.get('host')}, since {holder.get('since')}"


def _alive(pid) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
