"""Registry-driven: the model and loss contract every registered classifier must keep.

Sizes as published, forward/backward finite, the loss as B x the mean cross-entropy (per-image
sums, float32 whatever the input dtype, label smoothing honoured), channels_last equivalence,
probabilities from predict, and an overfit of a few images to 100 % train accuracy. A family
that lists the `classify` task joins these tests the day it registers; a missing entry in the
tables below fails `test_every_classifier_has_its_settings`.
"""

import pytest
import torch
import torch.nn.functional as F

from libreyolo.config import build_config
from libreyolo.data import ClassTargets
from libreyolo.families import REGISTRY

# Tiny tensors gain nothing from intra-op threads (conftest.py, `one_thread`).
pytestmark = pytest.mark.usefixtures("one_thread")

CLASSIFIERS = sorted(f for f, spec in REGISTRY.items() if "classify" in spec.tasks)

# Parameters at 1000 classes, as published: torchvision's ResNet-18 (11,689,512 in its weights'
# metadata) and timm's MobileNetV4 conv-small (3.8 M on its model card).
PARAMS_1000 = {("resnet", "18"): 11_689_512, ("mobilenetv4", "s"): 3_774_024}
# family -> (AdamW lr, steps, image size) for the overfit. MobileNetV4 downsamples 32x: at 32 px
# its last features are one pixel and it kept one image wrong after 100 steps; at 64 px it fits
# all eight in 30.
OVERFIT = {"resnet": (1e-3, 40, 32), "mobilenetv4": (3e-3, 60, 64)}


def test_every_classifier_has_its_settings():
    assert CLASSIFIERS, "no classifier registered"
    assert set(OVERFIT) == set(CLASSIFIERS)
    assert {f for f, _ in PARAMS_1000} == set(CLASSIFIERS)
    assert set(PARAMS_1000) == {(f, s) for f in CLASSIFIERS for s in REGISTRY[f].sizes}


@pytest.mark.parametrize("family, size", sorted(PARAMS_1000))
def test_published_parameter_count(family, size):
    model = REGISTRY[family].build(size, 1000)
    assert sum(p.numel() for p in model.parameters()) == PARAMS_1000[(family, size)]
    assert model.num_classes == 1000


@pytest.mark.parametrize("family", CLASSIFIERS)
def test_the_whole_network_is_the_capturable_region(family):
    spec = REGISTRY[family]
    assert spec.capture.region == "network" and spec.tasks[0] == "classify"
    model = spec.build(spec.sizes[0], 5).train()
    out = model.capturable(torch.rand(2, 3, 64, 64))
    assert isinstance(out, tuple) and out[0].shape == (2, 5)
    assert model.forward_train(out, None) is out  # nothing eager after the captured region


def _labels(*ids):
    return ClassTargets(torch.tensor(ids, dtype=torch.long))


@pytest.mark.parametrize("family", CLASSIFIERS)
def test_forward_backward_finite_and_the_loss_is_batch_times_mean_ce(family):
    spec = REGISTRY[family]
    torch.manual_seed(0)
    model = spec.build(spec.sizes[0], 3).train()
    crit = spec.criterion(model, build_config({"label_smoothing": 0.0}))
    targets = _labels(0, 2, 1, 2)
    preds = model.forward_train(model.capturable(torch.rand(4, 3, 64, 64)), targets)
    loss, items = crit(preds, targets)
    want = F.cross_entropy(preds[0].float(), targets.labels)
    assert crit.item_names == ("cls",) and items.shape == (1,) and not items.requires_grad
    assert torch.allclose(items[0], want, rtol=1e-6) and torch.allclose(loss, 4 * want, rtol=1e-6)
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("family", CLASSIFIERS)
def test_batch_loss_equals_per_image_sums_and_smoothing_is_honoured(family):
    spec = REGISTRY[family]
    torch.manual_seed(0)
    model = spec.build(spec.sizes[0], 4)
    crit = spec.criterion(model, build_config({"label_smoothing": 0.1}))
    targets = _labels(3, 0, 1)
    with torch.no_grad():
        preds = model.train().forward_train(model.capturable(torch.rand(3, 3, 64, 64)), targets)
        raw, norm = crit.per_image(preds, targets)
        singles = [crit.per_image((preds[0][i:i + 1],), _labels(int(targets.labels[i])))[0][0] for i in range(3)]
        _, items = crit(preds, targets)
    assert torch.allclose(raw, torch.stack(singles), rtol=1e-6) and torch.equal(norm, torch.ones(3))
    smoothed = F.cross_entropy(preds[0].float(), targets.labels, label_smoothing=0.1)
    plain = F.cross_entropy(preds[0].float(), targets.labels)
    assert torch.allclose(items[0], smoothed, rtol=1e-6) and not torch.allclose(items[0], plain, rtol=1e-3)


@pytest.mark.parametrize("family", CLASSIFIERS)
def test_loss_runs_in_float32_whatever_the_input_dtype(family):
    spec = REGISTRY[family]
    model = spec.build(spec.sizes[0], 3)
    crit = spec.criterion(model, None)
    logits = (torch.randn(4, 3) * 3,)
    targets = _labels(0, 1, 2, 0)
    _, items = crit(logits, targets)
    loss16, items16 = crit((logits[0].to(torch.bfloat16),), targets)
    assert loss16.dtype == torch.float32 and items16.dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, items_ac = crit(logits, targets)
    assert torch.allclose(items_ac, items, rtol=1e-6)


@pytest.mark.parametrize("family", CLASSIFIERS)
def test_predict_gives_probabilities(family):
    """(channels_last against contiguous: test_families.py, for every family.)"""
    spec = REGISTRY[family]
    torch.manual_seed(0)
    model = spec.build(spec.sizes[0], 6).eval()
    x = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        ref = model.capturable(x)[0]
        probs = model.predict(x)
    assert probs.shape == (2, 6) and probs.dtype == torch.float32 and (probs >= 0).all()
    assert torch.allclose(probs.sum(1), torch.ones(2), atol=1e-5)
    assert torch.equal(probs.argmax(1), ref.argmax(1))


@pytest.mark.parametrize("family", CLASSIFIERS)
def test_overfit_to_full_train_accuracy(family):
    """Eight images of 4 classes (a bright square in a class-specific quadrant): the model must
    learn them all, measured in eval mode as validation measures."""
    lr, steps, px = OVERFIT[family]
    spec = REGISTRY[family]
    torch.manual_seed(0)
    model = spec.build(spec.sizes[0], 4).train()
    crit = spec.criterion(model, None)
    gen = torch.Generator().manual_seed(0)
    images = torch.rand(8, 3, px, px, generator=gen) * 0.3
    labels = torch.arange(8) % 4
    h = px // 2
    for i, c in enumerate(labels.tolist()):
        y, x = divmod(c, 2)
        images[i, :, y * h:(y + 1) * h, x * h:(x + 1) * h] += 0.6
    targets = ClassTargets(labels)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    for _ in range(steps):
        loss, _ = crit(model.forward_train(model.capturable(images), targets), targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    with torch.no_grad():
        for _ in range(10):  # settle the BatchNorm running statistics on the final weights
            model.capturable(images)
        predicted = model.eval().predict(images).argmax(1)
    assert torch.equal(predicted, labels), (predicted.tolist(), labels.tolist())
