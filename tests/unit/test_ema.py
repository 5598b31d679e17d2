import math

import pytest
import torch
from torch import nn

from libreyolo.engine.ema import ModelEMA


def tiny_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.SiLU(), nn.Conv2d(4, 2, 1))


def perturb(model, scale=0.1):
    with torch.no_grad():
        for t in list(model.parameters()) + [model[1].running_mean, model[1].running_var]:
            t.add_(torch.randn_like(t) * scale)
        model[1].num_batches_tracked += 3


def test_copy_is_eval_mode_without_grad_and_independent():
    model = tiny_model().train()
    ema = ModelEMA(model)
    assert not ema.ema.training
    assert not any(p.requires_grad for p in ema.ema.parameters())
    assert ema.ema[0].weight.data_ptr() != model[0].weight.data_ptr()


def test_ramp_values():
    ema = ModelEMA(tiny_model(), decay=0.9999, tau=2000)
    assert ema.current_decay(0) == 0.0
    assert ema.current_decay(2000) == pytest.approx(0.9999 * (1 - math.exp(-1)))
    assert ema.current_decay(10**6) == pytest.approx(0.9999)
    # The first update copies the model almost exactly (d ~ 5e-4).
    model = tiny_model()
    perturb(model, 1.0)
    ema.update(model)
    assert ema.updates == 1
    assert torch.allclose(ema.ema[0].weight, model[0].weight, atol=5e-3)


def test_converges_to_constant_weights_and_copies_buffers():
    model = tiny_model()
    ema = ModelEMA(model, decay=0.9, tau=1.0)
    perturb(model, 1.0)
    for _ in range(300):
        ema.update(model)
    for e, m in zip(ema.ema.state_dict().values(), model.state_dict().values()):
        assert torch.allclose(e.float(), m.float(), atol=1e-6)
    assert ema.ema[1].num_batches_tracked.item() == model[1].num_batches_tracked.item() == 3


def test_foreach_equals_a_naive_loop():
    model = tiny_model()
    ema = ModelEMA(model, decay=0.99, tau=3.0)
    reference = {k: v.clone() for k, v in ema.ema.state_dict().items()}
    for step in range(1, 6):
        perturb(model)
        ema.update(model)
        d = 0.99 * (1 - math.exp(-step / 3.0))
        for k, m in model.state_dict().items():
            if m.is_floating_point():
                reference[k] = d * reference[k] + (1 - d) * m
            else:
                reference[k] = m.clone()
    for k, v in ema.ema.state_dict().items():
        assert torch.allclose(v, reference[k], atol=1e-6), k


def test_state_round_trip_and_identical_continuation():
    model = tiny_model()
    ema = ModelEMA(model, decay=0.99, tau=5.0)
    for _ in range(4):
        perturb(model)
        ema.update(model)
    restored = ModelEMA(tiny_model(), decay=0.5, tau=1.0)
    restored.load_state_dict(ema.state_dict())
    assert restored.updates == 4 and restored.decay == 0.99 and restored.tau == 5.0
    perturb(model)
    ema.update(model)
    restored.update(model)
    for a, b in zip(ema.ema.state_dict().values(), restored.ema.state_dict().values()):
        assert torch.equal(a, b)


def test_wrapped_model_is_unwrapped():
    model = tiny_model()
    ema = ModelEMA(nn.DataParallel(model), decay=0.9, tau=1.0)
    assert not any(k.startswith("module.") for k in ema.state_dict()["ema"])
    perturb(model, 1.0)
    for _ in range(200):
        ema.update(nn.DataParallel(model))
    assert torch.allclose(ema.ema[0].weight, model[0].weight, atol=1e-6)


def test_mismatched_model_is_rejected():
    ema = ModelEMA(tiny_model())
    with pytest.raises(ValueError):
        ema.update(nn.Linear(2, 2))


# --- the ema_tau key ---------------------------------------------------------------------------

def test_ema_tau_default_is_the_long_ramp_and_a_short_run_ends_far_below_full_decay():
    from libreyolo.config import TrainConfig
    from libreyolo.engine.ema import EMA_TAU

    assert TrainConfig().ema_tau == EMA_TAU == 2000.0
    ema = ModelEMA(tiny_model(), tau=TrainConfig().ema_tau)
    assert ema.current_decay(500) == pytest.approx(0.22, abs=0.005)  # what the key's doc says


@pytest.mark.parametrize("value", [0, -1, "auto", True])
def test_ema_tau_bad_values_are_one_line(value):
    from libreyolo.config import build_config
    from libreyolo.errors import ConfigError

    with pytest.raises(ConfigError, match="bad value for 'ema_tau'"):
        build_config({"ema_tau": value})
