"""worker.py: a child process's JSON result comes back from stdout's last line; a failure is one
line (its `error: ...` line, a traceback's last line, or the exit code)."""

import os

import pytest

from libreyolo.worker import run_worker

CHILD = '''
import sys
from libreyolo.errors import DataError
from libreyolo.worker import answer

def work(mode):
    print("a stray print before the result")
    print("a log line", file=sys.stderr)
    if mode == "bad-input":
        raise DataError("dataset yaml not found: x.yaml")
    if mode == "crash":
        raise KeyError("boom")
    if mode == "silent":
        sys.exit(3)
    return {"mode": mode, "ms": [1.5, 2.0]}

answer(lambda: work(sys.argv[1]))
'''


@pytest.fixture
def child(tmp_path, monkeypatch):
    (tmp_path / "fake_worker.py").write_text(CHILD)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ["PYTHONPATH"]]))
    return "fake_worker"


def test_the_result_is_stdouts_last_line(child):
    res = run_worker(child, ["fine"])
    assert res.ok and res.result == {"mode": "fine", "ms": [1.5, 2.0]} and res.stderr_tail == "a log line"


@pytest.mark.parametrize("mode, code, error", [("bad-input", 2, "dataset yaml not found: x.yaml"),
                                               ("crash", 1, "KeyError: 'boom'"), ("silent", 3, "a log line")])
def test_a_failure_is_one_line(child, mode, code, error):
    res = run_worker(child, [mode])
    assert not res.ok and res.returncode == code and res.result is None and res.error == error


def test_passed_through_stderr_is_not_kept(child, capfd):
    res = run_worker(child, ["silent"], pass_stderr=True)
    assert res.stderr_tail == "" and res.error == "exit code 3"
    assert "a log line" in capfd.readouterr().err
