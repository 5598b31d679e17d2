"""The precision rules as a table (family default x user amp x amp_dtype x device x bf16 support)."""

import itertools

import pytest
import torch

from libreyolo.config import build_config
from libreyolo.engine.precision import Precision, Resolution, resolve
from libreyolo.errors import ConfigError

F16, BF16 = torch.float16, torch.bfloat16

# (amp, amp_dtype, device, bf16 native) -> (autocast dtype, scaler, message fragment or None)
TABLE = {
    (False, "float16", "cuda", True): (None, False, None),
    (False, "bfloat16", "cuda", True): (None, False, None),
    (False, "float16", "cuda", False): (None, False, None),
    (False, "bfloat16", "cuda", False): (None, False, None),
    (False, "float16", "cpu", False): (None, False, None),
    (False, "bfloat16", "cpu", False): (None, False, None),
    (True, "float16", "cuda", True): (F16, True, None),
    (True, "float16", "cuda", False): (F16, True, None),
    (True, "bfloat16", "cuda", True): (BF16, False, None),
    (True, "bfloat16", "cuda", False): (F16, True, "not native on this GPU; using float16 with loss scaling"),
    (True, "float16", "cpu", False): (None, False, "amp=True needs a CUDA device; training in float32 on cpu"),
    (True, "bfloat16", "cpu", False): (None, False, "amp=True needs a CUDA device; training in float32 on cpu"),
}


def test_table_covers_every_combination():
    combos = {(a, d, dev, n) for a, d, dev, n in itertools.product((False, True), ("float16", "bfloat16"),
                                                                   ("cuda", "cpu"), (True, False))
              if not (dev == "cpu" and n)}  # a CPU never has "native bf16" in this sense
    assert combos == set(TABLE)


@pytest.mark.parametrize("key", sorted(TABLE, key=str))
def test_resolution(key):
    dtype, scaler, message = TABLE[key]
    got = resolve(*key)
    assert isinstance(got, Resolution)
    assert got.dtype is dtype and got.scaler is scaler
    if message is None:
        assert got.message is None
    else:
        assert message in got.message


def test_bad_dtype_is_a_config_error():
    with pytest.raises(ConfigError, match="amp_dtype"):
        resolve(True, "float8", "cuda", True)


@pytest.mark.parametrize("family_amp,user_amp,expected", [(True, None, True), (False, None, False),
                                                          (False, True, True), (True, False, False)])
def test_family_default_then_user(family_amp, user_amp, expected):
    """A family's `amp` default applies unless the user sets amp (the mechanism, with a test family)."""
    user = {} if user_amp is None else {"amp": user_amp}
    cfg = build_config(user, {"amp": family_amp})
    assert cfg.amp is expected
    res = resolve(cfg.amp, cfg.amp_dtype, "cuda", True)
    assert (res.dtype is F16) is expected


def test_cpu_precision_object():
    p = Precision.create(True, "bfloat16", torch.device("cpu"))
    assert p.describe() == "float32" and not p.scaler_enabled
    assert "needs a CUDA device" in p.message
    with p.autocast():
        assert torch.ones(2, 2) @ torch.ones(2, 2) is not None
    state = p.state_dict()
    assert state == {"dtype": None, "scaler_enabled": False, "scaler": {}, "skipped": 0}
    q = Precision.create(False, "float16", torch.device("cpu"))
    q.load_state_dict(state)
    assert q.skipped_steps() == 0


def test_cpu_step_clips_and_zeroes():
    p = Precision.create(False, "float16", torch.device("cpu"))
    w = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([w], lr=1.0)
    p.backward((w * 100).sum())
    grad = w.grad
    p.step(opt, [w], clip_grad=1.0)
    assert torch.allclose(w.detach(), 1 - torch.full((3,), 3 ** -0.5), atol=1e-5)  # grad norm clipped to 1
    assert w.grad is grad and not w.grad.any()  # zeroed in place: a CUDA graph accumulates into it
