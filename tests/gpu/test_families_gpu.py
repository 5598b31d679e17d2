"""Registry-driven, on CUDA: every detector's forward + loss + backward performs no host
synchronisation (the DETRs: the documented ones, test_detr_gpu.py) (sync debug mode raises on any synchronising call) under float16 and bfloat16
autocast (the classifiers': test_classifiers_gpu.py), and every family's CUDA predictions match
the CPU's."""

import pytest
import torch
from testkit import gpu_targets

from libreyolo.families import REGISTRY

pytestmark = pytest.mark.gpu
# The DETRs sync by design (denoising group count, the matcher): test_detr_gpu.py counts theirs.
DETECTORS = sorted(f for f, spec in REGISTRY.items() if "detect" in spec.tasks and spec.capture.region != "encoder")


def _l1(on):
    def prepare(model):
        model.use_l1 = on
    return prepare


# (family, size, prepare): the variants whose loss paths differ.
VARIANTS = [("yolo9", "t", None), ("yolox", "s", _l1(False)), ("yolox", "s", _l1(True)),
            ("rtmdet", "t", None), ("rtmdet", "m", None),  # rtmdet t: linear distances, m: exp
            ("yolo7", "t", None), ("yolonas", "s", None)]


def test_every_family_has_a_variant():
    assert {v[0] for v in VARIANTS} == set(DETECTORS)


def _step(model, crit, images, targets, dtype):
    with torch.autocast("cuda", dtype=dtype):  # the loss inside too: it must opt out itself
        preds = model.forward_train(model.capturable(images), targets)
        loss, items = crit(preds, targets)
    loss.backward()
    return loss.detach(), items


@pytest.mark.parametrize("family,size,prepare", VARIANTS, ids=lambda v: v if isinstance(v, str) else "")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_train_step_has_no_host_sync(family, size, prepare, dtype):
    spec = REGISTRY[family]
    torch.manual_seed(0)
    device = torch.device("cuda")
    model = spec.build(size, 5).to(device, memory_format=torch.channels_last).train()
    if prepare is not None:
        prepare(model)
    crit = spec.criterion(model, None)
    images = torch.rand(4, 3, 128, 128, device=device).contiguous(memory_format=torch.channels_last)
    targets = gpu_targets(device)
    _step(model, crit, images, targets, dtype)  # warm-up: anchor caches, cuDNN plans, allocator
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        loss, items = _step(model, crit, images, targets, dtype)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert loss.dtype == torch.float32 and items.shape == (len(crit.item_names),)
    assert torch.isfinite(loss) and torch.isfinite(items).all()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("family", sorted(REGISTRY))
def test_predict_on_cuda_matches_cpu(family):
    spec = REGISTRY[family]
    torch.manual_seed(0)
    model = spec.build(spec.sizes[0], 3).eval()
    x = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        ref = model.predict(x)
        got = model.to("cuda").predict(x.cuda()).cpu()
    assert torch.allclose(ref, got, atol=1e-2, rtol=1e-3)
