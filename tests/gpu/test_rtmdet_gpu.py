"""RTMDet on CUDA: forward + loss + backward perform no host synchronisation (sync debug mode
raises on any synchronising call) under fp16 and bf16 autocast; and a determinism baseline for
the shared head convs, whose gradient is a sum over three pyramid levels."""

import copy

import pytest
import torch

from libreyolo.families.base import Targets
from libreyolo.families.rtmdet import build, criterion


def _targets(device):
    gen = torch.Generator().manual_seed(0)
    b, m, px = 4, 16, 128
    xy = torch.rand(b, m, 2, generator=gen) * px * 0.6
    wh = 8 + torch.rand(b, m, 2, generator=gen) * px * 0.4
    boxes = torch.cat((xy, (xy + wh).clamp(max=px)), -1)
    labels = torch.randint(0, 5, (b, m), generator=gen)
    valid = torch.arange(m).unsqueeze(0) < torch.tensor([[5], [0], [16], [1]])  # image 1 empty
    return Targets(boxes, labels, valid).to(device)


def _step(model, crit, images, targets, dtype):
    with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):  # the loss opts out itself
        preds = model.forward_train(model.capturable(images), targets)
        loss, items = crit(preds, targets)
    loss.backward()
    return loss.detach(), items


@pytest.mark.gpu
@pytest.mark.parametrize("size", ["t", "m"])  # linear and exp distance heads
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_train_step_has_no_host_sync(size, dtype):
    torch.manual_seed(0)
    device = torch.device("cuda")
    model = build(size, 5).to(device, memory_format=torch.channels_last).train()
    crit = criterion(model, None)
    images = torch.rand(4, 3, 128, 128, device=device).contiguous(memory_format=torch.channels_last)
    targets = _targets(device)
    _step(model, crit, images, targets, dtype)  # warm-up: prior cache, cuDNN plans, allocator
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        loss, items = _step(model, crit, images, targets, dtype)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert loss.dtype == torch.float32 and items.shape == (2,)
    assert torch.isfinite(loss) and torch.isfinite(items).all()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


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
    targets = _targets(device)
    grads_a = _shared_conv_grads(model_a, crit, images, targets)
    grads_b = _shared_conv_grads(model_b, crit, images, targets)
    rel = [((ga - gb).norm() / ga.norm().clamp(min=1e-30)).item() for ga, gb in zip(grads_a, grads_b)]
    print(f"rtmdet shared-conv grad rel diff, eager vs eager: max {max(rel):.3e} per conv {rel}")
    assert all(g.abs().sum() > 0 for g in grads_a)
    assert max(rel) < 1e-3
