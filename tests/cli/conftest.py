import os
import shutil
import subprocess
import sys

import pytest


def _command() -> list[str]:
    exe = shutil.which("libreyolo")
    return [exe] if exe else [sys.executable, "-m", "libreyolo"]


@pytest.fixture
def cli(tmp_path):
    """Run the real `libreyolo` command in a temp working dir; returns CompletedProcess."""

    def run(*args: str, timeout: float = 600, env: dict | None = None, cwd=None):
        # One intra-op thread unless a test says otherwise: the tiny runs gain nothing from more,
        # and on a busy 2-core runner spinning OpenMP threads made a 1.5 s epoch take 40 s.
        full_env = {"OMP_NUM_THREADS": "1", **os.environ, "LIBREYOLO_DEBUG": "", **(env or {})}
        return subprocess.run([*_command(), *args], cwd=cwd or tmp_path, env=full_env, text=True,
                              capture_output=True, timeout=timeout)

    return run


@pytest.fixture
def cli_command():
    """The argv prefix that runs the real `libreyolo` command."""
    return _command()
