from types import SimpleNamespace

import pytest
import torch
from torch import nn

from libreyolo.engine.optim import (
    AUTO_MAX_ADAMW_STEPS,
    VIEW_ALIGN_BYTES,
    accumulate_steps,
    build_optimizer,
    implementation_kwargs,
    param_groups,
    resolve_accumulate,
)
from libreyolo.errors import ConfigError


def tiny_model():
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, bias=False), nn.BatchNorm2d(8), nn.SiLU(),
        nn.Conv2d(8, 4, 1), nn.Flatten(), nn.Linear(4, 2),
    )


def cfg(**kw):
    base = {"optimizer": "sgd", "lr0": 0.01, "momentum": 0.937, "weight_decay": 5e-4, "batch": 16, "nbs": 64,
            "accumulate": "auto"}
    return SimpleNamespace(**{**base, **kw})


def test_accumulate_steps():
    assert accumulate_steps(16, 64) == 4
    assert accumulate_steps(64, 64) == 1
    assert accumulate_steps(128, 64) == 1
    assert accumulate_steps(24, 64) == 3


def train_cfg(**kw):
    from libreyolo.config import build_config

    return build_config({"model": "yolo9-t", "data": "shapes", **kw})


def test_accumulate_auto_drops_accumulation_in_short_runs_and_says_so():
    # 64 images at batch 8 for 50 epochs: 8 batches an epoch, 50 optimizer steps at nbs=64.
    cfg_, line = resolve_accumulate(train_cfg(batch=8, epochs=50), 8, explicit=frozenset({"batch", "epochs"}))
    assert cfg_.accumulate == 1
    assert line.startswith("accumulate=auto: 1 batch per optimizer step instead of round(nbs/batch) = 8")
    assert "400 optimizer steps instead of 50" in line


def test_accumulate_auto_keeps_the_run_at_the_threshold_and_long_runs_at_nbs():
    # 30,000 batches: 3 accumulated keep 10,000 steps; the nominal 8 would leave 3,750.
    cfg_, line = resolve_accumulate(train_cfg(batch=8, epochs=30), 1000, explicit=frozenset())
    assert cfg_.accumulate == 30_000 // AUTO_MAX_ADAMW_STEPS == 3 and "3 batches" in line
    # At the threshold the rule meets round(nbs/batch): no jump where a run becomes long.
    spe = AUTO_MAX_ADAMW_STEPS * 8 // 10
    cfg_, line = resolve_accumulate(train_cfg(batch=8, epochs=10), spe, explicit=frozenset())
    assert (cfg_.accumulate, line) == (8, None)
    cfg_, line = resolve_accumulate(train_cfg(batch=8, epochs=10), spe + 8, explicit=frozenset())
    assert (cfg_.accumulate, line) == (8, None)


@pytest.mark.parametrize("given, explicit, expected", [
    ({"nbs": 32}, {"nbs"}, 4),              # nbs given: round(nbs/batch), as typed
    ({"accumulate": 2}, {"accumulate"}, 2),  # accumulate given: kept
    ({}, None, 8),                          # a resume of a run from before the key: round(nbs/batch)
])
def test_accumulate_given_or_resumed_is_kept(given, explicit, expected):
    cfg_, line = resolve_accumulate(train_cfg(batch=8, epochs=50, **given), 8,
                                    explicit=None if explicit is None else frozenset(explicit))
    assert (cfg_.accumulate, line) == (expected, None)


def test_weight_decay_stays_per_image_without_accumulation():
    # accumulate 1 at batch 8: a step sees 8 of the 64 nominal images, so 1/8 of the decay.
    opt = build_optimizer(tiny_model(), cfg(batch=8, accumulate=1), device_type="cpu")
    assert opt.param_groups[0]["weight_decay"] == pytest.approx(5e-4 * 8 / 64)


def test_param_groups_split_weights_norms_and_biases():
    model = tiny_model()
    groups = param_groups(model)
    ids = {k: {id(p) for p in v} for k, v in groups.items()}
    assert ids["weights"] == {id(model[0].weight), id(model[3].weight), id(model[5].weight)}
    assert ids["norm"] == {id(model[1].weight)}
    assert ids["bias"] == {id(model[1].bias), id(model[3].bias), id(model[5].bias)}


def test_sgd_groups_names_decay_and_momentum():
    opt = build_optimizer(tiny_model(), cfg(batch=16), device_type="cpu")
    assert isinstance(opt, torch.optim.SGD)
    assert [g["name"] for g in opt.param_groups] == ["weights", "norm", "bias"]
    # batch 16 accumulates 4 -> 64 images per step == nbs, decay unchanged.
    assert [g["weight_decay"] for g in opt.param_groups] == [pytest.approx(5e-4), 0.0, 0.0]
    assert opt.param_groups[0]["nesterov"] and opt.param_groups[0]["momentum"] == 0.937
    assert all(g["lr"] == 0.01 for g in opt.param_groups)


def test_weight_decay_scales_with_the_effective_batch():
    opt = build_optimizer(tiny_model(), cfg(batch=128), device_type="cpu")
    assert opt.param_groups[0]["weight_decay"] == pytest.approx(5e-4 * 128 / 64)
    opt = build_optimizer(tiny_model(), cfg(batch=24), device_type="cpu")
    assert opt.param_groups[0]["weight_decay"] == pytest.approx(5e-4 * 24 * 3 / 64)


def test_adamw_uses_momentum_as_beta1():
    opt = build_optimizer(tiny_model(), cfg(optimizer="AdamW", lr0=0.001), device_type="cpu")
    assert isinstance(opt, torch.optim.AdamW)
    assert opt.param_groups[0]["betas"] == (0.937, 0.999)


def test_frozen_parameters_are_left_out_and_empty_groups_dropped():
    model = nn.Linear(3, 2, bias=False)
    opt = build_optimizer(model, cfg(), device_type="cpu")
    assert [g["name"] for g in opt.param_groups] == ["weights"]
    model.weight.requires_grad_(False)
    with pytest.raises(ConfigError):
        build_optimizer(model, cfg(), device_type="cpu")


def test_bad_optimizer_name_is_a_one_line_config_error():
    with pytest.raises(ConfigError) as info:
        build_optimizer(tiny_model(), cfg(optimizer="lion"), device_type="cpu")
    assert "\n" not in str(info.value) and "lion" in str(info.value)


def test_implementation_is_fused_on_cuda_where_supported():
    assert implementation_kwargs(torch.optim.SGD, "cpu") == {}
    assert implementation_kwargs(torch.optim.AdamW, "cuda") == {"fused": True}

    class OldStyle(torch.optim.Optimizer):  # no fused argument: fall back to foreach
        def __init__(self, params, lr=0.1, foreach=None):
            super().__init__(params, {"lr": lr})

    assert implementation_kwargs(OldStyle, "cuda") == {"foreach": True}


def test_sgd_step_runs():
    model = tiny_model()
    opt = build_optimizer(model, cfg(), device_type="cpu")
    before = model[0].weight.detach().clone()
    model(torch.randn(2, 3, 3, 3)).sum().backward()
    opt.step()
    assert not torch.equal(before, model[0].weight)


def test_skipped_first_fused_step_leaves_finite_momentum():
    """GradScaler skipping the very first step (float16 overflow) must not poison SGD momentum."""
    from libreyolo.engine.optim import zero_momentum_buffers

    p = torch.nn.Parameter(torch.ones(4096))
    opt = torch.optim.SGD([p], lr=0.1, momentum=0.9, nesterov=True, fused=True)
    zero_momentum_buffers(opt)
    p.grad = torch.ones(4096)
    opt.grad_scale, opt.found_inf = None, torch.ones(())  # what GradScaler.step passes on overflow
    opt.step()
    del opt.grad_scale, opt.found_inf
    assert torch.equal(p.detach(), torch.ones(4096))
    assert torch.equal(opt.state[p]["momentum_buffer"], torch.zeros(4096))
    opt.step()  # the first real step: same as torch's own first step, buf = grad
    assert torch.allclose(p.detach(), torch.ones(4096) - 0.1 * (1 + 0.9) * 1.0)


def test_zero_momentum_start_matches_torch_first_step():
    from libreyolo.engine.optim import zero_momentum_buffers

    a = torch.nn.Parameter(torch.randn(64))
    b = torch.nn.Parameter(a.detach().clone())
    opt_a = torch.optim.SGD([a], lr=0.05, momentum=0.937, nesterov=True)
    opt_b = torch.optim.SGD([b], lr=0.05, momentum=0.937, nesterov=True)
    zero_momentum_buffers(opt_b)
    for _ in range(3):
        g = torch.randn(64)
        a.grad, b.grad = g.clone(), g.clone()
        opt_a.step()
        opt_b.step()
    assert torch.allclose(a, b)


def test_flat_groups_keep_every_parameter_as_a_view():
    model = tiny_model().to(memory_format=torch.channels_last)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    strides = {n: p.stride() for n, p in model.named_parameters()}
    opt = build_optimizer(model, cfg(), device_type="cpu")
    flats = [g["params"] for g in opt.param_groups]
    assert [len(f) for f in flats] == [1, 1, 1]
    groups = dict(zip(("weights", "norm", "bias"), (f[0] for f in flats)))
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]) and p.stride() == strides[name]  # channels_last kept
    conv = model[0].weight
    assert conv.is_contiguous(memory_format=torch.channels_last)
    assert conv.untyped_storage().data_ptr() == groups["weights"].untyped_storage().data_ptr()
    assert conv.grad.untyped_storage().data_ptr() == groups["weights"].grad.untyped_storage().data_ptr()
    owner = {id(p): flat for group, flat in groups.items() for p in param_groups(model)[group]}
    for p in model.parameters():  # every view starts as far into its flat tensor as an allocation would
        flat = owner[id(p)]
        assert (p.data_ptr() - flat.data_ptr()) % VIEW_ALIGN_BYTES == 0
        assert (p.grad.data_ptr() - flat.grad.data_ptr()) % VIEW_ALIGN_BYTES == 0
    weights = [model[i].weight for i in (0, 3, 5)]
    align = VIEW_ALIGN_BYTES // 4
    assert groups["weights"].numel() == sum(-(-w.numel() // align) * align for w in weights)
    gaps = torch.ones_like(groups["weights"], dtype=torch.bool)
    for w in weights:
        start = (w.data_ptr() - groups["weights"].data_ptr()) // 4
        gaps[start:start + w.numel()] = False
    assert gaps.any() and not groups["weights"][gaps].any()  # the padding holds zeros
    with torch.no_grad():  # an update of the flat tensor is an update of the parameters
        groups["bias"].add_(1.0)
    assert torch.equal(model[5].bias, before["5.bias"] + 1)


@pytest.mark.parametrize("name, clip", [("sgd", 0.0), ("sgd", 1.0), ("adamw", 0.0)])
def test_flat_optimizer_trains_like_per_parameter(name, clip):
    from libreyolo.engine.precision import Precision

    torch.manual_seed(0)
    model = tiny_model()
    ref = tiny_model()
    ref.load_state_dict(model.state_dict())
    c = cfg(batch=64, optimizer=name)
    opt = build_optimizer(model, c, device_type="cpu")
    groups = param_groups(ref)
    ref_groups = [{"params": groups["weights"], "weight_decay": 5e-4},
                  {"params": groups["norm"], "weight_decay": 0.0},
                  {"params": groups["bias"], "weight_decay": 0.0}]
    ref_opt = (torch.optim.SGD(ref_groups, lr=0.01, momentum=0.937, nesterov=True) if name == "sgd"
               else torch.optim.AdamW(ref_groups, lr=0.01, betas=(0.937, 0.999)))
    precision = Precision.create(False, "float16", torch.device("cpu"))
    flat_params = [p for g in opt.param_groups for p in g["params"]]
    for i in range(5):
        x = torch.randn(4, 3, 3, 3, generator=torch.Generator().manual_seed(i))
        for m, o, params in ((model, opt, flat_params), (ref, ref_opt, list(ref.parameters()))):
            precision.backward(m(x).square().mean())
            precision.step(o, params, clip_grad=clip)
    for a, b in zip(model.parameters(), ref.parameters()):
        # Element-wise updates are the same numbers; clipping's norm sums in another order.
        exact = not clip
        torch.testing.assert_close(a, b, rtol=0 if exact else 1e-6, atol=0 if exact else 1e-7)
    assert all(not p.grad.any() for p in model.parameters())  # zeroed in place, still views


def test_flat_optimizer_state_round_trips():
    torch.manual_seed(0)
    model, twin = tiny_model(), tiny_model()
    twin.load_state_dict(model.state_dict())
    opt, opt2 = (build_optimizer(m, cfg(batch=64), device_type="cpu") for m in (model, twin))
    model(torch.randn(2, 3, 3, 3)).sum().backward()
    opt.step()
    opt2.load_state_dict(opt.state_dict())
    twin.load_state_dict(model.state_dict())  # copies into the views: still one flat tensor per group
    for a, b in zip(opt.param_groups, opt2.param_groups):
        assert torch.equal(opt.state[a["params"][0]]["momentum_buffer"], opt2.state[b["params"][0]]["momentum_buffer"])
        assert torch.equal(a["params"][0], b["params"][0])


def test_backbone_groups_take_backbone_lr_and_keep_the_decay_split():
    model = tiny_model()
    backbone = model[:3]  # conv + norm: its weight, norm weight and norm bias train slower
    opt = build_optimizer(model, cfg(backbone_lr=0.1), device_type="cpu", backbone=backbone)
    names = [g["name"] for g in opt.param_groups]
    # the only norm is in the backbone, so the model's own "norm" group is empty and left out
    assert names == ["weights", "backbone.weights", "backbone.norm", "bias", "backbone.bias"]
    scales = {g["name"]: g["lr_scale"] for g in opt.param_groups}
    assert scales == {"weights": 1.0, "bias": 1.0, "backbone.weights": 0.1, "backbone.norm": 0.1,
                      "backbone.bias": 0.1}
    decay = {g["name"]: g["weight_decay"] for g in opt.param_groups}
    assert decay["backbone.weights"] == decay["weights"] > 0 and decay["backbone.norm"] == decay["backbone.bias"] == 0
    sizes = {g["name"]: g["params"][0].numel() for g in opt.param_groups}
    assert sizes["backbone.weights"] >= model[0].weight.numel() and sizes["weights"] >= model[3].weight.numel()
    # backbone_lr 1 (or no backbone) keeps the three plain groups
    same = build_optimizer(tiny_model(), cfg(backbone_lr=1.0), device_type="cpu", backbone=backbone)
    assert [g["name"] for g in same.param_groups] == ["weights", "norm", "bias"]


def test_handed_over_gradients_sum_as_autograds_own_adds_in_fewer_launches():
    """GradHandoff: the same gradients, bit for bit, over an accumulation of three micro-batches,
    with one foreach add instead of an in-place add per parameter."""
    import copy

    from torch.utils._python_dispatch import TorchDispatchMode

    from libreyolo.config import build_config
    from libreyolo.engine.builder import build_step_context
    from libreyolo.engine.optim import GradHandoff
    from libreyolo.engine.step import train_step
    from libreyolo.families import get_family

    class Adds(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.add_.Tensor:
                Adds.count += 1
            return func(*args, **(kwargs or {}))

    from testkit import box_batch

    spec = get_family("yolo9")
    torch.manual_seed(0)
    model = spec.build("t", 3).train()
    cfg = build_config({"device": "cpu", "imgsz": 64, "batch": 2, "optimizer": "sgd"})
    handed = build_step_context(cfg, spec, model, torch.device("cpu"))
    plain = build_step_context(cfg, spec, copy.deepcopy(model), torch.device("cpu"))
    assert handed.handoff is None  # CUDA runs without graphs only; built here as one builds it
    handed.handoff = GradHandoff(handed.optimizer)
    adds = {}
    for name, ctx in (("handed", handed), ("plain", plain)):
        Adds.count = 0
        with Adds():
            for i in range(3):
                train_step(ctx, box_batch(i, 5), update=i == 2)
        adds[name] = Adds.count
    members = sum(len(p.members) for p in handed.params)
    assert adds["plain"] - adds["handed"] == 3 * members, adds
    for a, b in zip(handed.params, plain.params):
        assert torch.equal(a, b)
    # Between steps every parameter's gradient is its view of the flat one again.
    for merged in handed.params:
        for p in merged.members:
            assert p.grad is not None and p.grad.data_ptr() >= merged.grad.data_ptr()
