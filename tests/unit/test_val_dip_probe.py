"""benchmarks/val_dip_probe.py: BatchNorm statistics re-measured on a copy, and the layer furthest off."""

import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import val_dip_probe  # noqa: E402


class _Model(nn.Module):
    """Two convolutions and two counter-less BatchNorms behind the family contract's `capturable`."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 4, 1),
                                 nn.BatchNorm2d(4, track_running_stats=True))
        self.net[4].register_buffer("num_batches_tracked", None)  # as our families leave the counter out

    @property
    def capturable(self) -> nn.Module:
        return self.net


def _net() -> nn.Module:
    return _Model().eval()


def test_recalibration_measures_the_images_and_leaves_the_model_alone():
    net = _net()
    net.net[1].running_var.fill_(100.0)  # stale statistics in the first norm only
    before = {k: v.clone() for k, v in net.state_dict().items()}
    images = [torch.randint(0, 256, (2, 3, 8, 8), dtype=torch.uint8) for _ in range(3)]
    loader = [SimpleNamespace(images=x) for x in images]
    recal = val_dip_probe._recalibrated(net, loader, torch.device("cpu"))
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())  # a copy was measured
    assert not recal.training and not any(m.training for m in recal.modules())
    # A cumulative average over equal batches: the mean of the batches' channel means.
    conv = net.net[0]
    means = torch.stack([conv(x.float() / 255).mean((0, 2, 3)) for x in images]).mean(0)
    torch.testing.assert_close(recal.net[1].running_mean, means, rtol=1e-5, atol=1e-6)
    gap = val_dip_probe._var_gap(net, recal)
    assert gap["layer"] == "net.1" and gap["max_log_var_ratio"] > 3.0  # log(100 / ~0.1)
    assert val_dip_probe._var_gap(recal, recal)["max_log_var_ratio"] == 0.0
