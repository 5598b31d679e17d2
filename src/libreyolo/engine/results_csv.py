"""results.csv: one row per epoch, written whole each time and kept in every checkpoint.

The table is rewritten through a temp file and a rename at every epoch end (a few kB): a full
disk or a file-size limit leaves the previous table, never a half row under the real name (an
append could). Its rows are also the ResultsHook's state, so each checkpoint holds the table up
to its epoch, and a resume writes exactly those rows back: the rows of epochs that ran after the
checkpoint (an interrupted epoch's) are dropped, and a table that was deleted, damaged or is not
UTF-8 text any more is rebuilt from the checkpoint, with one line saying so. A checkpoint from
before the table was kept in it resumes on the file as it is, or is refused in one line when the
file cannot be read.
"""

from __future__ import annotations

import csv
import io
import logging
from pathlib import Path
from typing import Any

from ..atomic import write_text_atomic
from ..errors import RunDirError

log = logging.getLogger("libreyolo")


class ResultsTable:
    """The rows so far (a dict per epoch, `epoch` first, 1-based) and the file they go to."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.from_checkpoint = False  # the rows came with a resumed checkpoint

    def load(self, rows: Any) -> None:
        """The rows a checkpoint holds (its ResultsHook state); anything else is no history."""
        if isinstance(rows, list) and all(isinstance(r, dict) and "epoch" in r for r in rows):
            self.rows, self.from_checkpoint = [dict(r) for r in rows], True

    def start(self, path: Path, start_epoch: int) -> None:
        """At the start of training: a fresh run (`start_epoch` 0) starts its own table; a resume
        keeps the rows of the epochs its checkpoint holds."""
        if start_epoch == 0:
            self.rows = []
            path.unlink(missing_ok=True)  # a reused directory's (exist_ok=true) earlier table
            return
        if self.from_checkpoint:
            self.rows = [r for r in self.rows if _epoch(r) <= start_epoch]
            expected = table_text(self.rows)
            problem = _compare(path, expected)
            if problem is not None:
                log.info(f"{path} {problem}: rebuilt its {len(self.rows)} rows from the checkpoint")
            if expected:
                write_text_atomic(path, expected, make_dirs=False)
            else:
                path.unlink(missing_ok=True)
            return
        self.rows = _read_legacy(path, start_epoch)
        if path.exists():
            write_text_atomic(path, table_text(self.rows), make_dirs=False)

    def add(self, path: Path, row: dict[str, Any]) -> None:
        """Append `row` (this epoch's) and write the whole table."""
        self.rows.append(dict(row))
        write_text_atomic(path, table_text(self.rows), make_dirs=False)


def table_text(rows: list[dict[str, Any]]) -> str:
    """The csv text of `rows`: a header of every column in the order first met, then a line per
    row (csv's own `\\r\\n` line ends, as results.csv always had)."""
    if not rows:
        return ""
    columns: dict[str, None] = {}
    for r in rows:
        columns.update(dict.fromkeys(r))
    buf = io.StringIO(newline="")
    writer = csv.DictWriter(buf, fieldnames=list(columns), restval="")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def _epoch(row: dict[str, Any]) -> int:
    try:
        return int(row["epoch"])
    except (TypeError, ValueError):
        return 1 << 30  # not a row of this table: never kept


def _compare(path: Path, expected: str) -> str | None:
    """Why the file does not begin with `expected` (the checkpoint's rows), or None when it does
    (rows after them are an interrupted epoch's, not damage)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return "is missing" if expected else None
    except OSError as exc:
        return f"cannot be read ({exc.strerror or type(exc).__name__})"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"is not UTF-8 text (byte {exc.start})"
    if not text.startswith(expected):
        return "does not match the checkpoint's epochs (damaged or edited)"
    return None


def _read_legacy(path: Path, start_epoch: int) -> list[dict[str, str]]:
    """The rows of epochs 1..start_epoch from the file itself (a checkpoint without the table),
    or one RunDirError line when the file cannot be read as results.csv."""
    if not path.exists():
        return []
    try:
        text = path.read_bytes().decode("utf-8")
        rows = list(csv.reader(io.StringIO(text, newline="")))
        problem = _legacy_problem(rows)
    except UnicodeDecodeError as exc:
        problem = f"is not UTF-8 text (byte {exc.start})"
    except (OSError, csv.Error) as exc:
        problem = f"cannot be read ({exc})"
    if problem is not None:
        raise RunDirError(f"cannot resume: {path} {problem}, and the checkpoint holds no table to "
                          f"rebuild it from (written before checkpoints kept it); move results.csv aside and "
                          f"resume again (a new table starts at epoch {start_epoch + 1})")
    header = rows[0]
    return [dict(zip(header, r)) for r in rows[1:] if r and r[0].isdigit() and int(r[0]) <= start_epoch]


def _legacy_problem(rows: list[list[str]]) -> str | None:
    if not rows or not rows[0] or rows[0][0] != "epoch":
        return "has no results header (its first line does not start with 'epoch')"
    width = len(rows[0])
    for n, r in enumerate(rows[1:], 2):
        if r and (len(r) != width or not r[0].isdigit()):
            return f"is damaged at line {n}"
    return None
