"""RTMDet on CUDA: a determinism baseline for the shared head convs, whose gradient is a sum over
three pyramid levels (the sync-free check for every family is in test_families_gpu.py)."""

import copy

import pytest
import torch
from testkit import gpu_targets

from libreyolo.families.rtmdet import build, criterion


def _step(model, crit, images, targets, dtype):
    with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):  # the loss opts out itself
        preds = model.forward_train(model.capturable(images), targets)
        loss, items = crit(preds, targets)
    loss.backward()
    return loss.detach(), items


def _shared_conv_grads(model, crit, images, targets):
    model.zero_grad(set_to_none=True)
    _step(model, crit, images, targets, None)
    head = model.net.head
    return [m.conv.weight.grad.clone() for m in (*head.cls_convs, *head.reg_convs)]


@pytest.mark.gpu
def test_shared_conv_gradients_eager_determinism_baseline():
    """Two eager float32 runs from identical weights on one batch: the relative difference of
    the shared conv gradients (sum of three per-level contributions) is printed as the baseline
    a graphed run (a different accumulation order) will later be compared against."""
    torch.manual_seed(0)
    device = torch.device("cuda")
    model_a = build("t", 5).to(device).train()
    model_b = copy.deepcopy(model_a)
    crit = criterion(model_a, None)
    images = torch.rand(4, 3, 128, 128, device=device)
    targets = gpu_targets(device)
    grads_a = _shared_conv_grads(model_a, crit, images, targets)
    grads_b = _shared_conv_grads(model_b, crit, images, targets)
    rel = [((ga - gb).norm() / ga.norm().clamp(min=1e-30)).item() for ga, gb in zip(grads_a, grads_b)]
    print(f"rtmdet shared-conv grad rel diff, eager vs eager: max {max(rel):.3e} per conv {rel}")
    assert all(g.abs().sum() > 0 for g in grads_a)
    assert max(rel) < 1e-3
