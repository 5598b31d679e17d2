import itertools
from types import SimpleNamespace

import pytest
from torch import nn

from libreyolo.engine.optim import build_optimizer
from libreyolo.engine.schedule import LRSchedule
from libreyolo.errors import ConfigError


def cfg(**kw):
    base = {
        "optimizer": "sgd", "lr0": 0.01, "lrf": 0.01, "lr_schedule": "cosine", "epochs": 10,
        "momentum": 0.937, "weight_decay": 5e-4, "batch": 16, "nbs": 64, "accumulate": "auto", "warmup_epochs": 3.0,
        "warmup_momentum": 0.8, "warmup_bias_lr": 0.1,
    }
    return SimpleNamespace(**{**base, **kw})


def make(c, steps_per_epoch=50, accumulate=4):
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4))
    opt = build_optimizer(model, c, device_type="cpu")
    return opt, LRSchedule(opt, c, steps_per_epoch, accumulate)


def lrs(opt):
    return {g["name"]: g["lr"] for g in opt.param_groups}


def test_warmup_endpoints_and_bias_group():
    opt, sched = make(cfg())
    assert sched.warmup_batches == 150  # 3 epochs x 50 batches
    sched.step(0)
    assert lrs(opt) == {"weights": 0.0, "norm": 0.0, "bias": pytest.approx(0.1)}
    assert opt.param_groups[0]["momentum"] == pytest.approx(0.8)
    sched.step(75)  # halfway, still epoch 1 (target lr0 * cosine factor of epoch 1)
    target = sched.epoch_lr(1)
    assert lrs(opt)["weights"] == pytest.approx(target / 2)
    assert lrs(opt)["bias"] == pytest.approx((0.1 + target) / 2)
    assert opt.param_groups[2]["momentum"] == pytest.approx((0.8 + 0.937) / 2)
    sched.step(150)
    assert list(lrs(opt).values()) == pytest.approx([sched.epoch_lr(3)] * 3)
    assert opt.param_groups[1]["momentum"] == pytest.approx(0.937)


def test_warmup_counts_epochs_cap_and_no_warmup():
    _, sched = make(cfg(warmup_epochs=3.0, epochs=100), steps_per_epoch=3)
    assert sched.warmup_batches == 9  # 3 epochs of 3 batches: no floor of batches
    _, sched = make(cfg(warmup_epochs=0.1, epochs=20), steps_per_epoch=3)
    assert sched.warmup_batches == 1  # a fraction of an epoch rounds to at least one batch
    _, sched = make(cfg(warmup_epochs=12.0), steps_per_epoch=10)
    assert sched.warmup_batches == 90  # cut at the start of the last of 10 epochs
    _, sched = make(cfg(epochs=1))
    assert sched.warmup_batches == 0  # a one-epoch run never warms up
    opt, sched = make(cfg(warmup_epochs=0))
    assert sched.warmup_batches == 0
    sched.step(0)
    assert list(lrs(opt).values()) == pytest.approx([0.01] * 3)
    assert opt.param_groups[0]["momentum"] == pytest.approx(0.937)


@pytest.mark.parametrize("kind", ["cosine", "linear"])
def test_decay_endpoints(kind):
    _, sched = make(cfg(lr_schedule=kind, epochs=10))
    assert sched.epoch_lr(0) == pytest.approx(0.01)
    assert sched.epoch_lr(10) == pytest.approx(0.01 * 0.01)  # where the run ends, after the last epoch
    assert sched.epoch_lr(5) == pytest.approx((0.01 + 0.0001) / 2)  # both pass the midpoint
    quarter = sched.epoch_lr(2.5)
    if kind == "linear":
        assert quarter == pytest.approx(0.01 - 0.25 * (0.01 - 0.0001))
        assert sched.epoch_lr(9) == pytest.approx(0.0001 + 0.1 * (0.01 - 0.0001))  # the last epoch
    else:  # a cosine stays near lr0 longer
        assert quarter > 0.01 - 0.25 * (0.01 - 0.0001)
    lr = [sched.epoch_lr(e) for e in range(11)]
    assert all(a > b for a, b in itertools.pairwise(lr))


def test_five_epoch_linear_factors():
    """The per-epoch factors of a 5-epoch linear run (lrf 0.01), as the peer trainer uses them."""
    _, sched = make(cfg(lr_schedule="linear", epochs=5, lr0=1.0))
    assert [sched.epoch_lr(e) for e in range(5)] == pytest.approx([1.0, 0.802, 0.604, 0.406, 0.208])


def test_adamw_beta1_is_not_warmed_up():
    opt, sched = make(cfg(optimizer="adamw", lr0=0.001, momentum=0.9))
    for i in (0, 75, 10_000):
        sched.step(i)
        assert opt.param_groups[0]["betas"] == (pytest.approx(0.9), 0.999)


def test_momentum_is_settled_after_sgds_warmup_and_always_for_adamw():
    """cuda_graph=full captures the update once the momentum it bakes in stops changing."""
    opt, sched = make(cfg())  # 3 warmup epochs of 50 batches
    assert [sched.momentum_settled(i) for i in (0, 149, 150, 10_000)] == [False, False, True, True]
    assert sched.momentum_at(3, 0) == sched.momentum_at(9, 49)  # nothing changes it after that
    _, sched = make(cfg(warmup_momentum=0.937))
    assert sched.momentum_settled(0)
    _, sched = make(cfg(optimizer="adamw", lr0=0.001, momentum=0.9))
    assert sched.momentum_settled(0)


@pytest.mark.parametrize("steps,expected", [(500, "adamw"), (10_000, "adamw"), (10_001, "sgd")])
def test_optimizer_auto(steps, expected):
    from dataclasses import replace

    from libreyolo.config import TrainConfig
    from libreyolo.engine.optim import resolve_auto

    base = TrainConfig()
    assert base.optimizer == "auto"
    cfg_, line = resolve_auto(base, 10, steps)
    assert cfg_.optimizer == expected and f"{steps} optimizer steps" in line
    if expected == "adamw":  # 0.002 * 5 / (4 + 10 classes), beta1 0.9, no bias warmup LR
        assert (cfg_.lr0, cfg_.momentum, cfg_.warmup_bias_lr) == (0.000714, 0.9, 0.0)
    else:
        assert (cfg_.lr0, cfg_.momentum, cfg_.warmup_bias_lr) == (base.lr0, base.momentum, base.warmup_bias_lr)
    chosen = replace(base, optimizer="sgd")
    assert resolve_auto(chosen, 10, steps) == (chosen, None)


def test_accumulation_ramps_during_warmup():
    _, sched = make(cfg(), accumulate=4)
    assert sched.accumulate_at(0, 0) == 1
    assert sched.accumulate_at(2, 0) == 3  # 100 of 150 warmup batches: 1 + 3 * 2/3
    assert sched.accumulate_at(3, 0) == 4


def test_resume_continues_the_same_schedule():
    c, spe = cfg(epochs=4), 40
    opt, sched = make(c, steps_per_epoch=spe)
    history = []
    for i in range(4 * spe):
        sched.step(i)
        history.append(list(lrs(opt).values()) + [opt.param_groups[0]["momentum"]])
        if i == 2 * spe + 7:
            saved = sched.state_dict()
    # A fresh optimizer and schedule, as after loading a checkpoint.
    opt2, sched2 = make(c, steps_per_epoch=spe)
    sched2.load_state_dict(saved)
    assert list(lrs(opt2).values()) + [opt2.param_groups[0]["momentum"]] == history[2 * spe + 7]
    for i in range(2 * spe + 8, 4 * spe):
        sched2.step(i)
        assert list(lrs(opt2).values()) + [opt2.param_groups[0]["momentum"]] == history[i]
    # The pure form gives the same numbers without stepping.
    assert sched2.lr_at(3, 5) == history[3 * spe + 5][:3]


def test_step_schedule_is_three_equal_stages():
    """lr_schedule=step with lrf 0.01 is torchvision's ResNet recipe: x0.1 at epochs 30 and 60 of 90."""
    _, sched = make(cfg(lr_schedule="step", epochs=90, lr0=0.1))
    lr = [sched.epoch_lr(e) for e in range(90)]
    assert lr[0] == lr[29] == pytest.approx(0.1)
    assert lr[30] == lr[59] == pytest.approx(0.01)
    assert lr[60] == lr[89] == pytest.approx(0.001)


def test_bad_schedule_name_is_a_config_error():
    with pytest.raises(ConfigError):
        make(cfg(lr_schedule="exponential"))


def test_backbone_groups_follow_the_schedule_scaled():
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4), nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4))
    c = cfg(backbone_lr=0.5)
    opt = build_optimizer(model, c, device_type="cpu", backbone=model[:2])
    sched = LRSchedule(opt, c, 50, 4)
    sched.step(0)  # warmup start: the bias groups from warmup_bias_lr (scaled), the others from 0
    assert lrs(opt) == {"weights": 0.0, "backbone.weights": 0.0, "norm": 0.0, "backbone.norm": 0.0,
                        "bias": pytest.approx(0.1), "backbone.bias": pytest.approx(0.05)}
    sched.step(400)  # epoch 8, past the warmup
    got = lrs(opt)
    for name in ("weights", "norm", "bias"):
        assert got["backbone." + name] == pytest.approx(0.5 * got[name]) and got[name] == pytest.approx(sched.epoch_lr(8))


def test_flat_cosine_holds_lr0_then_falls_along_the_cosine():
    _, sched = make(cfg(lr_schedule="flat_cosine", lr_flat=0.4, epochs=10, lrf=0.1))
    assert [sched.epoch_lr(e) for e in range(5)] == pytest.approx([0.01] * 5)  # epochs 0-4: e/10 <= 0.4
    # after the flat part the cosine runs over the remaining 60 %: epoch 7 is halfway
    assert sched.epoch_lr(7) == pytest.approx(0.01 * (1 + 0.1) / 2)
    assert sched.epoch_lr(9) < sched.epoch_lr(8) < sched.epoch_lr(7)
    _, whole = make(cfg(lr_schedule="flat_cosine", lr_flat=0.0, epochs=10, lrf=0.1))
    _, cosine = make(cfg(lr_schedule="cosine", epochs=10, lrf=0.1))
    assert [whole.epoch_lr(e) for e in range(10)] == pytest.approx([cosine.epoch_lr(e) for e in range(10)])


def test_poly_is_mmsegs_polylr_and_power_one_is_linear():
    _, sched = make(cfg(lr_schedule="poly", lr_power=0.9, epochs=10, lrf=0.0))
    # lr0 * (1 - e / E) ** 0.9 (eta_min 0), constant within an epoch
    assert [sched.epoch_lr(e) for e in (0, 5, 9)] == pytest.approx([0.01, 0.01 * 0.5 ** 0.9, 0.01 * 0.1 ** 0.9])
    _, floor = make(cfg(lr_schedule="poly", lr_power=2.0, epochs=10, lrf=0.1))
    assert floor.epoch_lr(5) == pytest.approx(0.01 * (0.1 + 0.9 * 0.25))
    _, poly = make(cfg(lr_schedule="poly", lr_power=1.0, epochs=10, lrf=0.05))
    _, linear = make(cfg(lr_schedule="linear", epochs=10, lrf=0.05))
    assert [poly.epoch_lr(e) for e in range(10)] == pytest.approx([linear.epoch_lr(e) for e in range(10)])


def test_warmup_iters_counts_batches_instead_of_epochs():
    _, sched = make(cfg(warmup_iters=30, warmup_epochs=3.0), steps_per_epoch=50)
    assert sched.warmup_batches == 30  # exactly, no 100-batch floor, warmup_epochs unused
    _, sched = make(cfg(warmup_iters=1500, warmup_epochs=0.0, epochs=10), steps_per_epoch=50)
    assert sched.warmup_batches == 450  # still cut at the start of the last epoch
