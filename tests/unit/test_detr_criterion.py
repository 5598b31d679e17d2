"""DETRLoss (families/detr/criterion.py): the PerImageLoss contract (batched = per-image sums),
empty images, an upstream-style per-pair reference written with loops, perfect predictions,
float32 inside, and the seams other families override."""

import pytest
import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment
from torch import nn

from libreyolo.families.base import Targets
from libreyolo.families.detr.boxes import cxcywh_to_xyxy, iou_giou
from libreyolo.families.detr.criterion import DETRLoss, normalise_targets
from libreyolo.families.detr.denoise import denoising_group
from libreyolo.families.detr.matcher import match_cost
from libreyolo.families.detr.output import DETROutput, input_wh

NC, Q, L, E = 4, 12, 3, 1
H, W = 64, 96


class _Model(nn.Module):
    num_classes = NC


def _targets(counts, m=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    b = len(counts)
    xy = torch.rand(b, m, 2, generator=gen) * torch.tensor([W, H]) * 0.6
    wh = 6 + torch.rand(b, m, 2, generator=gen) * torch.tensor([W, H]) * 0.3
    valid = torch.arange(m) < torch.tensor(counts).unsqueeze(1)
    return Targets(torch.cat((xy, xy + wh), -1), torch.randint(0, NC, (b, m), generator=gen), valid)


def _output(tg, seed=1, requires_grad=False):
    gen = torch.Generator().manual_seed(seed)
    b = tg.boxes.shape[0]
    norm = normalise_targets(tg, input_wh(b, H, W, torch.device("cpu")))
    dn = denoising_group(norm.labels, norm.boxes, norm.valid, NC, Q, nn.Embedding(NC + 1, 4), generator=gen)
    d = 0 if dn is None else dn.num_queries

    def boxes(*shape):
        return torch.cat((torch.rand(*shape, 2, generator=gen) * 0.6 + 0.2, torch.rand(*shape, 2, generator=gen) * 0.3 + 0.05), -1)

    out = DETROutput(torch.randn(b, L, Q, NC, generator=gen), boxes(b, L, Q), torch.randn(b, E, Q, NC, generator=gen),
                     boxes(b, E, Q), torch.randn(b, L, d, NC, generator=gen), boxes(b, L, d),
                     torch.full((b, 0), -1) if dn is None else dn.target,
                     torch.ones(b) if dn is None else dn.groups, {"input_wh": input_wh(b, H, W, torch.device("cpu"))})
    if requires_grad:
        out = DETROutput(*(t.requires_grad_() if t.is_floating_point() and i < 6 else t for i, t in enumerate(out[:-1])), out.extra)
    return out


def test_batched_loss_equals_per_image_sums():
    crit = DETRLoss(_Model())
    tg = _targets([2, 0, 5, 8])
    out = _output(tg)
    raw, norm = crit.per_image(out, tg)
    per = [crit.per_image(out.slice(i), Targets(*(t[i:i + 1] for t in tg))) for i in range(4)]
    assert torch.allclose(raw, torch.cat([r for r, _ in per]), rtol=1e-5, atol=1e-6)
    assert torch.equal(norm, torch.tensor([2.0, 0, 5, 8]))
    loss, items = crit(out, tg)
    assert torch.allclose(items, raw.sum(0) / 15) and torch.allclose(loss, items.sum() * 4)
    assert crit.item_names == ("vfl", "l1", "giou") and not items.requires_grad
    assert raw[1, 1:].abs().sum() == 0 and raw[1, 0] > 0  # the empty image: no box terms


def test_all_empty_batch_has_only_the_class_term():
    crit = DETRLoss(_Model())
    tg = _targets([0, 0])
    out = _output(tg)
    assert out.dn_logits.shape[2] == 0
    loss, items = crit(out, tg)
    assert items[0] > 0 and items[1] == 0 and items[2] == 0 and torch.isfinite(loss)
    # An output with dn queries scored against empty targets: the dn pairs drop out too.
    with_dn = _output(_targets([3, 1]))
    _, items = crit(with_dn, _targets([0, 0]))
    assert with_dn.dn_logits.shape[2] > 0 and items[0] > 0 and items[1] == 0 and items[2] == 0


def _reference(out, tg):
    """Upstream's criterion for one image, written pair by pair (loops, scipy per set)."""
    norm = normalise_targets(tg, out.extra["input_wh"])
    n = int(norm.valid[0].sum())
    tb, tl = norm.boxes[0, :n], norm.labels[0, :n]
    total = torch.zeros(3)

    def set_loss(logits, boxes, qi, ti, div):
        onehot = torch.zeros_like(logits)
        score = torch.zeros_like(logits)
        l1 = g = 0.0
        for q, t in zip(qi, ti):
            iou, gi = iou_giou(cxcywh_to_xyxy(boxes[q]), cxcywh_to_xyxy(tb[t]))
            onehot[q, tl[t]] = 1
            score[q, tl[t]] = iou
            l1 += (boxes[q] - tb[t]).abs().sum()
            g += 1 - gi
        p = logits.sigmoid()
        w = 0.75 * p ** 2 * (1 - onehot) + score
        vfl = F.binary_cross_entropy_with_logits(logits, score, weight=w, reduction="none").sum()
        return torch.stack((torch.as_tensor(vfl), torch.as_tensor(l1), torch.as_tensor(g))) / div

    for logits, boxes in [*zip(out.logits[0], out.boxes[0]), *zip(out.enc_logits[0], out.enc_boxes[0])]:
        c = match_cost(logits[None], boxes[None], tl[None], tb[None])[0]
        ti, qi = linear_sum_assignment(c.numpy())
        total += set_loss(logits, boxes, qi, ti, 1.0)
    g = out.dn_groups[0]
    for logits, boxes in zip(out.dn_logits[0], out.dn_boxes[0]):
        qi = [d for d in range(logits.shape[0]) if out.dn_target[0, d] >= 0]
        total += set_loss(logits, boxes, qi, [int(out.dn_target[0, d]) for d in qi], g)
    return total * torch.tensor([1.0, 5.0, 2.0])


def test_matches_the_upstream_reference_for_one_image():
    crit = DETRLoss(_Model())
    tg = _targets([5, 3])
    out = _output(tg, seed=4)
    raw, _ = crit.per_image(out, tg)
    ref = _reference(out.slice(0), Targets(*(t[:1] for t in tg)))
    assert torch.allclose(raw[0], ref, rtol=1e-4, atol=1e-4)


def test_perfect_boxes_give_zero_box_terms_and_grads_flow():
    crit = DETRLoss(_Model())
    tg = _targets([3])
    out = _output(tg, requires_grad=True)
    norm = normalise_targets(tg, out.extra["input_wh"])
    boxes = out.boxes.detach().clone()
    logits = out.logits.detach().clone()
    for j in range(3):  # query 2j+1 of every layer is target j, exactly and confidently
        boxes[0, :, 2 * j + 1] = norm.boxes[0, j]
        logits[0, :, 2 * j + 1, norm.labels[0, j]] = 12.0
    no_dn = dict(dn_boxes=boxes.new_zeros(1, L, 0, 4), dn_logits=logits.new_zeros(1, L, 0, NC),
                 dn_target=torch.zeros(1, 0, dtype=torch.long))
    perfect = out._replace(boxes=boxes, logits=logits, enc_boxes=boxes[:, :1], enc_logits=logits[:, :1], **no_dn)
    _, items = crit(perfect, tg)
    assert items[1] < 1e-4 and items[2] < 1e-4  # the eps in the GIoU denominators only
    loss, _ = crit(out, tg)
    loss.backward()
    assert all(torch.isfinite(t.grad).all() and t.grad.abs().sum() > 0 for t in out[:6])


def test_float32_inside_whatever_the_input_dtype():
    crit = DETRLoss(_Model())
    tg = _targets([4, 1])
    out = _output(tg)
    _, items = crit(out, tg)
    _, items16 = crit(out.to(torch.bfloat16), tg)
    assert items16.dtype == torch.float32 and torch.allclose(items16, items, rtol=0.05)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, items_ac = crit(out, tg)
    assert torch.allclose(items_ac, items, rtol=1e-6)


def test_seams_classification_and_extra_terms():
    class Custom(DETRLoss):
        cls_name = "mal"
        extra_names = ("count",)

        def classification(self, logits, onehot, score):
            return onehot  # per entry: summed to the matched pairs over every set

        def extra_terms(self, out, pairs, tgt):
            return {"count": sum(p.mask.sum((1, 2)).float() for p in pairs.values())}

    crit = Custom(_Model())
    tg = _targets([3, 0])
    raw, _ = crit.per_image(_output(tg), tg)
    assert crit.item_names == ("mal", "l1", "giou", "count")
    # 3 targets matched in L + E sets, plus 3 positives x groups in each of L dn layers (/ groups).
    assert raw[0, 0].item() == pytest.approx(3 * (L + E) + 3 * L)
    assert raw[0, 3].item() == pytest.approx(3 * (L + E) + 3 * L * (100 // 3))
    assert raw[1].abs().sum() == 0
