"""Helpers shared by the test suites (importable as `testkit`: tests/ is on pytest's pythonpath)."""

import json

import torch

from libreyolo.data import Batch
from libreyolo.families.base import Targets


def random_targets(gen, b, m, px, nc, counts, *, min_wh=4.0, pos=0.7, extent=0.5) -> Targets:
    """Padded targets with counts[i] valid boxes in image i (padding rows hold junk on purpose).

    Boxes start in the first `pos` of the image, span `min_wh` px plus up to `extent` of it."""
    xy = torch.rand(b, m, 2, generator=gen) * px * pos
    wh = min_wh + torch.rand(b, m, 2, generator=gen) * px * extent
    boxes = torch.cat((xy, (xy + wh).clamp(max=px)), -1)
    labels = torch.randint(0, nc, (b, m), generator=gen)
    valid = torch.arange(m).unsqueeze(0) < torch.tensor(counts).unsqueeze(1)
    return Targets(boxes, labels, valid)


def check_model_contract(model, channels: int):
    """The model contract on a 2 x 3 x 64 x 96 input: `capturable` in train mode gives one map per
    stride 8/16/32 with `channels` channels, `forward_train` passes it through, eval forward equals
    `predict`, which gives one finite (box, scores in [0, 1]) row per cell. Returns (maps, pred);
    the model is left in eval mode."""
    nc = model.num_classes
    assert model.strides == (8, 16, 32)
    x = torch.rand(2, 3, 64, 96)
    out = model.train().capturable(x)
    assert isinstance(out, tuple) and len(out) == 3
    for o, s in zip(out, model.strides):
        assert o.shape == (2, channels, 64 // s, 96 // s)
    assert model.forward_train(out, None) is out
    model.eval()
    with torch.no_grad():
        pred = model.predict(x)
        assert torch.equal(model(x), pred)  # eval forward = predict
    cells = sum((64 // s) * (96 // s) for s in model.strides)
    assert pred.shape == (2, cells, 4 + nc) and pred.dtype == torch.float32 and torch.isfinite(pred).all()
    scores = pred[..., 4:]
    assert (scores >= 0).all() and (scores <= 1).all()
    return out, pred


def gpu_targets(device) -> Targets:
    """The GPU tests' standard targets: 4 images at 128 px, 5 classes, image 1 empty."""
    gen = torch.Generator().manual_seed(0)
    return random_targets(gen, 4, 16, 128, 5, [5, 0, 16, 1], min_wh=8.0, pos=0.6, extent=0.4).to(device)


def synthetic_batch(b: int = 8, size: int = 256, seed: int = 0, empty_first: bool = False) -> Batch:
    """A pinned batch in the trainer's format: random uint8 images, 1-7 random boxes each (10
    classes); image 0 empty if asked."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 255, (b, 3, size, size), dtype=torch.uint8, generator=g)
    m = 8
    xy = torch.rand(b, m, 2, generator=g) * size * 0.6
    wh = torch.rand(b, m, 2, generator=g) * size * 0.3 + 8
    boxes = torch.cat([xy, xy + wh], -1)
    labels = torch.randint(0, 10, (b, m), generator=g)
    valid = torch.arange(m).expand(b, m) < torch.randint(1, m, (b, 1), generator=g)
    if empty_first:
        valid[0] = False
    return Batch(images=images.pin_memory(),
                 targets=Targets(boxes.pin_memory(), labels.pin_memory(), valid.pin_memory()))


def shapes_subset(root, n: int) -> str:
    """The built-in shapes dataset cut to `n` train (and 4 val) images, as a dataset yaml under `root`."""
    from libreyolo.data import load_data_config

    shapes = load_data_config("shapes")
    (root / "train.txt").write_text("\n".join(str(p) for p in shapes.train[:n]))
    (root / "val.txt").write_text("\n".join(str(p) for p in shapes.val[:4]))
    (root / "data.yaml").write_text(json.dumps({"path": str(root), "train": "train.txt", "val": "val.txt",
                                                "names": shapes.names}))
    return str(root / "data.yaml")
