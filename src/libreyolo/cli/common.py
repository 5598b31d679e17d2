"""What every `libreyolo` command shares: the key=value context settings and the one-line errors.

User mistakes print one line (`error: ...`) on stderr and exit 2, without a traceback;
`LIBREYOLO_DEBUG=1` re-raises so the traceback shows. The command groups (app.py, bench.py,
profile.py, export.py) import this module; app.py assembles them into the one `libreyolo` command.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

import typer

from ..errors import LibreYOLOError

EXTRA = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": ["-h", "--help"]}


def one_line(text: str) -> str:
    """The message as one printable line: a file name or a yaml value from the user may hold a
    newline or a terminal escape, which must neither split the line nor reach the terminal."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text.strip())


def user_errors(fn: Callable) -> Callable:
    """Turn LibreYOLOError into one stderr line + exit 2 (traceback only with LIBREYOLO_DEBUG=1)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from ..signals import exit_code, interrupted_line, unsaid

        try:
            result = fn(*args, **kwargs)
            if unsaid() is not None:  # an interrupt some code swallowed: still the command's end
                raise unsaid()
            return result
        except LibreYOLOError as exc:
            if os.environ.get("LIBREYOLO_DEBUG"):
                raise
            # Under torchrun every process meets the same inputs: rank 0 says the line; another
            # rank only what is its own (its device ran out of memory).
            rank = process_rank()
            if not rank or getattr(exc, "per_rank", False):
                typer.echo(f"error: {f'rank {rank}: ' if rank else ''}{one_line(str(exc))}", err=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM (signals.py): 130 or 143
            if not process_rank():
                typer.echo(f"error: {one_line(interrupted_line(exc))}", err=True)
            raise typer.Exit(exit_code(exc)) from None
        except Exception:
            pending = unsaid()
            if pending is None:
                raise
            # The interrupt broke what ran after it (an import cut short fails later as an
            # AttributeError of a half-imported module): the signal is the news, not that.
            if not process_rank():
                typer.echo(f"error: {one_line(interrupted_line(pending))}", err=True)
            raise typer.Exit(exit_code(pending)) from None

    return wrapper


def process_rank() -> int:
    """This process's rank under torchrun (RANK), 0 otherwise; read without importing torch."""
    try:
        return int(os.environ.get("RANK") or 0)
    except ValueError:
        return 0
