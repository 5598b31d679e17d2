"""Shared DETR layers (families/detr/layers.py): deformable attention's sampling against a
direct per-point computation (bilinear and discrete), v1 (int points) = v2 (equal per-level
list), the upstream init, and the row-major 2D sin-cos embedding."""

import torch

from libreyolo.families.detr.layers import MSDeformableAttention, sincos_pos_embed_2d

SHAPES = [(4, 6), (2, 3)]


def _bilinear(v, x, y):
    """v [C, h, w], pixel-centre convention (align_corners False), zeros outside."""
    c, h, w = v.shape
    px, py = x * w - 0.5, y * h - 0.5
    x0, y0 = int(torch.floor(px)), int(torch.floor(py))
    out = torch.zeros(c)
    for dx in (0, 1):
        for dy in (0, 1):
            xi, yi = x0 + dx, y0 + dy
            wgt = (1 - abs(px - xi)) * (1 - abs(py - yi))
            if 0 <= xi < w and 0 <= yi < h:
                out += wgt * v[:, yi, xi]
    return out


def _direct(attn_mod, value, loc, weights, discrete):
    """[1, Lv, C] value, loc [1, Lq, H, P, 2], weights [1, Lq, H, P] -> [1, Lq, C], point by point."""
    heads, hd = attn_mod.heads, attn_mod.head_dim
    levels = value[0].split([h * w for h, w in SHAPES])
    level_of = [lv for lv, n in enumerate(attn_mod.points) for _ in range(n)]
    lq = loc.shape[1]
    out = torch.zeros(1, lq, heads * hd)
    for q in range(lq):
        for hh in range(heads):
            for p, lv in enumerate(level_of):
                h, w = SHAPES[lv]
                v = levels[lv][:, hh * hd:(hh + 1) * hd].T.reshape(hd, h, w)
                x, y = loc[0, q, hh, p]
                if discrete:
                    xi = min(max(int(torch.floor(x * w + 0.5)), 0), w - 1)
                    yi = min(max(int(torch.floor(y * h + 0.5)), 0), h - 1)
                    s = v[:, yi, xi]
                else:
                    s = _bilinear(v, x, y)
                out[0, q, hh * hd:(hh + 1) * hd] += weights[0, q, hh, p] * s
    return out


def test_sampling_matches_a_direct_computation():
    torch.manual_seed(0)
    for points, method in [(2, "default"), ([2, 3], "default"), ([2, 2], "discrete")]:
        m = MSDeformableAttention(8, 2, 2, points, method)
        total = sum(m.points)
        value = torch.randn(1, sum(h * w for h, w in SHAPES), 8)
        loc = torch.rand(1, 3, 2, total, 2) * 1.2 - 0.1  # some points fall outside the map
        weights = torch.rand(1, 3, 2, total)
        got = m._sample(value, SHAPES, loc, weights)
        assert torch.allclose(got, _direct(m, value, loc, weights, method == "discrete"), atol=1e-5), (points, method)


def test_v1_int_points_equal_v2_list_and_upstream_init():
    torch.manual_seed(0)
    v1 = MSDeformableAttention(16, 4, 2, 3)
    v2 = MSDeformableAttention(16, 4, 2, [3, 3])
    v2.load_state_dict(v1.state_dict())
    q, value = torch.randn(2, 5, 16), torch.randn(2, 30, 16)
    ref = torch.rand(2, 5, 1, 4)
    assert torch.allclose(v1(q, ref, value, SHAPES), v2(q, ref, value, SHAPES))
    bias = v1.sampling_offsets.bias.view(4, 6, 2)  # heads, level-major points, xy
    assert torch.allclose(bias[0, :3], torch.tensor([[1.0, 0], [2, 0], [3, 0]]))  # head 0 points along +x, 1..n
    assert torch.allclose(bias[1, :3], torch.tensor([[0.0, 1], [0, 2], [0, 3]]), atol=1e-6)  # head 1: +y
    assert (v1.attention_weights.weight == 0).all() and (v1.sampling_offsets.weight == 0).all()
    assert not MSDeformableAttention(16, 4, 2, 3, "discrete").sampling_offsets.weight.requires_grad


def test_sincos_embedding_is_row_major():
    pe = sincos_pos_embed_2d(2, 3, 8)[0]  # tokens (y, x) row-major; [sin x, cos x, sin y, cos y] x 2 freqs
    assert pe.shape == (6, 8)
    x = torch.tensor([0, 1, 2, 0, 1, 2.0])
    y = torch.tensor([0, 0, 0, 1, 1, 1.0])
    assert torch.allclose(pe[:, 0], x.sin()) and torch.allclose(pe[:, 4], y.sin())
    assert torch.allclose(pe[:, 3], (x / 100).cos()) and torch.allclose(pe[:, 7], (y / 100).cos())
