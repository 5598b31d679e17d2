"""How expensive is launching work from this host? Explains eager step times on a GPU machine.

    python benchmarks/host_diag.py        (CUDA only; prints, writes nothing)

1. host cost of one tiny elementwise op (`x.add_(1)` on 1024 floats): the floor per kernel;
2. host cost of one channels_last 3x3 convolution (cuDNN plan lookup + launch);
3. an eager YOLOv9-t step (batch 8, 640, float16): host time to enqueue vs wall time, and the
   ops that take the most CPU time (torch.profiler, CPU activity only).
"""

from __future__ import annotations

import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path[:0] = [os.path.join(ROOT, "src"), os.path.join(ROOT, "tests")]

from testkit import synthetic_batch  # noqa: E402

from libreyolo.config import build_config  # noqa: E402
from libreyolo.engine.builder import build_step_context, seed_everything  # noqa: E402
from libreyolo.engine.step import train_step  # noqa: E402
from libreyolo.families import get_family  # noqa: E402


def host_us_per_call(fn, n: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return host


def main() -> None:
    dev = torch.device("cuda")
    print(f"cpus in affinity {len(os.sched_getaffinity(0))}, torch threads {torch.get_num_threads()}, "
          f"{torch.cuda.get_device_name(dev)}, torch {torch.__version__}")
    x = torch.zeros(1024, device=dev)
    host_us_per_call(lambda: x.add_(1), 100)
    print(f"x.add_(1): {host_us_per_call(lambda: x.add_(1), 10000):.2f} us host per op")
    torch.backends.cudnn.benchmark = True
    w = torch.randn(64, 64, 3, 3, device=dev).to(memory_format=torch.channels_last)
    a = torch.randn(8, 64, 80, 80, device=dev).to(memory_format=torch.channels_last)
    conv = lambda: torch.nn.functional.conv2d(a, w, padding=1)  # noqa: E731
    host_us_per_call(conv, 20)
    print(f"conv2d 8x64x80x80 channels_last: {host_us_per_call(conv, 1000):.2f} us host per call")

    spec = get_family("yolo9")
    cfg = build_config({"model": "yolo9-t", "batch": 8, "imgsz": 640, "amp_dtype": "float16"}, spec.defaults)
    seed_everything(0, False)
    model = spec.build("t", 3).to(dev).to(memory_format=torch.channels_last).train()
    ctx = build_step_context(cfg, spec, model, dev)
    batch = synthetic_batch(8, 640)
    step = lambda: train_step(ctx, batch, update=True)  # noqa: E731
    host_us_per_call(step, 15)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    host = host_us_per_call(step, 20) / 1e3
    wall = (time.perf_counter() - t0) / 20 * 1e3
    print(f"eager YOLOv9-t b8 640 float16 step: host {host:.1f} ms to enqueue, wall {wall:.1f} ms")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))


if __name__ == "__main__":
    main()
