"""Registry-driven, on CUDA: predict with cuda_graph=true replays one captured forward and gives the
eager forward's results; a partial last batch replays the same graph; another shape runs eager
with one line; predict on CUDA agrees with predict on CPU."""

import dataclasses
import logging

import pytest
import torch
from torch import nn

from libreyolo.families import REGISTRY
from libreyolo.model import resolve_model
from libreyolo.names import arch_name
from libreyolo.predict.core import Predictor
from libreyolo.predict.post import PostOptions
from libreyolo.tasks import task_for

pytestmark = pytest.mark.gpu
ARCHS = [arch_name(spec, spec.sizes[0]) for spec in REGISTRY.values()]


class _Frame:
    def __init__(self, image, name):
        self.image, self.name, self.path, self.frame = image, name, None, None


def _frames(n: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return [_Frame(torch.randint(0, 256, (3, 200 + 7 * i, 256), generator=gen, dtype=torch.uint8), f"img{i}")
            for i in range(n)]


_WEIGHTS: dict[str, dict] = {}


def _weights(arch: str):
    """`arch` with seeded random weights, the same for every predictor of a test.

    An end-to-end model's (a DETR's) BatchNorms are calibrated: they hold the statistics of the
    activations they see (train-mode forwards on random images, cumulative averages), as a trained
    model's do. A fresh BatchNorm (mean 0, variance 1) in eval mode normalises nothing, and through
    a deep random network the activations can shrink by orders of magnitude (DEIMv2-atto's encoder
    output: about 1e-6, where float16 is subnormal and every query score is its bias, a tie). The
    other families keep fresh BatchNorms: calibrated, a random YOLO head is chaotic (a 1e-3
    relative change of every weight moved YOLOv9-t's boxes by 250 px and YOLOX-n's by 1950 px,
    against 0.04 and 0.008 px fresh, on the CPU), so no two roundings of it could be compared."""
    source = resolve_model(arch)
    if arch not in _WEIGHTS:
        names = [f"class{i}" for i in range(task_for(source.spec, None).default_classes)]
        torch.manual_seed(0)
        model = source.spec.build(source.size, len(names))
        if getattr(model, "end_to_end", False):
            _calibrate(model)
        _WEIGHTS[arch] = {"model": model.state_dict(), "names": names}
    return dataclasses.replace(source, checkpoint=_WEIGHTS[arch])


def _calibrate(model: nn.Module) -> None:
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    gen = torch.Generator().manual_seed(1)
    model.train()
    with torch.no_grad():
        for i in range(4):  # momentum 1/(i+1): the average over the batches so far
            for m in norms:
                m.momentum = 1.0 / (i + 1)
            model.capturable(torch.rand(2, 3, 256, 256, generator=gen))


@pytest.fixture
def no_tf32():
    """cuDNN convolutions in full float32 (torch's default is TF32, 10 mantissa bits): a graphed
    batch of 4 and an eager partial batch of 2 run other algorithms, and the CPU has no TF32, so
    TF32's rounding (1e-3 relative) would be all these tests measured."""
    before = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = before


def _predictor(arch: str, device: str, graph: bool, batch: int = 4, amp: bool = False) -> Predictor:
    """Predict's own deploy model (conv+BN folded; on CUDA channels_last), the same random weights."""
    torch.manual_seed(0)
    return Predictor(_weights(arch), imgsz=256, batch=batch, device=device, cuda_graph=graph, amp=amp)


def _outputs(predictor, frames):
    return [r for _, r in predictor.run(frames, PostOptions(conf=0.0, max_det=50))]


@pytest.mark.parametrize("arch", ARCHS)
def test_graphed_predict_matches_eager_and_replays(arch, caplog, no_tf32):
    frames = _frames(10)  # batches of 4, 4 and a partial 2
    eager = _outputs(_predictor(arch, "cuda", False), frames)
    with caplog.at_level(logging.INFO, logger="libreyolo"):
        graphed_predictor = _predictor(arch, "cuda", True)
        graphed = _outputs(graphed_predictor, frames)
    g = graphed_predictor.graph
    assert g.fallback_reason is None and g.replays == 3 and g.eager_calls == 0, caplog.text
    assert "captured the forward for 4x3x256x256" in caplog.text
    if graphed_predictor.task.name == "detect":  # the network's own output, before NMS or top-k
        raw_eager, raw_graphed = _raw(_predictor(arch, "cuda", False), frames[:4]), _raw(graphed_predictor, frames[:4])
        torch.testing.assert_close(raw_graphed, raw_eager, atol=1e-3, rtol=1e-4)
    end_to_end = graphed_predictor.end_to_end
    for a, b in zip(eager, graphed):
        if a.task == "detect":  # NMS or top-k over near-equal random scores: compared as sets
            assert end_to_end or len(a) == len(b)
            _same_set(torch.cat([a.boxes, a.scores[:, None]], 1)[None], torch.cat([b.boxes, b.scores[:, None]], 1)[None],
                      box_px=1e-3, score=1e-4)
        elif a.task == "points":  # conf 0: each class's cells are one blob, one point per class
            assert len(a) == len(b)
            torch.testing.assert_close(a.points, b.points, atol=1e-3, rtol=0)
            torch.testing.assert_close(a.scores, b.scores, atol=5e-3, rtol=0)
        elif a.task == "segment":  # class maps: a near-tie may flip a pixel under other TF32 rounding
            assert a.mask.shape == b.mask.shape and (a.mask != b.mask).float().mean() < 1e-3
        else:  # cuDNN autotuning may pick other algorithms for the two (TF32 rounding differs)
            torch.testing.assert_close(a.probs, b.probs, atol=5e-3, rtol=0)


def test_another_shape_runs_eager_with_one_line(caplog):
    p = _predictor("yolo9-t", "cuda", True)
    images = torch.stack([p.prepare(f.image)[0] for f in _frames(4)])
    p.infer(images)
    with caplog.at_level(logging.INFO, logger="libreyolo"):
        p.infer(images[:, :, :128, :128].contiguous())
        p.infer(images[:, :, :128, :128].contiguous())
    assert caplog.text.count("runs eager") == 1 and p.graph.eager_calls == 2 and p.graph.replays == 1


def _raw(predictor, frames):
    """The network's decoded output before NMS (random weights: near-equal scores whose order NMS
    and top-k would make arbitrary), on the host, float32."""
    images = torch.stack([predictor.prepare(f.image)[0] for f in frames])
    return predictor.infer(images).float().cpu()


# An end-to-end model (a DETR) predicts one row per query, and its queries are the top 300 cells
# of the encoder's scores: near-equal for random weights, so rounding on another device or dtype
# can swap a few cells at the cut. Its rows are compared as sets: this share of one side's rows must
# have a row on the other within the tolerances (measured on the H200 below; the rest are the
# swapped-in cells).
SAME_SET = 0.9


def _same_set(a, b, box_px: float, score: float) -> None:
    """[B, N, 4 + k] rows: each row of `a` looked up among `b`'s rows of the same image."""
    near = (((a[:, :, None, :4] - b[:, None, :, :4]).abs().amax(-1) <= box_px)
            & ((a[:, :, None, 4:] - b[:, None, :, 4:]).abs().amax(-1) <= score))
    found = near.any(-1).float().mean().item()
    print(f"rows found on the other side: {found:.3f}")
    assert found >= SAME_SET, found


def _close(a, b, box_px: float, score: float, end_to_end: bool = False) -> None:
    if end_to_end:
        _same_set(a, b, box_px, score)
    elif a.shape[-1] > 4 and a.ndim == 3:  # detection: boxes in pixels, then scores
        torch.testing.assert_close(a[..., :4], b[..., :4], atol=box_px, rtol=0)
        torch.testing.assert_close(a[..., 4:], b[..., 4:], atol=score, rtol=0)
    else:  # classification probabilities
        torch.testing.assert_close(a, b, atol=score, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_cuda_predict_agrees_with_cpu(arch, no_tf32):
    """float32 both sides."""
    frames = _frames(4)
    cpu = _predictor(arch, "cpu", False)
    _close(_raw(cpu, frames), _raw(_predictor(arch, "cuda", True), frames), box_px=0.1, score=5e-3,
           end_to_end=cpu.end_to_end)


def _before_selection(model, images):
    """A DETR's network output before its queries are picked: what half rounding can be held to.
    For most DETRs that is the captured encoder; RF-DETR captures through its top-k query
    selection and decoder, so there it is the projected backbone features."""
    net = getattr(model, "net", None)
    if hasattr(net, "projector"):
        return (net.projector(net.backbone((images - net.mean) / net.std)),)
    return model.capturable(images)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_weights_predict_what_float32_predicts(arch, dtype):
    frames = _frames(4)
    reference = _predictor(arch, "cuda", False)
    full = _raw(reference, frames)
    torch.manual_seed(0)
    p = Predictor(_weights(arch), imgsz=256, batch=4, device="cuda", amp=True, amp_dtype=dtype)
    assert next(p.model.parameters()).dtype == getattr(torch, dtype)
    bf16 = dtype == "bfloat16"  # 8 mantissa bits against float16's 11
    half = _raw(p, frames)
    if p.end_to_end:
        # A DETR's 300 queries are the top cells of a random model's near-equal scores, and half
        # rounding re-picks many of them (21-76 % of the rows kept, H200): the network itself is
        # what must agree, and the half predictions must be whole.
        assert half.shape == full.shape and torch.isfinite(half).all()
        images = torch.stack([p.prepare(f.image)[0] for f in frames]).cuda()
        with torch.no_grad():
            want = _before_selection(reference.model, images.float().div(255).contiguous(memory_format=torch.channels_last))
            got = _before_selection(p.model, images.to(p.dtype).div(255).contiguous(memory_format=torch.channels_last))
        for w, g in zip(want, got):
            rel = float((g.float() - w).norm() / w.norm())
            print(f"[{arch} {dtype}] encoder output rel L2 {rel:.2e}")
            # bfloat16 keeps 3 mantissa bits fewer than float16: 8x its bound
            assert rel < (8e-2 if bf16 else 1e-2)
        return
    _close(full, half, box_px=2.0 if bf16 else 0.5, score=1e-1 if bf16 else 1e-2)


def test_graphed_float16_batch1_predict_has_one_graph_and_no_eager_forward():
    torch.manual_seed(0)
    p = Predictor(resolve_model("yolo9-t"), imgsz=640, batch=1, device="cuda", cuda_graph=True)
    results = [r for _, r in p.run(_frames(5), PostOptions())]
    assert len(results) == 5 and p.graph.replays == 5 and p.graph.eager_calls == 0
    assert p.precision.describe().startswith("float16")
