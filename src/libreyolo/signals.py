"""SIGINT and SIGTERM end a command the way Ctrl-C does, in one line, with 128 + the signal.

`install()` (the CLI's first act) makes the first SIGINT or SIGTERM raise `Interrupted` in the
main thread: a KeyboardInterrupt, so every cleanup that Ctrl-C runs (the checkpoint thread's
pending write finishing, a new run directory with nothing in it removed, the run directory's
lock let go) runs for a scheduler's SIGTERM too. The checkpoints themselves need no care: each
is written to a temp file and renamed (engine/checkpoint.py), so last.pt is always the last
complete one, written at an epoch's end. The command then prints one line (`interrupted by
SIGTERM at epoch 3, step 12: the last good state is .../last.pt (end of epoch 2)`)
and exits 130 (SIGINT) or 143 (SIGTERM).

A second signal while that cleanup runs exits at once (os._exit), as a second Ctrl-C should: a
checkpoint write then in flight is abandoned as a temp file, and last.pt stays the one before.

SIGXFSZ is ignored, as CPython itself does at start-up: a file-size limit (`ulimit -f`) then
fails the write with EFBIG, one line naming the file, instead of killing the process.

No torch here, and outside engine/ (whose modules the torch-free readers, `profile summary`
and friends, never import): the CLI installs this before it imports anything heavy.
"""

from __future__ import annotations

import os
import signal
import threading

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """The command was told to end by `signum`; `detail` is what the run kept (set on the way
    out by the trainer: where it was stopped and its last good state)."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.detail = ""

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def install() -> dict:
    """First SIGINT/SIGTERM: raise Interrupted; a second: exit at once. Main thread only (where
    Python runs signal handlers); elsewhere nothing changes. Returns the handlers replaced, for
    `restore`."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    handled = (*SIGNALS, signal.SIGXFSZ) if hasattr(signal, "SIGXFSZ") else SIGNALS
    saved = {s: signal.getsignal(s) for s in handled}
    _RECEIVED.clear()
    for s in SIGNALS:
        signal.signal(s, _first)
    if hasattr(signal, "SIGXFSZ"):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    return saved


def restore(saved: dict) -> None:
    for s, handler in saved.items():
        if handler is not None:  # None: set outside Python, cannot be put back from here
            signal.signal(s, handler)


_RECEIVED: list[Interrupted] = []  # the interrupt raised, for a caller that swallowed it (typer)


def _first(signum, frame) -> None:
    for s in SIGNALS:
        signal.signal(s, _second)
    exc = Interrupted(signum)
    _RECEIVED[:] = [exc]
    raise exc


def unsaid() -> Interrupted | None:
    """The interrupt raised, when no line has said it yet (`said` marks it). An exception raised
    at an arbitrary point can be lost on its way: typer turns one during its argument parsing into
    a silent exit 130; one inside a C extension's import (numpy's) comes out as an AttributeError
    or ImportError of a half-imported module; third-party code with a bare `except:` drops it."""
    exc = _RECEIVED[0] if _RECEIVED else None
    return exc if exc is not None and not getattr(exc, "said", False) else None


def check() -> None:
    """At a safe point (a training step, before a run directory is made): raise again an
    interrupt that something swallowed, so one SIGTERM always ends the run."""
    exc = unsaid()
    if exc is not None:
        raise exc


def _second(signum, frame) -> None:
    name = signal.Signals(signum).name
    os.write(2, f"error: {name} again: exiting at once (a checkpoint write in progress is dropped; the "
                f"previous one is kept)\n".encode())
    os._exit(128 + signum)


def exit_code(exc: BaseException) -> int:
    """130 for a plain KeyboardInterrupt (Ctrl-C outside `install`), else 128 + the signal."""
    return exc.exit_code if isinstance(exc, Interrupted) else 130


def interrupted_line(exc: BaseException) -> str:
    """The one line a command ends with when told to stop (and the interrupt is marked said)."""
    exc.said = True
    name = signal.Signals(exc.signum).name if isinstance(exc, Interrupted) else "SIGINT"
    detail = getattr(exc, "detail", "")
    return f"interrupted by {name}" + (f" {detail}" if detail else "")


def note(exc: BaseException, where: str, kept: str) -> None:
    """Record on the interrupt where the run was stopped and what it kept (the trainer's last
    good state), for the command's line."""
    if isinstance(exc, KeyboardInterrupt) and not getattr(exc, "detail", ""):
        exc.detail = f"at {where}: {kept}"
