"""profile_repeat.json: what N profile trials add up to (`libreyolo profile run|infer --repeat N`).

The trials themselves run in fresh processes (profile_run.py); each writes its own
profile_summary.json. `aggregate` holds the mean and std of every headline figure over them and
each trial's verdict, which `profile summary` and its `--fail-if` gates read.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from .artifacts import REPEAT_SCHEMA, SCHEMA_VERSION
from .trace import stats

FIGURES = ("step_ms_mean", "step_ms_std", "utilisation", "kernel_busy_ms", "data_wait_ms", "data_wait_frac",
           "syncs_per_step", "peak_memory_mb", "overhead_frac")


def aggregate(summaries: list[dict], dirs: list[Path]) -> dict:
    """profile_repeat.json: mean and std of each headline figure over the trials, and the verdicts."""
    figures = {}
    for key in FIGURES:
        values = [s.get(key) for s in summaries]
        st = stats(v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool))
        figures[key] = {"mean": st["mean"], "std": st["std"], "values": values}
    verdicts = [s["verdict"] for s in summaries]
    top, count = Counter(verdicts).most_common(1)[0]
    first = summaries[0]
    return {"schema": REPEAT_SCHEMA, "schema_version": SCHEMA_VERSION, "trials": len(summaries),
            "dirs": [str(d) for d in dirs], "mode": first.get("mode", "train"), "arch": first.get("arch"),
            "batch": first.get("batch"), "imgsz": first.get("imgsz"), "device": first.get("device"), "figures": figures,
            "verdicts": verdicts, "verdict": top, "verdict_count": count}
