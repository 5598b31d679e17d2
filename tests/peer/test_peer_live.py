"""Live comparisons with Ultralytics (the peer trainer), where it is installed (AGPL: imported at
run time only, never copied). Run with a Python that has ultralytics==8.4.190, e.g.

    YOLO_OFFLINE=1 YOLO_CONFIG_DIR=/tmp/ultra-cfg /path/to/peer-venv/bin/python -m pytest -m peer tests/peer

The recorded numbers (tests/fixtures/peer) come from benchmarks/peer_compare.py.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.peer

os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("YOLO_CONFIG_DIR", str(Path(tempfile.gettempdir()) / "ultra-cfg"))
ultralytics = pytest.importorskip("ultralytics")

import peer_inputs  # noqa: E402
import torch  # noqa: E402

from libreyolo.families import yolo9  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _peer():
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import peer_compare

    return peer_compare


@pytest.fixture(scope="module")
def models(one_thread):
    pc = _peer()
    return pc.their_model(peer_inputs.NC), yolo9.build("t", peer_inputs.NC)


def test_recorded_version():
    assert ultralytics.__version__ == "8.4.190", "the fixtures were recorded with 8.4.190"


def test_body_params_live(models):
    theirs, ours = models
    assert sum(p.numel() for p in theirs.model[:-1].parameters()) == \
        sum(p.numel() for n, p in ours.net.named_parameters() if not n.startswith("head."))


def _losses(models, case):
    from ultralytics.utils.loss import v8DetectionLoss

    pc = _peer()
    theirs, ours = models
    preds = peer_inputs.make_preds(case)
    targets = peer_inputs.make_targets(case)
    pt = [p.clone().requires_grad_(True) for p in preds]
    lt, _ = v8DetectionLoss(theirs)(pc.their_preds(pt), pc.their_batch(targets, peer_inputs.IMGSZ))
    lt.sum().backward()
    po = [p.clone().requires_grad_(True) for p in preds]
    lo, _ = yolo9.criterion(ours)(po, targets)
    lo.backward()
    num = sum(float((a.grad - b.grad).square().sum()) for a, b in zip(po, pt)) ** 0.5
    den = sum(float(b.grad.square().sum()) for b in pt) ** 0.5
    return float(lt.sum().detach()), float(lo.detach()), num / den


def test_loss_live_large(models):
    theirs, ours, grad_rel = _losses(models, "large")
    assert ours == pytest.approx(theirs, rel=1e-5)
    assert grad_rel < 1e-5


def test_loss_live_small(models):
    theirs, ours, grad_rel = _losses(models, "small")
    assert ours == pytest.approx(theirs, rel=1e-3)


def test_epoch_lr_live():
    from types import SimpleNamespace

    from ultralytics.engine.trainer import BaseTrainer

    from libreyolo.config import TrainConfig
    from libreyolo.engine.schedule import LRSchedule

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.01)
    stub = SimpleNamespace(args=SimpleNamespace(cos_lr=False, lrf=0.01), epochs=5, optimizer=opt)
    BaseTrainer._setup_scheduler(stub)
    ours = LRSchedule(opt, TrainConfig(epochs=5), steps_per_epoch=100)
    assert [ours.epoch_lr(e) / 0.01 for e in range(5)] == pytest.approx([stub.lf(e) for e in range(5)])
