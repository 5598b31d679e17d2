"""Registry-driven: the model and loss contract every registered semantic-segmentation family must
keep (families/segment.py).

Sizes as published, the whole network as the captured region (logits at the network's own output
stride), the loss as B x the mean cross-entropy over the valid pixels (per-image sums, ignored
pixels left out, float32 whatever the input dtype), probabilities at the input size from predict,
and a few steps that fit two images. A family that lists the `segment` task joins these tests the
day it registers; a missing entry in the tables below fails `test_every_segmenter_has_its_settings`.
"""

import pytest
import torch
import torch.nn.functional as F

from libreyolo.config import build_config
from libreyolo.data.segment import SegTargets
from libreyolo.families import REGISTRY

pytestmark = pytest.mark.usefixtures("one_thread")

SEGMENTERS = sorted(f for f, spec in REGISTRY.items() if "segment" in spec.tasks)
IGNORE = 255

# (family, size) -> (exact parameters at ADE20K's 150 classes, the published figure). SegFormer-B0:
# 3.7-3.8 M published (the paper's Table 1 rounds to 3.8 M); 3,752,694 is the authors' network without
# the unused `conv_seg` their decode head also builds (19,350 parameters).
# LingBot-Vision s: the 21.6 M of the released ViT-S/16 backbone (derived in test_lingbot.py) plus
# the linear head.
PARAMS_150 = {("segformer", "b0"): (3_752_694, 3.7e6), ("lingbot", "s"): (21_654_678, 21.6e6)}
# family -> (output stride, AdamW lr, steps) of the overfit. LingBot-Vision s (lr 3e-3, seed 0):
# loss ratio 0.163, pixel accuracy 0.94 after 14 steps.
OVERFIT = {"segformer": (4, 3e-3, 15), "lingbot": (16, 3e-3, 14)}


def test_every_segmenter_has_its_settings():
    assert SEGMENTERS, "no segmentation family registered"
    assert set(OVERFIT) == set(SEGMENTERS)
    assert set(PARAMS_150) == {(f, s) for f in SEGMENTERS for s in REGISTRY[f].sizes}


@pytest.mark.parametrize("family, size", sorted(PARAMS_150))
def test_published_parameter_count(family, size):
    exact, published = PARAMS_150[(family, size)]
    model = REGISTRY[family].build(size, 150)
    count = sum(p.numel() for p in model.parameters())
    assert count == exact and abs(count - published) <= 0.05 * published
    assert model.num_classes == 150


def _masks(b: int, size: int, nc: int, seed: int = 0) -> torch.Tensor:
    masks = torch.randint(0, nc, (b, size, size), generator=torch.Generator().manual_seed(seed))
    masks[0, :5] = IGNORE  # some ignored rows
    return masks


@pytest.mark.parametrize("family", SEGMENTERS)
def test_the_whole_network_is_captured_and_predict_gives_probabilities_at_the_input_size(family):
    spec = REGISTRY[family]
    stride = OVERFIT[family][0]
    assert spec.capture.region == "network" and spec.tasks[0] == "segment"
    model = spec.build(spec.sizes[0], 5).train()
    out = model.capturable(torch.rand(2, 3, 64, 96))
    assert isinstance(out, tuple) and out[0].shape == (2, 5, 64 // stride, 96 // stride)
    assert model.forward_train(out, None) is out  # nothing eager after the captured region
    probs = model.eval().predict(torch.rand(2, 3, 64, 96))
    assert probs.shape == (2, 5, 64, 96) and probs.dtype == torch.float32
    assert torch.allclose(probs.sum(1), torch.ones(2, 64, 96), atol=1e-5)


@pytest.mark.parametrize("family", SEGMENTERS)
def test_the_loss_is_batch_times_the_mean_ce_over_valid_pixels_and_per_image(family):
    spec = REGISTRY[family]
    torch.manual_seed(0)
    model = spec.build(spec.sizes[0], 3).train()
    crit = spec.criterion(model, build_config({}))
    targets = SegTargets(_masks(3, 64, 3))
    preds = model.forward_train(model.capturable(torch.rand(3, 3, 64, 64)), targets)
    loss, items = crit(preds, targets)
    logits = F.interpolate(preds[0].float(), size=(64, 64), mode="bilinear", align_corners=False)
    want = F.cross_entropy(logits, targets.masks, ignore_index=IGNORE)
    assert crit.item_names == ("ce",) and items.shape == (1,) and not items.requires_grad
    assert torch.allclose(items[0], want, rtol=1e-5) and torch.allclose(loss, 3 * want, rtol=1e-5)
    with torch.no_grad():  # the batch's raw sums and pixel counts are the images' own
        raw, norm = crit.per_image(preds, targets)
        for i in range(3):
            r, n = crit.per_image(tuple(p[i:i + 1] for p in preds), SegTargets(targets.masks[i:i + 1]))
            assert torch.allclose(raw[i], r[0], rtol=1e-5) and norm[i] == n[0]
    assert norm.tolist() == [64 * 64 - 5 * 64, 64 * 64, 64 * 64]
    _, items16 = crit(tuple(p.detach().bfloat16() for p in preds), targets)
    assert items16.dtype == torch.float32 and torch.isfinite(items16).all()
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("family", SEGMENTERS)
def test_a_batch_of_only_ignored_pixels_has_zero_loss(family):
    spec = REGISTRY[family]
    model = spec.build(spec.sizes[0], 3).train()
    targets = SegTargets(torch.full((2, 32, 32), IGNORE))
    loss, items = spec.criterion(model, build_config({}))(model.capturable(torch.rand(2, 3, 32, 32)), targets)
    assert loss.item() == 0.0 and items.tolist() == [0.0]


@pytest.mark.parametrize("family", SEGMENTERS)
def test_overfit_two_images(family):
    """Two 64 px images whose class is painted into the pixels (a colour per class): a few AdamW
    steps must fit them: the last step's pixel accuracy (training mode: eval mode would read
    BatchNorm statistics that a few steps at momentum 0.03 have not settled) >= 0.9, the loss a
    fifth of its start."""
    _, lr, steps = OVERFIT[family]
    spec = REGISTRY[family]
    torch.manual_seed(0)
    model = spec.build(spec.sizes[0], 3).train()
    masks = torch.zeros(2, 64, 64, dtype=torch.long)
    masks[0, 8:40, 8:40] = 1
    masks[1, 20:60, 30:62] = 2
    masks[1, 0:16, 0:24] = 1
    colours = torch.tensor([[0.2, 0.2, 0.2], [0.9, 0.1, 0.1], [0.1, 0.1, 0.9]])
    images = colours[masks].permute(0, 3, 1, 2).contiguous()
    crit = spec.criterion(model, build_config({}))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    for _ in range(steps):
        preds = model.forward_train(model.capturable(images), None)
        loss, _ = crit(preds, SegTargets(masks))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    logits = F.interpolate(preds[0].detach(), size=(64, 64), mode="bilinear", align_corners=False)
    acc = (logits.argmax(1) == masks).float().mean().item()
    assert acc >= 0.9 and losses[-1] < 0.2 * losses[0], (acc, losses)
