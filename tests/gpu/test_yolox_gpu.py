"""YOLOX on CUDA: forward + SimOTA + loss + backward perform no host synchronisation (checked by
PyTorch's sync debug mode, which raises on any synchronising call) under fp16 and bf16 autocast,
with the L1 term both off and on."""

import pytest
import torch

from libreyolo.families.base import Targets
from libreyolo.families.yolox import build, criterion


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
    with torch.autocast("cuda", dtype=dtype):  # the loss inside too: it must opt out itself
        preds = model.forward_train(model.capturable(images), targets)
        loss, items = crit(preds, targets)
    loss.backward()
    return loss.detach(), items


@pytest.mark.gpu
@pytest.mark.parametrize("use_l1", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_train_step_has_no_host_sync(dtype, use_l1):
    torch.manual_seed(0)
    device = torch.device("cuda")
    model = build("s", 5).to(device, memory_format=torch.channels_last).train()
    model.use_l1 = use_l1
    crit = criterion(model, None)
    images = torch.rand(4, 3, 128, 128, device=device).contiguous(memory_format=torch.channels_last)
    targets = _targets(device)
    _step(model, crit, images, targets, dtype)  # warm-up: grid cache, cuDNN plans, allocator
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        loss, items = _step(model, crit, images, targets, dtype)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert loss.dtype == torch.float32 and items.shape == (4,)
    assert torch.isfinite(loss) and torch.isfinite(items).all()
    assert (items[3] > 0) == use_l1
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


@pytest.mark.gpu
def test_predict_on_cuda_matches_cpu():
    torch.manual_seed(0)
    model = build("n", 3).eval()
    x = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        ref = model.predict(x)
        got = model.to("cuda").predict(x.cuda()).cpu()
    assert torch.allclose(ref, got, atol=1e-2, rtol=1e-3)
