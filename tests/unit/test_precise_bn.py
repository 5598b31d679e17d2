"""precise_bn (engine/precise_bn.py): BatchNorm statistics measured again before validation, on
training images loaded as validation loads them (each task's stats_loader), in every family."""

import logging
from types import SimpleNamespace

import pytest
import torch
from testkit import shapes_subset
from torch import nn

from libreyolo.engine.precise_bn import batch_norms, remeasure_
from libreyolo.families import REGISTRY
from libreyolo.names import arch_name

pytestmark = pytest.mark.usefixtures("one_thread")
CPU = torch.device("cpu")


class Tiny(nn.Module):
    """A model with the family contract's `capturable`, a Dropout and a counter-less BatchNorm."""

    def __init__(self, sync: bool = False):
        super().__init__()
        torch.manual_seed(0)
        bn = nn.SyncBatchNorm if sync else nn.BatchNorm2d
        self.net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), bn(4, momentum=0.03), nn.Dropout(0.5),
                                 nn.Conv2d(4, 4, 1), bn(4, momentum=0.03))
        self.net[4].register_buffer("num_batches_tracked", None)  # as our families keep none

    @property
    def capturable(self) -> nn.Module:
        return self.net


def _batches(n: int, b: int = 2, size: int = 8) -> list:
    g = torch.Generator().manual_seed(1)
    return [SimpleNamespace(images=torch.randint(0, 256, (b, 3, size, size), dtype=torch.uint8, generator=g))
            for _ in range(n)]


def _stats(model) -> list[torch.Tensor]:
    return [t.clone() for b in batch_norms(model) for t in (b.running_mean, b.running_var)]


@pytest.mark.parametrize("sync", [False, True])
def test_the_statistics_become_the_mean_of_the_batches_and_nothing_else_changes(sync):
    model = Tiny(sync).eval()
    weights = {k: v.clone() for k, v in model.state_dict().items() if "running" not in k and "num_batches" not in k}
    buffers = [t.data_ptr() for b in batch_norms(model) for t in (b.running_mean, b.running_var)]
    loader = _batches(2, b=4) + _batches(1, b=2)  # a short last batch counts for its images
    assert remeasure_(model, loader, CPU) == 10
    # In place: a captured EMA update (cuda_graph=full) keeps writing into the same tensors.
    assert buffers == [t.data_ptr() for b in batch_norms(model) for t in (b.running_mean, b.running_var)]
    # Each batch normalised by its own statistics (train-mode BN), each batch one estimate.
    conv = model.net[0]
    with torch.no_grad():
        x = [conv(b.images.float() / 255) for b in loader]
    w = torch.tensor([0.4, 0.4, 0.2]).unsqueeze(1)
    means = (torch.stack([t.mean((0, 2, 3)) for t in x]) * w).sum(0)
    variances = (torch.stack([t.var((0, 2, 3), unbiased=True) for t in x]) * w).sum(0)
    first = model.net[1]
    torch.testing.assert_close(first.running_mean, means, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(first.running_var, variances, rtol=1e-5, atol=1e-6)
    assert all(b.momentum == 0.03 for b in batch_norms(model))  # the training momentum is back
    assert not any(m.training for m in model.modules())  # eval mode, Dropout included
    assert all("forward" not in vars(b) for b in batch_norms(model))  # SyncBatchNorm's own forward is back
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items() if k in weights)


def test_nothing_measured_or_a_failed_batch_leaves_the_statistics_as_they_were():
    model = Tiny().eval()
    model.net[1].running_var.fill_(7.0)
    before = _stats(model)
    assert remeasure_(model, [], CPU) == 0
    assert all(torch.equal(a, b) for a, b in zip(before, _stats(model)))

    def failing():
        yield from _batches(1)
        raise OSError("image vanished")

    with pytest.raises(OSError):
        remeasure_(model, failing(), CPU)
    assert all(torch.equal(a, b) for a, b in zip(before, _stats(model)))
    assert all(b.momentum == 0.03 for b in batch_norms(model)) and not model.training


def test_a_model_without_batch_norm_is_left_alone():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.LayerNorm([4, 6, 6])).eval()
    model.capturable = model
    assert batch_norms(model) == [] and remeasure_(model, _batches(2), CPU) == 0


@pytest.mark.parametrize("family", sorted(REGISTRY))
def test_every_batch_norm_of_every_family_is_reached_by_its_capturable(family):
    """`model.capturable` is what precise_bn runs: every BatchNorm that keeps statistics must lie in
    it, or its statistics would stay the training averages."""
    from libreyolo.model import resolve_model

    spec = REGISTRY[family]
    source = resolve_model(arch_name(spec, spec.sizes[0]))
    torch.manual_seed(0)
    model = source.spec.build(source.size, 3).eval()
    norms = batch_norms(model)
    if not norms:
        pytest.skip(f"{family}: no BatchNorm with running statistics")
    for b in norms:
        b.running_var.fill_(-1.0)  # a value no measured variance takes
    assert remeasure_(model, _batches(1, b=2, size=64), CPU) == 2
    missed = [n for n, b in model.named_modules() if b in norms and bool((b.running_var < 0).any())]
    assert not missed, f"{family}: BatchNorms outside model.capturable: {missed[:5]}"


def test_the_detection_stats_loader_reads_spread_training_images_as_validation_does(tmp_path):
    from libreyolo.config import build_config
    from libreyolo.data import build_stats_loader, build_train_loader, build_val_loader, load_data_config
    from libreyolo.data.loader import spread

    data = load_data_config(shapes_subset(tmp_path, 10))
    cfg = build_config(dict(imgsz=64, batch=3, workers=2, cache="ram"))
    train = build_train_loader(data, cfg)
    stats = build_stats_loader(data, cfg, train, 4, 3)
    assert spread(10, 4) == [0, 2, 5, 7] and spread(3, 8) == [0, 1, 2]
    assert stats.num_images == 4 and stats.loader.num_workers == 0  # no worker processes of its own
    assert stats.dataset.cache.cache is train.dataset.cache  # the training images' cache, not a copy
    data.val = [data.train[i] for i in (0, 2, 5, 7)]
    plain = build_val_loader(data, build_config(dict(imgsz=64, batch=3, workers=0, cache=False)))
    got, want = list(stats), list(plain)
    assert [b.images.shape for b in got] == [b.images.shape for b in want] == [(3, 3, 64, 64), (1, 3, 64, 64)]
    assert all(torch.equal(a.images, b.images) for a, b in zip(got, want))


def test_the_classify_and_segment_stats_loaders_pick_training_images():
    from libreyolo.config import build_config
    from libreyolo.data import (
        build_classify_stats_loader,
        build_segment_stats_loader,
        load_classify_data,
        load_segment_data,
    )

    cfg = build_config(dict(imgsz=64, batch=4, workers=2))
    cls = load_classify_data("shapes-cls")
    loader = build_classify_stats_loader(cls, cfg, None, 6, 4)
    assert loader.num_images == 6 and loader.dataset.files[0] == cls.train[0][0]
    assert next(iter(loader)).images.shape == (4, 3, 64, 64)
    seg = load_segment_data("shapes-seg")
    loader = build_segment_stats_loader(seg, cfg, None, 5, 4)
    assert loader.num_images == 5 and loader.dataset.files[0] == seg.train[0][0]
    assert next(iter(loader)).images.shape == (4, 3, 64, 64)


def test_training_measures_while_mosaic_is_on_and_says_so_once(tmp_path, monkeypatch, caplog):
    from libreyolo import LibreYOLO
    from libreyolo.engine import trainer as trainer_module

    calls = []
    real = trainer_module.remeasure_

    def counting(model, loader, device, amp_dtype=None):
        calls.append((model, loader.num_images))
        return real(model, loader, device, amp_dtype)

    monkeypatch.setattr(trainer_module, "remeasure_", counting)
    (tmp_path / "data").mkdir()
    # Mosaic for epochs 1-2, closed for the third.
    args = dict(data=shapes_subset(tmp_path / "data", 6), imgsz=64, batch=4, device="cpu", workers=0, epochs=3,
                no_aug_epochs=1)
    seen = []

    class Keep(trainer_module.Hook):
        def before_train(self, trainer):
            seen.append(trainer.ema.ema)

    with caplog.at_level(logging.INFO, logger="libreyolo"):
        LibreYOLO("yolox-n").train(project=str(tmp_path / "on"), hooks=[Keep()], **args)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("precise_bn=")]
    assert lines == ["precise_bn=256: while mosaic is on, BatchNorm statistics of the validated weights are "
                     "measured again on 6 training images before each validation (precise_bn=0 keeps the "
                     "running averages)"]
    assert [n for _, n in calls] == [6, 6] and all(m is seen[0] for m, _ in calls)  # the EMA, epochs 1-2
    calls.clear()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="libreyolo"):
        LibreYOLO("yolox-n").train(project=str(tmp_path / "off"), precise_bn=0, **args)
        LibreYOLO("yolox-n").train(project=str(tmp_path / "mosaic0"), mosaic=0.0, **args)
    assert calls == [] and not any(r.getMessage().startswith("precise_bn=") for r in caplog.records)
