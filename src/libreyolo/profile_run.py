"""`libreyolo profile run`: train just long enough to fill the profile window, once or N times.

One run trains in this process, through the LibreYOLO facade with the profiler's hook
(profiler/window.py). `--repeat N` runs every trial in a fresh process, into `<run>/prof_1 ...
prof_N` (`profile infer --repeat N`: its inference windows, profiler/infer.py, into `<run>/infer_1
... infer_N`): one profiler recording per process (a second recording in the same process can corrupt
its first kernel timestamps, pytorch issue 192021) and a fresh allocator, autotuner and page cache
state per trial, so the trials are independent samples. `<run>/profile_repeat.json` then holds
their aggregate (profiler/repeat.py).

A runner, like bench.py: it drives the facade, so it sits above model.py, and the profiler
(which the facade plugs into training) never drives training itself.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from pathlib import Path
from typing import Any

from .atomic import write_json_atomic
from .errors import LibreYOLOError
from .profiler.artifacts import REPEAT_FILE
from .profiler.repeat import aggregate
from .worker import answer, run_worker

log = logging.getLogger("libreyolo")

DEFAULTS = {"project": "runs/profile", "name": "prof", "no_aug_epochs": 0, "val": False}


def plan(lib, data: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """The train() arguments of one profile run: our defaults, profile=True, enough epochs and
    cuDNN's autotuning as a long run's steady step has it.

    Enough epochs = ceil(window.steps_needed(profile_skip, profile_steps) / steps_per_epoch), plus one
    spare in case broken images shrink the epoch; the hook stops training once its window is done,
    so the spare epoch only runs when it is needed.
    """
    from .config import build_config
    from .engine.builder import steady_autotune
    from .profiler.window import steps_needed
    from .tasks import task_for

    user = {**DEFAULTS, **overrides, "profile": True}
    # Without `profile`: only the batch and window sizes are needed here.
    cfg = build_config({**{k: v for k, v in user.items() if k != "profile"}, "model": lib.name, "data": data},
                       lib.source.defaults)
    files = len(task_for(lib.source.spec, cfg.task).load_data(data).train)
    per_epoch = max(math.ceil(files / cfg.batch), 1)
    user["epochs"] = math.ceil(steps_needed(cfg.profile_skip, cfg.profile_steps) / per_epoch) + 1
    # `cudnn_benchmark=auto` would judge the profile's own few dozen steps too short to autotune
    # and the window would time cuDNN's untuned choices, not the kernels of the run it stands for
    # nor those `bench step` times (engine/builder.steady_autotune). `false` is kept as asked.
    if cfg.cudnn_benchmark == "auto":
        user["cudnn_benchmark"] = steady_autotune(cfg)
    return user


def run_once(model: str, data: str, overrides: dict[str, Any]) -> Path:
    """Train with the profiler in this process; returns the run directory (holding profile.json)."""
    from .config import build_config
    from .engine.device import select_device
    from .model import LibreYOLO
    from .profiler.window import profiler_hooks

    lib = LibreYOLO(model)
    user = plan(lib, data, overrides)
    # The window's hook stops training after the window and stays quiet: this command reports.
    cfg = build_config({**user, "model": lib.name, "data": data}, lib.source.defaults)
    asked = str(overrides.get("cudnn_benchmark", "auto")) == "auto"
    if asked and cfg.cudnn_benchmark is True and select_device(cfg.device).type == "cuda":
        log.info("cudnn_benchmark=auto: on (the window times the steady step of a run long enough to autotune; "
                 "cudnn_benchmark=false times cuDNN's untuned choices)")
    result = lib.train(data=data, hooks=profiler_hooks(cfg, stop_after_window=True, print_report=False), **user)
    if not (result.run_dir / "profile.json").is_file():
        raise LibreYOLOError(f"the profile window did not complete in {result.run_dir} (see the log above)")
    return result.run_dir


def run_trials(model: str, data: str | None, overrides: dict[str, Any], n: int,
               mode: str = "train") -> tuple[Path, dict]:
    """N trials, each in its own process, under one new run directory; returns (it, the aggregate).
    `mode`: "train" (profile run) or "infer" (profile infer; `data` is unused: the images are
    overrides['source'])."""
    from .engine.rundir import make_run_dir

    base = _check(mode, model, data, overrides)  # a bad key or dataset fails here, once, not N times
    parent = make_run_dir(overrides.get("project", DEFAULTS["project"]), base, overrides.get("exist_ok", False))
    dirs = []
    for i in range(1, n + 1):
        trial = {**overrides, "project": str(parent), "name": f"{base}_{i}", "exist_ok": True}
        log.info(f"profile: trial {i}/{n} in {parent / trial['name']}")
        spec = json.dumps({"mode": mode, "model": model, "data": data, "overrides": trial})
        # stderr passes through (the trial's log); the result is the trial's run directory.
        res = run_worker("libreyolo.profile_run", [spec], pass_stderr=True)
        if not res.ok:
            raise LibreYOLOError(f"profile trial {i}/{n} failed (exit code {res.returncode}); see the messages above")
        dirs.append(Path(res.result))
    summaries = [json.loads((d / "profile_summary.json").read_text()) for d in dirs]
    rep = aggregate(summaries, dirs)
    write_json_atomic(parent / REPEAT_FILE, rep)
    return parent, rep


def _check(mode: str, model: str, data: str | None, overrides: dict[str, Any]) -> str:
    """Check the trials' model and settings in this process; returns their run directory's name."""
    if mode == "infer":
        from .profiler.infer import settings
        from .resolve import resolve_model

        resolve_model(model)
        return settings(model, overrides).name
    from .model import LibreYOLO

    plan(LibreYOLO(model), data, overrides)
    return overrides.get("name", DEFAULTS["name"])


def _once(mode: str, model: str, data: str | None, overrides: dict[str, Any]) -> Path:
    if mode == "infer":
        from .profiler.infer import run_once as infer_once

        return infer_once(model, overrides)
    return run_once(model, data, overrides)


def _trial(spec_json: str) -> str:
    """One trial, in a fresh process started by run_trials; returns its run directory."""
    from .logs import setup_logging

    setup_logging()
    spec = json.loads(spec_json)
    return str(_once(spec["mode"], spec["model"], spec["data"], spec["overrides"]))


if __name__ == "__main__":
    answer(lambda: _trial(sys.argv[1]))
