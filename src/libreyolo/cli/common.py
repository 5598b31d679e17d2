"""What every `libreyolo` command shares: the key=value context settings, the one-line errors, the
keys tables of the help screens and a plain usage line.

User mistakes print one line (`error: ...`) on stderr and exit 2, without a traceback;
`LIBREYOLO_DEBUG=1` re-raises so the traceback shows. The command groups (app.py, bench.py,
data.py, profile.py, export.py) import this module; app.py assembles them into the one `libreyolo`
command.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable

import typer
from typer.core import TyperCommand

from ..errors import LibreYOLOError

EXTRA = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": ["-h", "--help"]}


class PlainUsage(TyperCommand):
    """A command whose usage line names a required argument as Click does (`DATA`, not typer's
    `{DATA}`, which reads as a set of choices)."""

    def collect_usage_pieces(self, ctx) -> list[str]:
        return [re.sub(r"^\{(.+)\}", r"\1", piece) for piece in super().collect_usage_pieces(ctx)]


def rows_help(rows: dict[str, tuple[str, str]]) -> str:
    """A help paragraph, one `key=  default  meaning` line per {key: (default, meaning)}, kept as
    laid out (Click's `\\b` marker stops it rewrapping the paragraph)."""
    kw, dw = max(len(k) for k in rows) + 1, max(len(d) for d, _ in rows.values())
    return "\n".join(["\b"] + [f"  {k + '=':<{kw}}  {d:<{dw}}  {doc}" for k, (d, doc) in rows.items()])


def keys_help(keys, defaults: dict | None = None) -> str:
    """rows_help of training keys: each with its default (or the one `defaults` gives) and meaning."""
    from ..config import FIELDS, show_value

    return rows_help({k: ((defaults or {}).get(k, show_value(FIELDS[k].default)), FIELDS[k].metadata["doc"])
                      for k in keys})


def groups_help(width: int = 100) -> str:
    """Every key, by the groups of docs/hyperparameters.md, names only."""
    import textwrap

    from ..config import FIELDS
    from ..docs import GROUPS

    column = max(len(title) for title in GROUPS.values()) + 2  # "title: " and the keys after it
    lines = ["\b"]
    for group, title in GROUPS.items():
        keys = " ".join(k for k, f in FIELDS.items() if f.metadata["group"] == group)
        lines += textwrap.wrap(keys, width, initial_indent=f"  {title.lower() + ':':<{column}}",
                               subsequent_indent=" " * (column + 2))
    return "\n".join(lines)


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
