"""LingBot-Vision s (families/lingbot): the axial RoPE's relative-position property, the token layout
(CLS, 4 registers, patches; RoPE on the patches only), output shapes at 64 and 96 px, the exact
parameter count and GFLOPs, names, and the backbone against timm's DINOv3 ViT-S/16 port given our
weights (the same forward computation: a different RoPE base or layout, register count or place,
norm epsilon, bias or block order shows)."""

import re

import pytest
import torch

from libreyolo.families import get_family, parse_arch, parse_official
from libreyolo.families.lingbot.rope import rope_tables, rotate
from libreyolo.families.lingbot.vit import ViT

pytestmark = pytest.mark.usefixtures("one_thread")

HEAD_DIM = 64  # 384 / 6 heads


def _rotated(vec: torch.Tensor, sin, cos, index: int) -> torch.Tensor:
    """`vec` [D] as the patch token at grid index `index` (no prefix), rotated."""
    return rotate(vec.expand(sin.shape[0], -1), sin, cos)[index]


def test_rope_attention_logits_depend_only_on_the_offset():
    """q.k of two rotated patch tokens is a function of their grid offset: the same pair moved
    together scores the same, another offset scores differently."""
    h = w = 8
    sin, cos = rope_tables(h, w, HEAD_DIM)
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, HEAD_DIM, generator=gen, dtype=torch.float64).float()

    def logit(a, b):  # a, b: (row, col)
        return float(_rotated(q, sin, cos, a[0] * w + a[1]) @ _rotated(k, sin, cos, b[0] * w + b[1]))

    base = logit((1, 2), (3, 5))
    for dy, dx in [(0, 1), (2, 0), (4, 2), (-1, -2)]:
        assert logit((1 + dy, 2 + dx), (3 + dy, 5 + dx)) == pytest.approx(base, rel=1e-5, abs=1e-5)
    assert abs(logit((1, 2), (3, 6)) - base) > 1e-3  # one column more: another logit
    assert abs(logit((1, 2), (4, 5)) - base) > 1e-3  # one row more
    # A rotation keeps the length of every vector.
    assert torch.allclose(_rotated(q, sin, cos, 27).norm(), q.norm(), rtol=1e-5)


def test_rope_table_layout():
    """Channel c < 16: row angle with period 100^(c/16); 16 <= c < 32: column angle, period
    100^((c-16)/16); channels 32-63 repeat 0-31. Cell centres at 2 (i + 0.5) / n - 1, each axis by
    its own length. Checked entry by entry in float64 on a 2 x 4 grid."""
    import math

    h, w = 2, 4
    sin, cos = rope_tables(h, w, HEAD_DIM)
    assert sin.shape == cos.shape == (h * w, HEAD_DIM) and sin.dtype == torch.float32
    for i in range(h):
        for j in range(w):
            y, x = 2 * (i + 0.5) / h - 1, 2 * (j + 0.5) / w - 1
            for c in range(HEAD_DIM):
                k, coord = c % 16, (y if c % 32 < 16 else x)
                angle = 2 * math.pi * coord / 100 ** (k / 16)
                assert sin[i * w + j, c] == pytest.approx(math.sin(angle), abs=1e-6)
                assert cos[i * w + j, c] == pytest.approx(math.cos(angle), abs=1e-6)


def test_registers_follow_cls_and_rope_skips_them():
    torch.manual_seed(0)
    vit = ViT(depth=1)
    images = torch.rand(2, 3, 64, 96)
    tokens, h, w = vit.prepare_tokens(images)
    assert (h, w) == (4, 6) and tokens.shape == (2, 1 + 4 + 24, 384)
    assert torch.equal(tokens[:, 0], vit.cls_token[0].expand(2, -1))
    assert torch.equal(tokens[:, 1:5], vit.registers.expand(2, -1, -1))
    patches = vit.patch_embed(images).flatten(2).transpose(1, 2)  # row-major
    assert torch.equal(tokens[:, 5:], patches)
    sin, cos = rope_tables(h, w, HEAD_DIM, vit.prefix)
    assert vit.prefix == 5 and sin.shape == (29, HEAD_DIM)
    x = torch.randn(2, 6, 29, HEAD_DIM)
    turned = rotate(x, sin, cos)
    assert torch.equal(turned[:, :, :5], x[:, :, :5])  # exactly: no position for CLS and registers
    assert torch.equal(turned[:, :, 5:], rotate(x[:, :, 5:], *rope_tables(h, w, HEAD_DIM)))
    assert not torch.allclose(turned[:, :, 5:], x[:, :, 5:])


def test_output_shapes_at_64_and_96_px():
    """Tokens [B, 5 + (S/16)^2, 384] and logits [B, C, S/16, S/16] at both sizes from one model (the
    RoPE tables follow the grid); predict's probabilities at the input size: test_segmenters.py."""
    torch.manual_seed(0)
    model = get_family("lingbot").build("s", 7).train()
    for px in (64, 96):
        images = torch.rand(2, 3, px, px)
        (logits,) = model.capturable(images)
        assert logits.shape == (2, 7, px // 16, px // 16) and torch.isfinite(logits).all()
        with torch.no_grad():
            assert model.backbone(images).shape == (2, 5 + (px // 16) ** 2, 384)


def test_parameter_count():
    """Derived from the architecture: within 5 % of ViT-S's published size (21.6 M for the released
    LingBot-Vision ViT-S/16 as timm counts it, which adds the pretraining mask token and a masked key
    bias, 384 + 12 x 384 parameters that do nothing here). test_segmenters.py checks the built model
    at 150 classes against the sum with the head."""
    d, depth, mlp = 384, 12, 1536
    block = (2 * 2 * d            # two LayerNorms
             + d * 3 * d + 2 * d  # fused qkv weight, query and value biases (no key bias)
             + d * d + d          # output projection
             + d * mlp + mlp + mlp * d + d  # MLP
             + 2 * d)             # two LayerScales
    backbone = (3 * 16 * 16 * d + d) + (1 + 4) * d + depth * block + 2 * d
    head = 2 * d + d * 150 + 150  # BatchNorm, 1 x 1 conv
    assert sum(p.numel() for p in ViT().parameters()) == backbone == 21_596_160
    assert backbone + head == 21_654_678
    assert abs(backbone - 21.6e6) / 21.6e6 < 0.05


def test_gflops_at_the_default_size():
    """torch's FlopCounterMode (2 x multiply-adds) at 512 px and 150 classes equals the count derived
    by hand: 63.94 GFLOPs (docs/families.md). On the meta device (no arithmetic is done), with SDPA's
    math backend, whose matmuls the counter sees (the fused CPU kernel is not counted)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    d, px, classes = 384, 512, 150
    cells = (px // 16) ** 2
    n = 5 + cells
    block = 2 * n * d * 3 * d + 2 * n * d * d + 2 * 2 * n * d * 4 * d + 2 * 2 * n * n * d
    want = 12 * block + 2 * cells * 3 * 16 * 16 * d + 2 * cells * d * classes
    with torch.device("meta"):
        model = get_family("lingbot").build("s", classes).eval()
        images = torch.rand(1, 3, px, px)
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model.capturable(images)
    assert counter.get_total_flops() == want == 63_937_382_400


def test_names():
    spec = get_family("lingbot")
    for name in ("lingbot-s", "LingBot-Vision-S", "lingbot_vision_small", "lingbots"):
        assert parse_arch(name) == (spec, "s"), name
    assert parse_official("LibreLingBotVisions.pt") == (spec, "s")
    assert spec.tasks == ("segment",) and spec.capture.region == "network"


def _timm_key(key: str) -> str:
    key = key.replace("registers", "reg_token").replace("patch_embed.", "patch_embed.proj.")
    key = re.sub(r"ls(\d)\.gamma", r"gamma_\1", key)
    return key.replace("mlp.0.", "mlp.fc1.").replace("mlp.2.", "mlp.fc2.")


def test_backbone_equals_timms_dinov3_vit_s16():
    """LingBot-Vision's ViT-S config is DINOv3's ViT-S/16 (RoPE base 100, 4 registers, LayerScale,
    LayerNorm eps 1e-5, no key bias): timm's port of it, given our weights, computes our tokens.
    LayerScales and biases are drawn large so every block's branches count."""
    timm = pytest.importorskip("timm")
    if "vit_small_patch16_dinov3_qkvb" not in timm.list_models("vit_small_patch16_dinov3*"):
        pytest.skip("this timm has no DINOv3 port (timm >= 1.0.20)")
    torch.manual_seed(0)
    ours = ViT().eval()
    with torch.no_grad():
        for name, p in ours.named_parameters():
            if name.endswith(("gamma", "bias")):
                p.normal_(0, 0.5)
    ref = timm.create_model("vit_small_patch16_dinov3_qkvb", pretrained=False, num_classes=0).eval()
    ref.load_state_dict({_timm_key(k): v for k, v in ours.state_dict().items()}, strict=True)
    images = torch.randn(2, 3, 64, 96)
    with torch.no_grad():
        torch.testing.assert_close(ours(images), ref.forward_features(images), rtol=1e-5, atol=1e-5)
