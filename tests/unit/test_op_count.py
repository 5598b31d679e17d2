"""benchmarks/op_count.py: operators per step phase, counted on the real step."""

import sys
from pathlib import Path

from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import op_count  # noqa: E402


def test_counts_land_in_the_phase_that_dispatched_them(one_thread):
    from libreyolo.engine.builder import build_model
    from libreyolo.model import LibreYOLO

    record = op_count.count("yolox-n", batch=2, imgsz=64, device="cpu")
    ops, top = record["ops"], record["by_name"]
    assert record["total_ops"] == sum(ops.values())
    assert all(ops[p] > 0 for p in ("h2d", "forward", "loss", "backward", "optimizer", "ema"))
    convs = sum(isinstance(m, nn.Conv2d) for m in build_model(LibreYOLO("yolox-n").source, 3).modules())
    assert top["forward"]["convolution"] == convs  # one dispatch per conv, all in `forward`
    assert top["backward"]["convolution_backward"] == convs
    assert record["views"]["forward"] > 0  # views are counted apart from the operators
    table = op_count.table([record])
    assert table.splitlines()[2].startswith("| yolox-n | ") and table.splitlines()[2].endswith(f"| {record['total_ops']} |")


def test_the_step_is_launch_light_by_design(one_thread):
    """What must not grow with the model: the optimizer and EMA work on flat tensors and foreach
    lists (the same operator count for nano and s, whose parameter tensors differ in number and
    10x in size), and the forward has no per-norm batch-counter increments."""
    from libreyolo.engine.builder import build_model
    from libreyolo.model import LibreYOLO

    nano, small = (op_count.count(m, batch=2, imgsz=64, device="cpu") for m in ("yolox-n", "yolox-s"))
    tensors = [sum(1 for _ in build_model(LibreYOLO(m).source, 3).parameters()) for m in ("yolox-n", "yolox-s")]
    assert tensors[0] != tensors[1]
    assert nano["ops"]["optimizer"] == small["ops"]["optimizer"] and nano["ops"]["ema"] == small["ops"]["ema"] == 1
    assert "add_" not in nano["by_name"]["forward"]  # BatchNorm's num_batches_tracked += 1, once per norm
