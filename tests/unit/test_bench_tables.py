"""benchmarks/tables.py and step_matrix.py: the tables print every arm, a whole-step one included,
and a matrix keeps its JSON whatever its progress table does."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import step_matrix  # noqa: E402
import tables  # noqa: E402


def _record(arm, phases, whole=None):
    """A `bench step` record; under cuda_graph=full the network's manager is held (it counts
    nothing) and the whole step's replays are in `whole_step`."""
    network = {"requested": True, "replayed_steps": 0 if whole else 24, "eager_steps": 0 if whole else 10}
    return {"arch": "yolo9-t", "batch": 8, "arm": arm, "precision": "float16 autocast", "step_ms_min": 20.1,
            "step_ms_median": 20.3, "kernel_busy_ms": 17.5, "utilisation": 0.86, "peak_mem_mb": 2048.0,
            "synced_ms": phases, "network_share": 0.8, "graph": network, "whole_step": whole}


def test_arm_table_prints_a_whole_step_arm_by_its_own_phases_and_replays():
    graph = _record("float16+graph", {"forward": 5.0, "loss": 2.5, "backward": 9.0, "optimizer+ema": 1.25})
    # cuda_graph=full: "forward" times the micro-step replay, "optimizer" the update's
    full = _record("float16+full", {"forward": 18.0, "optimizer+ema": 1.5},
                   whole={"enabled": True, "replayed_steps": 40, "eager_steps": 6, "captures": 2})
    eager = _record("float16", {"forward": 30.0, "optimizer+ema": 1.0})  # a step that marks no loss or backward
    eager["graph"] = {"requested": False}
    rows = tables.arm_table([graph, full, eager]).splitlines()
    assert len(rows) == 5
    assert "| 5.0 / 2.5 / 9.0 / 1.2 | 0.80 |" in rows[2] and "| 24/34 |" in rows[2]
    assert "| whole 18.0 / - / - / 1.5 | - |" in rows[3] and "| 40/46 |" in rows[3]
    assert "| 30.0 / - / - / 1.0 | 0.80 |" in rows[4] and rows[4].endswith("| - |")


def test_step_matrix_writes_its_json_before_the_progress_table(tmp_path, monkeypatch):
    got = [_record("float16+full", {"optimizer+ema": 0.0})]
    monkeypatch.setattr(step_matrix, "bench_step", lambda user, arms, **kw: got)

    def broken(records):
        raise RuntimeError("the table")

    monkeypatch.setattr(step_matrix, "arm_table", broken)
    out = tmp_path / "step.json"
    monkeypatch.setattr(sys, "argv", ["step_matrix.py", "--arms", "float16+full", "--out", str(out)])
    with pytest.raises(RuntimeError, match="the table"):
        step_matrix.main()
    assert json.loads(out.read_text()) == got
