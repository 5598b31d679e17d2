"""benchmarks/tables.py and step_matrix.py: the tables print every arm, a whole-step one included,
and a matrix keeps its JSON whatever its progress table does."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import step_matrix  # noqa: E402
import tables  # noqa: E402


def _record(arm, phases):
    return {"arch": "yolo9-t", "batch": 8, "arm": arm, "precision": "float16 autocast", "step_ms_min": 20.1,
            "step_ms_median": 20.3, "kernel_busy_ms": 17.5, "utilisation": 0.86, "peak_mem_mb": 2048.0,
            "synced_ms": phases, "network_share": 0.8,
            "graph": {"requested": True, "replayed_steps": 24, "eager_steps": 10}}


def test_arm_table_prints_a_dash_for_phases_a_whole_step_replay_does_not_mark():
    graph = _record("float16+graph", {"forward": 5.0, "loss": 2.5, "backward": 9.0, "optimizer+ema": 1.25})
    full = _record("float16+full", {"optimizer+ema": 0.0})  # what bench step records under cuda_graph=full
    rows = tables.arm_table([graph, full]).splitlines()
    assert len(rows) == 4
    assert "| 5.0 / 2.5 / 9.0 / 1.2 |" in rows[2]
    assert "| - / - / - / 0.0 |" in rows[3] and "| 24/34 |" in rows[3]


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
