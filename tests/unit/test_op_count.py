"""benchmarks/op_count.py: operators per step phase, counted on the real step."""

import sys
from pathlib import Path

from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import op_count  # noqa: E402


def test_counts_land_in_the_phase_that_dispatched_them(one_thread):
    from libreyolo.model import LibreYOLO

    record = op_count.count("yolox-n", batch=2, imgsz=64, device="cpu")
    ops, top = record["ops"], record["top_ops"]
    assert record["total_ops"] == sum(ops.values())
    assert all(ops[p] > 0 for p in ("h2d", "forward", "loss", "backward", "optimizer", "ema"))
    convs = sum(isinstance(m, nn.Conv2d) for m in LibreYOLO("yolox-n")._build(3).modules())
    assert dict(top["forward"])["convolution"] == convs  # one dispatch per conv, all in `forward`
    assert dict(top["backward"])["convolution_backward"] == convs
    assert record["views"]["forward"] > 0  # views are counted apart from the operators
    table = op_count.table([record])
    assert table.splitlines()[2].startswith("| yolox-n | ") and table.splitlines()[2].endswith(f"| {record['total_ops']} |")
