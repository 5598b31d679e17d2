import os
import shutil
import subprocess
import sys

import pytest


def _command() -> list[str]:
    exe = shutil.which("libreyolo")
    return [exe] if exe else [sys.executable, "-m", "libreyolo"]


def command_env(extra: dict | None = None) -> dict:
    """The environment the real command runs in. One intra-op thread unless the caller's
    environment says otherwise: the tiny runs gain nothing from more, and on a busy 2-core runner
    spinning OpenMP threads made a 1.5 s epoch take 40 s. Every process of one test must get the
    same: a run trained with two threads does not resume bit-for-bit under one."""
    return {"OMP_NUM_THREADS": "1", **os.environ, "LIBREYOLO_DEBUG": "", **(extra or {})}


@pytest.fixture
def cli(tmp_path):
    """Run the real `libreyolo` command in a temp working dir; returns CompletedProcess."""

    def run(*args: str, timeout: float = 600, env: dict | None = None, cwd=None):
        return subprocess.run([*_command(), *args], cwd=cwd or tmp_path, env=command_env(env), text=True,
                              capture_output=True, timeout=timeout)

    return run


@pytest.fixture
def cli_env():
    """`command_env()`, for a test that starts the command itself (subprocess.Popen)."""
    return command_env()


@pytest.fixture
def cli_command():
    """The argv prefix that runs the real `libreyolo` command."""
    return _command()
