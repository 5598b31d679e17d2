"""The `libreyolo` command's entry point: the signal handlers first, then the command line.

Kept apart from cli/app.py so that nothing slow (typer, then torch) is imported before a Ctrl-C
or a SIGTERM is answered with one line (signals.py): the window without the handlers is
Python's own start-up.

At the end it freezes the garbage collector's objects. Python's shutdown would otherwise run a
last collection over every object torch and torchvision created (about a second of a short
command's time on a 2-core machine); the process's memory goes back to the system anyway, and
the modules are still torn down, so open files are flushed and closed as before.
"""

from __future__ import annotations

import gc  # here, not at exit: an import then would print after the last line under -X importtime


def main(argv: list[str] | None = None) -> None:
    from ..signals import install

    install()
    try:
        from .app import main as run
    except BaseException as exc:  # a signal while typer loads (or what it broke there)
        import sys

        from ..signals import exit_code, interrupted_line, unsaid

        pending = exc if isinstance(exc, KeyboardInterrupt) else unsaid()
        if pending is None:
            raise
        sys.stderr.write(f"error: {interrupted_line(pending)}\n")
        sys.exit(exit_code(pending))
    try:
        run(argv)
    finally:
        gc.freeze()
