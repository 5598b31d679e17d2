"""Phase markers for the training step and the inference step.

`phase("forward")` costs one global check when no profiler is active: it returns a shared
null context. A profiler installs a recorder with `set_recorder`; the recorder's `phase(name)`
returns the context that measures (record_function spans, CUDA events). The step (engine/step.py)
and the loop mark their phases here; the profiler (profiler/window.py) installs the recorder, so the
engine never imports the profiler. Nothing here imports anything: the commands that read
profile.json (profiler/analyze.py's phase names) stay free of torch and the engine.
"""

from __future__ import annotations

import contextlib
from typing import Any

PHASES = ("data", "h2d", "forward", "loss", "backward", "optimizer", "ema")
# The inference step (profiler/infer.py): the prepared batch, its upload, the network, then NMS and
# the copy of the results to the host. Its own tuple, so a training profile's phase table keeps
# exactly the training phases.
INFER_PHASES = ("data", "h2d", "forward", "postprocess")
PHASES_BY_MODE = {"train": PHASES, "infer": INFER_PHASES}

_NULL = contextlib.nullcontext()
_recorder: Any = None


def set_recorder(recorder: Any) -> None:
    """Install (or, with None, remove) the object whose `phase(name)` measures a phase."""
    global _recorder
    _recorder = recorder


@contextlib.contextmanager
def suspended():
    """No recorder inside: a CUDA graph's capture runs the step's code once, and a recorder's
    synchronising measurement is not allowed (nor meaningful) during a capture."""
    global _recorder
    saved, _recorder = _recorder, None
    try:
        yield
    finally:
        _recorder = saved


def phase(name: str) -> contextlib.AbstractContextManager:
    if _recorder is None:
        return _NULL
    return _recorder.phase(name)


_host_work: Any = None  # the active capture check's callback (engine/capture_check.py)


@contextlib.contextmanager
def watching_host_work(callback):
    """`callback(what)` hears every `host_work` call inside (the capture check listens)."""
    global _host_work
    saved, _host_work = _host_work, callback
    try:
        yield
    finally:
        _host_work = saved


def host_work(what: str) -> None:
    """Code that computes on the host from device data says so here (the matcher's SciPy solve of a
    copied cost matrix). On a CPU tensor no operator shows it, yet a CUDA graph could not repeat it:
    the capture check hears it through this call and reports `what`."""
    if _host_work is not None:
        _host_work(what)
