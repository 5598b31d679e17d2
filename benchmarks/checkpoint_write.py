"""How long the checkpoint thread takes to write a training state, beside an idle and a busy
Python thread.

    python benchmarks/checkpoint_write.py [--models rfdetr-n ec-s yolo9-t] [--repeat 2] [--json out.json]

A host-bound training loop (the DETRs' eager decoder and matching: many small kernel launches)
holds Python's GIL nearly all the time; torch.save hands the GIL back between the records it
writes, one per storage, and waits to take it again. For each model: the state a checkpoint
holds (weights, an EMA copy, the flat AdamW optimizer after one step), copied for the thread
two ways, each tensor on its own storage (`per-tensor`) and as views of one buffer per dtype
(`packed`, what engine/state.py does), then written with engine.checkpoint.save_checkpoint on a
thread while the main thread is idle or spins in Python. Prints JSON on stdout (also written to
--json) and a table on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from libreyolo.engine.checkpoint import map_tensors, save_checkpoint  # noqa: E402
from libreyolo.engine.optim import build_optimizer  # noqa: E402
from libreyolo.engine.state import _copied  # noqa: E402
from libreyolo.families import parse_arch  # noqa: E402


def per_tensor(value):
    """The copy before packing: every tensor on a storage of its own."""
    return map_tensors(value, lambda t: t.detach().to("cpu", copy=True))


def state_of(arch: str) -> dict:
    spec, size = parse_arch(arch)
    model = spec.build(size, 80)
    cfg = SimpleNamespace(optimizer="adamw", lr0=1e-4, momentum=0.9, weight_decay=1e-4, batch=16, nbs=16,
                          accumulate=1)
    optimizer = build_optimizer(model, cfg, device_type="cpu")
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()  # the moments exist
    return {"model": model.state_dict(), "ema": model.state_dict(), "optimizer": optimizer.state_dict()}


def timed_write(path: Path, payload: dict, busy: bool) -> float:
    done, failed = threading.Event(), []

    def write() -> None:
        try:
            save_checkpoint(path, payload)
        except BaseException as exc:  # raised again on the main thread
            failed.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=write)
    t0 = time.perf_counter()
    thread.start()
    spins = 0
    while busy and not done.is_set():
        spins += 1  # a training loop that never leaves Python
    thread.join()
    if failed:
        raise failed[0]
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["rfdetr-n", "ec-s", "yolo9-t"])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "last.pt"
        for arch in args.models:
            state = state_of(arch)
            for copy_name, copy in (("per-tensor", per_tensor), ("packed", _copied)):
                t0 = time.perf_counter()
                payload = {part: copy(value) for part, value in state.items()}  # as training_state copies
                copy_s = time.perf_counter() - t0
                storages = len({t.untyped_storage().data_ptr() for part in payload.values()
                                for t in _leaves(part)})
                for busy in (False, True):
                    runs = [timed_write(path, payload, busy) for _ in range(args.repeat)]
                    rows.append({"model": arch, "copy": copy_name, "main_thread": "busy" if busy else "idle",
                                 "copy_s": round(copy_s, 3), "write_s": [round(r, 2) for r in runs],
                                 "storages": storages, "mb": round(path.stat().st_size / 1e6, 1)})
                    print(f"{arch:10s} {copy_name:10s} {rows[-1]['main_thread']:4s} storages {storages:5d} "
                          f"{rows[-1]['mb']:7.1f} MB  copy {copy_s:5.2f} s  write {runs} s", file=sys.stderr)
    out = {"command": " ".join(["python", "benchmarks/checkpoint_write.py", *sys.argv[1:]]),
           "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}", "rows": rows}
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


def _leaves(value) -> list[torch.Tensor]:
    found = []
    map_tensors(value, found.append)
    return found


if __name__ == "__main__":
    main()
