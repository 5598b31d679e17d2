"""FOMO (families/fomo/): the network as Edge Impulse builds it (parameters, cut point, head), its
weighted cross-entropy against the formula it comes from and against the one-hot
binary_cross_entropy_with_logits (loss and gradient), its operator count, the centroid targets, the
loss contract (finite with empty images, per-image sums, float32 whatever the input dtype), and a
tiny overfit.
The registry-driven checks every family gets (channels_last, argument errors, recipe values, norms,
ONNX export) are test_families.py's and test_export.py's."""

import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from testkit import random_targets

from libreyolo.config import build_config
from libreyolo.families import REGISTRY
from libreyolo.families.base import Targets
from libreyolo.families.fomo.loss import _CellXent, cell_owners, weight_rows

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import loss_ops  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

SPEC = REGISTRY["fomo"]
# MobileNetV2 alpha 0.35 up to block_6_expand_relu: stem 464, block 0 320, blocks 1-2 1,408 each,
# block 3 1,808, blocks 4-5 4,352 each, block 6's expansion 1,728 (conv weights plus BatchNorm
# scale and shift). Head: 96 x 32 + 32 = 3,104; logits: 33 per output channel (1 + classes).
TRUNK, HEAD = 15_840, 3_104


def _params(module):
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("classes", [2, 80])
def test_parameters_and_cut_point_as_edge_impulse_builds_them(classes):
    model = SPEC.build("035", classes)
    net = model.net
    # Edge Impulse's docs' layer table for 3 outputs: head (Conv2D) 3104, logits (Conv2D) 99.
    assert (_params(net.trunk), _params(net.head), _params(net.logits)) == (TRUNK, HEAD, 33 * (classes + 1))
    assert _params(model) == TRUNK + HEAD + 33 * (classes + 1)  # 21,617 at 80 classes
    with torch.no_grad():
        cut = net.trunk(torch.rand(1, 3, 96, 96))
    assert cut.shape == (1, 96, 12, 12) and cut.min() >= 0 and cut.max() <= 6  # block_6_expand_relu (ReLU6)
    assert SPEC.capture.region == "network" and SPEC.tasks == ("points",) and model.strides == (8,)
    out = model.train().capturable(torch.rand(2, 3, 64, 64))
    assert isinstance(out, tuple) and out[0].shape == (2, classes + 1, 8, 8)
    assert model.forward_train(out, None) is out  # nothing eager after the captured region


def _keras_divisible(v, divisor=8):
    """Keras applications' MobileNetV2 `_make_divisible`, as written there."""
    new = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * v else new


def test_torchvision_rounds_the_channels_as_keras_does():
    """Keras: the stem `_make_divisible(32 alpha)`, each block `_make_divisible(int(c alpha))` of its
    published width c, the expansion 6 x its input; torchvision's trunk must have the same widths."""
    alpha, widths = 0.35, (16, 24, 24, 32, 32, 32)
    keras = [_keras_divisible(32 * alpha)] + [_keras_divisible(int(c * alpha)) for c in widths]
    trunk = SPEC.build("035", 1).net.trunk
    ours = [trunk[0].out_channels] + [block.out_channels for block in trunk[1:7]]
    assert ours == keras == [16, 8, 8, 8, 16, 16, 16]
    assert trunk[7].out_channels == 6 * keras[-1] == 96  # block_6_expand


def test_predict_is_the_softmax_map_and_starts_at_the_prior():
    model = SPEC.build("035", 4).eval()
    with torch.no_grad():
        probs = model.predict(torch.rand(2, 3, 96, 96))
    assert probs.shape == (2, 5, 12, 12) and probs.dtype == torch.float32
    assert torch.allclose(probs.sum(1), torch.ones(2, 12, 12), atol=1e-5)
    # The logit biases: logit of 5 object cells in 144 for the background, split evenly over classes.
    q = 5 / 144
    bias = model.net.logits.bias
    assert bias[0].item() == pytest.approx(math.log((1 - q) / q)) and bias[1].item() == pytest.approx(
        math.log((q / 4) / (1 - q / 4)))


def test_centroid_targets_on_the_grid():
    # 32 px, 4 x 4 cells of 8 px. Box 0 centred at (12, 4) -> cell (1, 0); box 1 at (31.5, 30) -> (3, 3);
    # box 2 (class 2) and box 3 (class 0) share cell (0, 2): the higher class id keeps it; box 4 is padding.
    boxes = torch.tensor([[[8.0, 0, 16, 8], [31, 28, 32, 32], [0, 16, 8, 24], [1, 17, 3, 19], [0, 0, 32, 32]]])
    targets = Targets(boxes, torch.tensor([[1, 0, 2, 0, 1]]), torch.tensor([[True, True, True, True, False]]))
    owner = cell_owners(targets, 4, 4, 8, torch.tensor([[0.0, 0.0], [3.0, 3.0]]))  # 0 background, else class + 1
    want = torch.zeros(1, 4, 4, dtype=torch.long)
    want[0, 0, 1], want[0, 3, 3], want[0, 2, 0] = 2, 1, 3
    assert torch.equal(owner, want)


def _reference_onehot(targets, k, h, w):
    """The one-hot centroid map [B, K, h, w] (float64), built cell by cell in Python."""
    z = torch.zeros(targets.boxes.shape[0], k, h, w, dtype=torch.float64)
    z[:, 0] = 1
    for i in range(z.shape[0]):
        for j in range(targets.boxes.shape[1]):
            if targets.valid[i, j]:
                x1, y1, x2, y2 = targets.boxes[i, j].tolist()
                cx, cy = min(int((x1 + x2) / 2 // 8), w - 1), min(int((y1 + y2) / 2 // 8), h - 1)
                c = int(targets.labels[i, j]) + 1
                if z[i, 1:, cy, cx].sum() == 0 or c > z[i, :, cy, cx].argmax():
                    z[i, :, cy, cx] = 0
                    z[i, c, cy, cx] = 1
    return z


def _reference_loss(logits, targets, object_weight):
    """TF's weighted_cross_entropy_with_logits as its docs write it, (1 - z) x + (1 + (q - 1) z)
    log(1 + exp(-x)), with q = object_weight on the class channels and 1 on background, averaged
    over every cell and channel (Keras' reduce_mean), one-hot targets built cell by cell."""
    b, k, h, w = logits.shape
    z = _reference_onehot(targets, k, h, w)
    q = torch.ones(1, k, 1, 1)
    q[:, 1:] = object_weight
    x = logits.double()
    per = (1 - z) * x + (1 + (q - 1) * z) * torch.log1p(torch.exp(-x))
    return per.mean()


def test_the_loss_is_edge_impulses_weighted_cross_entropy_times_the_batch():
    torch.manual_seed(0)
    model = SPEC.build("035", 3).train()
    crit = SPEC.criterion(model, build_config({"object_weight": 100.0}))
    tg = random_targets(torch.Generator().manual_seed(1), 3, 8, 64, 3, [4, 0, 7], min_wh=4.0)
    preds = model.forward_train(model.capturable(torch.rand(3, 3, 64, 64)), tg)
    loss, items = crit(preds, tg)
    want = _reference_loss(preds[0].detach(), tg, 100.0)
    assert crit.item_names == ("bg", "obj") and items.shape == (2,) and not items.requires_grad
    assert items.sum().item() == pytest.approx(want.item(), rel=1e-5) and loss.item() == pytest.approx(3 * want.item(), rel=1e-5)
    heavier = SPEC.criterion(model, build_config({"object_weight": 1000.0}))(preds, tg)[1]
    assert heavier[0] == items[0] and heavier[1] > items[1]  # the weight is on the class channels only
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert len(grads) == len(list(model.parameters())) and all(torch.isfinite(g).all() for g in grads)


def test_batch_loss_equals_per_image_sums_with_an_empty_image():
    torch.manual_seed(0)
    model = SPEC.build("035", 3).train()
    crit = SPEC.criterion(model, None)
    tg = random_targets(torch.Generator().manual_seed(2), 4, 8, 64, 3, [2, 0, 5, 8], min_wh=4.0)
    with torch.no_grad():
        preds = model(torch.rand(4, 3, 64, 96))
        raw, norm = crit.per_image(preds, tg)
        singles = [crit.per_image((preds[0][i:i + 1],), Targets(*(t[i:i + 1] for t in tg))) for i in range(4)]
        _, items = crit(preds, tg)
        _, empty = crit(preds, Targets(tg.boxes, tg.labels, torch.zeros_like(tg.valid)))
    assert torch.allclose(raw, torch.cat([r for r, _ in singles]), rtol=1e-6)
    assert torch.equal(norm, torch.full((4,), 4.0 * 8 * 12))  # 1 + 3 channels x 8 x 12 cells
    assert torch.allclose(items, raw.sum(0) / norm.sum(), rtol=1e-6)
    assert torch.isfinite(empty).all() and (empty > 0).all() and empty[1] < items[1]  # no object positives


@pytest.mark.parametrize("object_weight", [100.0, 0.0])
def test_loss_and_gradient_equal_the_one_hot_binary_cross_entropy(object_weight):
    """The table formulation against the straightforward one (a one-hot map and
    F.binary_cross_entropy_with_logits with a pos_weight per channel, float64), per image and per
    item, loss and logits gradient, over logits up to |50|: an empty image, padding rows, two
    centres in one cell, a map wider than tall, channels_last logits."""
    gen = torch.Generator().manual_seed(5)
    tg = random_targets(gen, 4, 8, 80, 3, [3, 0, 8, 5], min_wh=2.0)
    centre = (tg.boxes[2, 0, :2] + tg.boxes[2, 0, 2:]) / 2  # image 2: box 1, of another class, centred on box 0
    tg.boxes[2, 1], tg.labels[2, 1] = torch.cat((centre - 1, centre + 1)), (tg.labels[2, 0] + 1) % 3
    cx, cy = (int(v) // 8 for v in centre)
    crit = SPEC.criterion(SPEC.build("035", 3), build_config({"object_weight": object_weight}))
    for scale in (1.0, 10.0, 50.0):
        x = (torch.randn(4, 4, 6, 10, generator=gen) * scale).contiguous(memory_format=torch.channels_last)
        x.requires_grad_()
        loss, items = crit((x,), tg)
        raw, _ = crit.per_image((x.detach(),), tg)
        (grad,) = torch.autograd.grad(loss, x)
        x64 = x.detach().double().requires_grad_()
        z = _reference_onehot(tg, 4, 6, 10)
        assert z[2, :, cy, cx].argmax() == tg.labels[2, :2].max() + 1 and z[1, 1:].sum() == 0  # shared; empty
        pos_weight = torch.tensor([1.0] + [object_weight] * 3, dtype=torch.float64).view(4, 1, 1)
        bce = F.binary_cross_entropy_with_logits(x64, z, pos_weight=pos_weight, reduction="none")
        raw_ref = torch.stack((bce[:, 0].sum((1, 2)), bce[:, 1:].sum((1, 2, 3))), 1)
        items_ref = raw_ref.sum(0) / bce.numel()
        loss_ref = items_ref.sum() * 4
        (grad_ref,) = torch.autograd.grad(loss_ref, x64)
        assert torch.allclose(raw.double(), raw_ref.detach(), rtol=1e-6, atol=0)
        assert torch.allclose(items.double(), items_ref.detach(), rtol=1e-6, atol=0)
        assert loss.item() == pytest.approx(loss_ref.item(), rel=1e-6)
        assert (grad.double() - grad_ref).abs().max() <= 1e-6 * grad_ref.abs().max()
    rows = F.embedding(torch.randint(0, 4, (2, 3, 5), generator=gen), weight_rows(4, 7.0, "cpu", torch.float64))
    logits = torch.randn(2, 4, 3, 5, dtype=torch.float64, generator=gen, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: _CellXent.apply(t, rows), (logits,))  # the hand-written backward


def test_loss_launches_few_operators():
    """The loss's CPU operator counts (benchmarks/loss_ops.py: kernels as CUDA would launch them,
    autograd nodes) stay at what the table formulation takes; the one-hot map with
    binary_cross_entropy_with_logits took forward 39 / backward 15 kernels and 10 nodes."""
    crit = SPEC.criterion(SPEC.build("035", 3), None)
    tg = random_targets(torch.Generator().manual_seed(6), 8, 8, 96, 3, [3, 0, 8, 5, 1, 2, 6, 4])
    counts = loss_ops.loss_counts(crit, (torch.randn(8, 4, 12, 12),), tg)
    fwd, bwd = counts["forward"], counts["backward"]
    assert fwd["kernels"] <= 18 and bwd["kernels"] <= 6 and bwd["nodes"] <= 4, counts


def test_loss_runs_in_float32_whatever_the_input_dtype():
    model = SPEC.build("035", 3)
    crit = SPEC.criterion(model, None)
    logits = (torch.randn(2, 4, 8, 8) * 3,)
    tg = random_targets(torch.Generator().manual_seed(4), 2, 8, 64, 3, [3, 2])
    _, items = crit(logits, tg)
    loss16, items16 = crit((logits[0].to(torch.bfloat16),), tg)
    assert loss16.dtype == torch.float32 and items16.dtype == torch.float32 and torch.isfinite(items16).all()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, items_ac = crit(logits, tg)
    assert torch.allclose(items_ac, items, rtol=1e-6)


def test_overfit_four_images_finds_their_centres():
    """Four 64 px images, a bright square of its class's colour channel per object: after 60 Adam
    steps at Edge Impulse's lr the loss has fallen and the points at the recipe's conf sit on the centres."""
    from libreyolo.eval.points import decode_points

    torch.manual_seed(0)
    model = SPEC.build("035", 2).train()
    crit = SPEC.criterion(model, None)
    scenes = [[(8, 8, 24, 24, 0)], [(36, 12, 52, 28, 1)], [(8, 40, 24, 56, 1), (40, 40, 56, 56, 0)], []]
    images = torch.rand(4, 3, 64, 64, generator=torch.Generator().manual_seed(0)) * 0.2
    boxes, labels, valid = torch.zeros(4, 8, 4), torch.zeros(4, 8, dtype=torch.long), torch.zeros(4, 8, dtype=torch.bool)
    for i, scene in enumerate(scenes):
        for j, (x1, y1, x2, y2, c) in enumerate(scene):
            boxes[i, j], labels[i, j], valid[i, j] = torch.tensor([x1, y1, x2, y2], dtype=torch.float32), c, True
            images[i, c, y1:y2, x1:x2] += 0.8
    targets = Targets(boxes, labels, valid)
    opt = torch.optim.Adam(model.parameters(), lr=SPEC.defaults["lr0"])
    losses = []
    for _ in range(60):
        loss, items = crit(model.forward_train(model.capturable(images), targets), targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(items.sum())
    assert losses[-1] < 0.5 * losses[0], [float(v) for v in losses[::10]]
    with torch.no_grad():
        for _ in range(10):  # settle the BatchNorm running statistics on the final weights
            model.capturable(images)
        pts = decode_points(model.eval().predict(images), SPEC.defaults["conf"])
    found = sorted(zip(pts.image.tolist(), pts.cls.tolist(), pts.xy.tolist()))
    assert found == [(0, 0, [20.0, 20.0]), (1, 1, [44.0, 20.0]), (2, 0, [52.0, 52.0]), (2, 1, [20.0, 52.0])], found
