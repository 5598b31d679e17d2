"""Contrastive denoising groups (families/detr/denoise.py): group count and query layout for a
batch whose largest image has 1 and 37 boxes (100 and 2 groups), the attention mask, noise
sizes (negatives always further off than positives), and the reconstruction targets."""

import pytest
import torch
from torch import nn

from libreyolo.families.detr.boxes import cxcywh_to_xyxy
from libreyolo.families.detr.denoise import denoising_group

NC, NQ = 5, 7


def _batch(counts, m, gen):
    b = len(counts)
    boxes = torch.cat((torch.rand(b, m, 2, generator=gen) * 0.5 + 0.25, torch.rand(b, m, 2, generator=gen) * 0.2 + 0.1), -1)
    labels = torch.randint(0, NC, (b, m), generator=gen)
    valid = torch.arange(m) < torch.tensor(counts).unsqueeze(1)
    return labels, boxes, valid


@pytest.mark.parametrize("counts,groups", [([1, 0], 100), ([37, 5, 0], 2)])
def test_groups_layout_and_targets(counts, groups):
    gen = torch.Generator().manual_seed(0)
    m = max(counts) + 3
    labels, boxes, valid = _batch(counts, m, gen)
    embed = nn.Embedding(NC + 1, 8, padding_idx=NC)
    dn = denoising_group(labels, boxes, valid, NC, NQ, embed, generator=gen)
    k = max(counts)
    d = 2 * k * groups
    assert dn.groups.tolist() == [float(groups)] * len(counts)
    assert dn.labels.shape == (len(counts), d) and dn.boxes_unact.shape == (len(counts), d, 4)
    assert dn.queries.shape == (len(counts), d, 8) and dn.attn_mask.shape == (d + NQ, d + NQ)
    slot = torch.arange(d) % (2 * k)
    assert torch.equal(dn.negative, slot >= k)
    for i, n in enumerate(counts):
        j = slot % k
        real = j < n
        # Positives of every group reconstruct target j; negatives and padding reconstruct nothing.
        want = torch.where(real & ~dn.negative, j, -1)
        assert torch.equal(dn.target[i], want)
        assert (dn.labels[i][~real] == NC).all() and (dn.labels[i][real] < NC).all()
        assert (dn.queries[i][~real] == 0).all()  # padding_idx embedding
    assert dn.target.ge(0).sum().item() == sum(counts) * groups


def test_no_boxes_no_denoising():
    labels, boxes, valid = _batch([0, 0], 8, torch.Generator().manual_seed(0))
    assert denoising_group(labels, boxes, valid, NC, NQ, nn.Embedding(NC + 1, 8)) is None


def test_attention_mask_blocks_exactly_other_groups_and_dn_for_matching_queries():
    gen = torch.Generator().manual_seed(1)
    labels, boxes, valid = _batch([30, 2], 32, gen)  # K 30 -> 3 groups of 60
    dn = denoising_group(labels, boxes, valid, NC, NQ, nn.Embedding(NC + 1, 4), generator=gen)
    d = dn.num_queries
    assert d == 180
    idx = torch.arange(d + NQ)
    group = torch.where(idx < d, idx // 60, -1)
    for i in range(d + NQ):
        for jq in range(0, d + NQ, 7):
            blocked = bool(dn.attn_mask[i, jq])
            if jq >= d:
                assert not blocked  # everyone sees the matching queries
            elif i >= d:
                assert blocked  # a matching query sees no dn query
            else:
                assert blocked == (group[i] != group[jq]).item()


def test_negatives_are_noised_further_than_positives():
    gen = torch.Generator().manual_seed(2)
    labels, boxes, valid = _batch([20, 20], 20, gen)  # boxes well inside: the [0, 1] clip never bites
    boxes[..., :2] = 0.5
    boxes[..., 2:] = boxes[..., 2:].clamp(max=0.3)
    dn = denoising_group(labels, boxes, valid, NC, NQ, nn.Embedding(NC + 1, 4), generator=gen)
    k = 20
    j = torch.arange(dn.num_queries) % k
    true = cxcywh_to_xyxy(boxes[:, j])
    noised = cxcywh_to_xyxy(dn.boxes_unact.sigmoid())
    half = boxes[:, j, 2:].repeat(1, 1, 2) * 0.5  # the noise unit per corner
    rel = ((noised - true).abs() / half)  # |u| per corner: [0, 1) positives, [1, 2) negatives
    # A box whose corners crossed (|u| > 1 towards each other) comes back with w or h clipped to
    # ~0 by inverse_sigmoid, as upstream; those rows do not keep their corners, so skip them.
    kept = (dn.boxes_unact.sigmoid()[..., 2:] > 1e-3).all(-1, keepdim=True).expand_as(rel)
    pos, neg = rel[kept & ~dn.negative.view(1, -1, 1)], rel[kept & dn.negative.view(1, -1, 1)]
    assert pos.numel() > 100 and neg.numel() > 100
    assert pos.max() < 1 + 1e-3 and neg.min() > 1 - 1e-3 and neg.max() < 2 + 1e-3
    # Label noise: about label_noise_ratio / 2 * (1 - 1 / NC) of the slots change class.
    changed = (dn.labels != labels[:, j]).float().mean().item()
    assert 0.1 < changed < 0.3


def test_generator_makes_it_reproducible_and_rows_need_not_be_packed():
    labels, boxes, valid = _batch([3, 2], 6, torch.Generator().manual_seed(3))
    embed = nn.Embedding(NC + 1, 4)
    a = denoising_group(labels, boxes, valid, NC, NQ, embed, generator=torch.Generator().manual_seed(9))
    perm = torch.tensor([5, 0, 4, 1, 3, 2])  # scatter the real rows among the padding
    b = denoising_group(labels[:, perm], boxes[:, perm], valid[:, perm], NC, NQ, embed,
                        generator=torch.Generator().manual_seed(9))
    assert torch.equal(a.labels, b.labels) and torch.allclose(a.boxes_unact, b.boxes_unact)
    assert torch.equal(torch.where(b.target >= 0, perm[b.target.clamp(min=0)], -1), a.target)


@pytest.mark.parametrize("counts", [[30, 2], [1, 0], [0, 0]], ids=["k30", "k1", "empty"])
def test_static_layout_is_the_default_one_with_dead_slots_after_it(counts):
    """`static=True` sizes D by the padded width alone (2 max(N, M)) and keeps K and G on the
    device: its first 2 K G slots are the default's, from the same generator state, and the rest
    are dead (no target, blocked as keys for every query, `live` False)."""
    m, n = 40, 100
    labels, boxes, valid = _batch(counts, m, torch.Generator().manual_seed(2))
    embed = nn.Embedding(NC + 1, 4, padding_idx=NC)
    static = denoising_group(labels, boxes, valid, NC, NQ, embed, num_denoising=n,
                             generator=torch.Generator().manual_seed(3), static=True)
    d = 2 * max(n, m)
    assert static.num_queries == d and static.live.shape == (d,)
    default = denoising_group(labels, boxes, valid, NC, NQ, embed, num_denoising=n,
                              generator=torch.Generator().manual_seed(3))
    if default is None:  # no boxes: every slot dead, and the matching queries still see each other
        assert not static.live.any() and (static.target == -1).all()
        assert not static.attn_mask[d:, d:].any() and static.attn_mask[:, :d].all()
        return
    live = default.num_queries
    assert static.live.tolist() == [True] * live + [False] * (d - live)
    assert torch.equal(static.labels[:, :live], default.labels)
    assert torch.equal(static.boxes_unact[:, :live], default.boxes_unact)
    assert torch.equal(static.target[:, :live], default.target) and (static.target[:, live:] == -1).all()
    assert torch.equal(static.negative[:live], default.negative)
    assert torch.equal(static.groups, default.groups)
    # The live block of the mask is the default's; a dead slot is blocked as a key for everyone.
    keep = torch.cat((static.live, torch.ones(NQ, dtype=torch.bool)))
    assert torch.equal(static.attn_mask[keep][:, keep], default.attn_mask)
    assert static.attn_mask[:, ~keep].all()


def test_padding_the_targets_does_not_change_the_default_noise():
    """The default draws its noise for 2 max(N, K) slots, so padded target slots (a bigger M)
    leave every number unchanged, even past N."""
    gen = torch.Generator().manual_seed(4)
    labels, boxes, valid = _batch([12, 3], 12, gen)
    embed = nn.Embedding(NC + 1, 4, padding_idx=NC)
    pad = 30
    labels_p = torch.cat((labels, torch.ones(2, pad, dtype=labels.dtype)), 1)
    boxes_p = torch.cat((boxes, torch.full((2, pad, 4), 0.5)), 1)
    valid_p = torch.cat((valid, torch.zeros(2, pad, dtype=torch.bool)), 1)
    a = denoising_group(labels, boxes, valid, NC, NQ, embed, num_denoising=10, generator=torch.Generator().manual_seed(5))
    b = denoising_group(labels_p, boxes_p, valid_p, NC, NQ, embed, num_denoising=10,
                        generator=torch.Generator().manual_seed(5))
    assert torch.equal(a.labels, b.labels) and torch.equal(a.boxes_unact, b.boxes_unact)
    assert torch.equal(a.target, b.target) and torch.equal(a.attn_mask, b.attn_mask)
