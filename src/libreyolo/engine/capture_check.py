"""Whether a piece of the step can live inside a CUDA graph, checked by running it once.

A graph replays the kernels its capture recorded, with the shapes and host values of that one
call. So nothing in the captured region may read a device value on the host (`.item()`, `int()`,
`bool()`, `if tensor:`), produce a tensor whose size depends on the data (`nonzero`, boolean-mask
indexing, `unique`), or move a tensor between host and device: on a replay none of that would
happen again, and the step would train on the capture's numbers. Host computation that no
operator shows (a SciPy solve of a matrix already on the host) says so through
`markers.host_work`, which the check hears too. (The rules are those of the
PyTorch CUDA-graphs notes, "Constraints".) `CaptureCheck` is a dispatch mode that sees every
operator the region runs, its backward's included, and keeps the first one that breaks a rule,
with the line of our code that called it. It runs on any device: a CPU test checks every family
that a GPU run would capture, and `cuda_graph=full` checks the real step before its capture.
"""

from __future__ import annotations

import contextlib
import traceback
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .. import markers

aten = torch.ops.aten

_HOST_READ = "a host read of a device value (.item(), int(), bool(), `if tensor:`)"
_HOST_READS = (aten._local_scalar_dense.default, aten.is_nonzero.default)
_MASKED = (aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default)
_COPIES = (aten._to_copy.default, aten.copy_.default)
_PACKAGE = Path(__file__).resolve().parents[1]  # src/libreyolo
_SKIPPED = (Path(__file__).resolve(), Path(markers.__file__).resolve())  # the check's own frames


class CaptureCheck(TorchDispatchMode):
    """`with CaptureCheck() as check: region()`; then `check.problem` is None or one line."""

    def __init__(self):
        super().__init__()
        self.problem: str | None = None
        self._listening: contextlib.ExitStack | None = None

    def __enter__(self):
        self._listening = contextlib.ExitStack()
        self._listening.enter_context(markers.watching_host_work(self._host_work))
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._listening.close()

    def _host_work(self, what: str) -> None:
        if self.problem is None:
            self.problem = f"{what}{_caller()}"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.problem is None:
            why = _uncapturable(func, args, kwargs)
            if why is not None:
                self.problem = f"{why}{_caller()}"
        return func(*args, **kwargs)


def _uncapturable(func, args, kwargs) -> str | None:
    if func in _HOST_READS:
        return _HOST_READ
    if func in _MASKED:  # tagged dynamic for its mask form only: integer indices keep their shape
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        if any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ()):
            return "boolean-mask indexing, whose size depends on the mask"
        return None
    tags = getattr(func, "tags", ())
    if torch.Tag.dynamic_output_shape in tags or torch.Tag.data_dependent_output in tags:
        return f"{func.overloadpacket.__name__}, whose output depends on the data's values"
    if func in _COPIES:
        return _crossing(func, args, kwargs)
    return None


def _crossing(func, args, kwargs) -> str | None:
    """A copy between the host and a device (graphs replay device work only)."""
    if func is aten.copy_.default:
        dst, src = args[0], args[1]
        where = (src.device, dst.device)
    else:
        src = args[0]
        where = (src.device, torch.device(kwargs.get("device") or src.device))
    kinds = {w.type for w in where}
    if len(kinds) > 1 and "cpu" in kinds and "meta" not in kinds:
        return "a copy between host and device memory" + (" (to the host)" if where[1].type == "cpu" else "")
    return None


def _caller() -> str:
    """' at families/yolox/loss.py:120 (simota)': the innermost frame of our code outside this module."""
    for frame in reversed(traceback.extract_stack()):
        path = Path(frame.filename).resolve()
        if path in _SKIPPED or _PACKAGE not in path.parents:
            continue
        return f" at {path.relative_to(_PACKAGE).as_posix()}:{frame.lineno} ({frame.name})"
    return ""
