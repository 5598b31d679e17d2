"""benchmarks/parity.py's bookkeeping: every regime has a typed row, the late fall, the per-regime
summary and the targets it checks (the runs themselves need the peer and a GPU)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import parity  # noqa: E402

from libreyolo.data.regimes import regime_names  # noqa: E402


def test_every_regime_has_what_a_user_types():
    assert list(parity.TYPED) == regime_names()
    assert all(len(v) == 3 and all(isinstance(x, int) and x > 0 for x in v) for v in parity.TYPED.values())


def test_late_drop_counts_only_the_last_third():
    assert parity.late_drop([0.1, 0.5, 0.4, 0.5, 0.2, 0.5]) == pytest.approx(0.6)  # 0.5 -> 0.2 at index 4
    assert parity.late_drop([0.5, 0.1, 0.2, 0.3, 0.5, 0.6]) == 0.0  # the early dip is not late
    assert parity.late_drop([]) == 0.0 and parity.late_drop([0.0, 0.0, 0.0]) == 0.0


def test_arms_parse_and_a_bad_one_is_refused():
    assert parity.parse_arm("ours") == ("ours", "yolo9-t", {})
    assert parity.parse_arm("ours@yolox-t+recipe=published") == ("ours", "yolox-t", {"recipe": "published"})
    assert parity.parse_arm("peer") == ("peer", "yolov9t.yaml", {})
    for bad in ("mine", "peer@yolov8n", "ours+recipe"):
        with pytest.raises(ValueError, match="bad arm"):
            parity.parse_arm(bad)


def _run(regime, arm, seed, m, wall, drop=0.0):
    run = {"regime": regime, "arm": arm, "seed": seed, "map50_95": m, "map50": m + 0.2, "late_drop": drop,
           "wall_s": wall}
    return run | ({"peer_own_map50_95": m + 0.001} if arm == "peer" else {})


def test_summary_and_targets():
    runs = [_run("a", "ours", 0, 0.80, 40), _run("a", "ours", 1, 0.82, 42), _run("a", "peer", 0, 0.60, 100),
            _run("a", "peer", 1, 0.62, 100),
            _run("b", "ours", 0, 0.50, 70, drop=0.4), _run("b", "peer", 0, 0.52, 100),
            {"regime": "b", "arm": "ours", "seed": 1, "error": "exited 1"}]
    rows = {(r["regime"], r["arm"]): r for r in parity.summarise(runs)}
    a, b = rows["a", "ours"], rows["b", "ours"]
    assert a["runs"] == 2 and a["map50_95_mean"] == pytest.approx(0.81) and a["vs_peer"] == pytest.approx(0.20)
    assert a["wall_vs_peer"] == pytest.approx(0.41) and a["meets_floor"] and a["late_drop_ok"]
    assert b["runs"] == 1 and not b["meets_floor"] and not b["late_drop_ok"] and b["map50_95_sd"] == 0.0
    assert rows["a", "peer"]["peer_own_map50_95_mean"] == pytest.approx(0.611)
    lines = parity.targets(list(rows.values()))
    assert lines[0].endswith("NOT met on b")
    assert lines[1] == "- ours above the peer on a majority (2 of 2): NOT met (1: a)"
    assert lines[2].endswith("NOT met on b") and lines[3].endswith("NOT met on b")
    one = parity.targets([rows["a", "ours"], rows["a", "peer"]])
    assert one[1] == "- ours above the peer on a majority (1 of 1): met (1: a)" and one[3].endswith("met")
    families = parity.summarise([_run("a", "ours@yolo7-t", 0, 0.7, 50), _run("b", "ours", 0, 0.8, 40)])
    assert parity.targets(families) == ["- the targets compare the arm `ours` with `peer` on the same regime: "
                                        "these runs have no such pair"]
