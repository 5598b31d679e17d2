"""Where LibreYOLO's log lines go: stderr, one plain line each (stdout may carry a result).

The CLI always sets this up. The Python API does so only when the program has configured no
logging of its own (no handler on the `libreyolo` logger nor on the root logger): a script or a
notebook then sees the same dataset, device and precision lines the CLI prints, and an
application that configured logging keeps its own arrangement.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterable

LOGGER = "libreyolo"


class _StderrHandler(logging.StreamHandler):
    """Writes to sys.stderr as it is when a line is logged, not as it was when the handler was
    made: the CLI run in-process (tests, notebooks) sees its log lines where its errors go, and
    a live progress bar that redirects sys.stderr keeps them above the bar."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ and setStream assign it
        pass


def counted(n: int, noun: str) -> str:
    """'1 epoch', '3 epochs', '0 images': a count and its noun, as every line spells them."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def setup_logging() -> None:
    logger = logging.getLogger(LOGGER)
    if not logger.handlers:
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def ensure_logging() -> None:
    """`setup_logging()` unless the program already decided where log lines go."""
    if logging.getLogger(LOGGER).handlers or logging.getLogger().handlers:
        return
    setup_logging()


@contextlib.contextmanager
def progress_bar(items: Iterable, enabled: bool, description: str, total: int | None = None):
    """Yield `items`, wrapped in a rich progress bar on stderr when it is an interactive terminal
    (never in a log or a pipe). `total` defaults to len(items) when it has one."""
    if not (enabled and sys.stderr.isatty()):
        yield items
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    if total is None and hasattr(items, "__len__"):
        total = len(items)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=total)

        def advance():
            for item in items:
                yield item
                bar.advance(task)

        yield advance()


class _Held(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def checking_inputs():
    """Hold back the log lines of the input checks (scan counts, precision, ...) until they pass.

    A command that fails on its inputs then prints its one error line and nothing before it; one
    that passes prints the held lines, in order, as if nothing had been held."""
    logger = logging.getLogger(LOGGER)
    held = _Held()
    saved = logger.handlers, logger.propagate
    logger.handlers, logger.propagate = [held], False
    try:
        yield
    finally:
        logger.handlers, logger.propagate = saved
    for record in held.records:  # reached only when the checks passed
        logger.handle(record)
