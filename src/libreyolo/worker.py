"""Run a LibreYOLO module in a fresh Python process and read back its JSON result.

For measurements that must not inherit this process's state: `bench step` runs each arm so (no
allocator, autotuner or compiled state carried over from another arm), `profile run --repeat`
each trial (one profiler recording per process, pytorch issue 192021). The child, `python -m
<module> ARGS...` under this interpreter and environment, prints its result as JSON on the last
line of stdout (`answer` does that); its log goes to stderr, which is either passed through live
(a trial's progress) or captured, so that a failure reads as one line (a bench arm).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

STDERR_TAIL_LINES = 20


@dataclass(frozen=True)
class WorkerResult:
    returncode: int
    result: Any | None  # stdout's last line, parsed as JSON; None when absent or not JSON
    stderr_tail: str  # stderr's last lines; empty when it was passed through

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.result is not None

    @property
    def error(self) -> str:
        """Why the worker failed, in one line: stderr's last line, else what is missing."""
        lines = self.stderr_tail.strip().splitlines()
        if lines:
            return lines[-1].removeprefix("error: ")
        return f"exit code {self.returncode}" if self.returncode else "no result on stdout"


def run_worker(module: str, args: Sequence[str], *, pass_stderr: bool = False) -> WorkerResult:
    """Run `python -m module *args` and wait for it. `pass_stderr`: the child's stderr goes to
    ours as it is written (its log and progress bar) instead of being captured."""
    proc = subprocess.run([sys.executable, "-m", module, *args], stdout=subprocess.PIPE,
                          stderr=None if pass_stderr else subprocess.PIPE, text=True)
    lines = proc.stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1]) if lines else None
    except ValueError:
        result = None
    tail = "" if pass_stderr else "\n".join(proc.stderr.splitlines()[-STDERR_TAIL_LINES:])
    return WorkerResult(proc.returncode, result, tail)


def answer(fn: Callable[[], Any]) -> None:
    """The worker's side: print `fn()` as one JSON line on stdout. A LibreYOLOError becomes one
    `error: ...` line on stderr and exit code 2, as on the command line."""
    from .errors import LibreYOLOError

    try:
        result = fn()
    except LibreYOLOError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    print(json.dumps(result), flush=True)
