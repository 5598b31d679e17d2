"""The batched Hungarian matcher (families/detr/matcher.py): a hand-worked optimum, random
batches against scipy on the real rows only (padded rows, an image without boxes, more targets
than queries), and the cost against upstream's formula written out per pair."""

import subprocess
import sys

import numpy as np
import pytest
import torch
from scipy.optimize import linear_sum_assignment

from libreyolo.families.detr.boxes import cxcywh_to_xyxy, pairwise_giou
from libreyolo.families.detr.matcher import hungarian_match, match_cost, solve

BACKENDS = ["scipy", "tla"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_hand_worked_3x3(backend):
    # rows = targets, columns = queries. Optimum 1 + 2 + 2 = 5: t0->q1, t1->q0, t2->q2 (the other
    # five permutations cost 6, 6, 7, 9, 11).
    cost = torch.tensor([[[4.0, 1.0, 3.0], [2.0, 0.0, 5.0], [3.0, 2.0, 2.0]]])
    res = solve(cost, torch.ones(1, 3, dtype=torch.bool), backend)
    assert res.query.tolist() == [[1, 0, 2]] and res.matched.all()
    # A padded fourth target (any junk cost) and a fourth query change nothing for the real rows.
    cost4 = torch.tensor([[[4.0, 1.0, 3.0, 9.0], [2.0, 0.0, 5.0, 9.0], [3.0, 2.0, 2.0, 9.0], [-50, -50, -50, 7.0]]])
    res = solve(cost4, torch.tensor([[True, True, True, False]]), backend)
    assert res.query[0, :3].tolist() == [1, 0, 2] and res.matched.tolist() == [[True, True, True, False]]


def _random_sets(gen, n, q, m, c):
    logits = torch.randn(n, q, c, generator=gen) * 2
    boxes = torch.cat((torch.rand(n, q, 2, generator=gen) * 0.6 + 0.2, torch.rand(n, q, 2, generator=gen) * 0.3 + 0.05), -1)
    labels = torch.randint(0, c, (n, m), generator=gen)
    tboxes = torch.cat((torch.rand(n, m, 2, generator=gen) * 0.6 + 0.2, torch.rand(n, m, 2, generator=gen) * 0.3 + 0.05), -1)
    return logits, boxes, labels, tboxes


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("q,counts", [(10, [6, 3, 0, 1, 5]), (4, [6, 3, 5, 0, 4])])  # Q >= M; Q < M
def test_random_batches_match_scipy_on_the_real_rows(backend, q, counts):
    gen = torch.Generator().manual_seed(q)
    n, m, c = len(counts), 6, 5
    logits, boxes, labels, tboxes = _random_sets(gen, n, q, m, c)
    valid = torch.arange(m) < torch.tensor(counts).unsqueeze(1)
    tboxes = torch.where(valid.unsqueeze(-1), tboxes, torch.tensor(1e3))  # junk padding rows
    res = hungarian_match(logits, boxes, labels, tboxes, valid, backend)
    cost = match_cost(logits, boxes, labels, tboxes)
    for i, k in enumerate(counts):
        rows, cols = linear_sum_assignment(cost[i, :k].numpy())  # upstream: real rows only, rectangular
        want = np.full(m, -1)
        want[rows] = cols
        got = torch.where(res.matched[i], res.query[i], -1).numpy()
        assert (got == want).all(), (i, got, want)
    assert not res.matched[~valid].any()
    assert res.matched.sum(1).tolist() == [min(k, q) for k in counts]


def test_cost_is_upstreams_formula():
    gen = torch.Generator().manual_seed(0)
    logits, boxes, labels, tboxes = _random_sets(gen, 1, 7, 3, 4)
    cost = match_cost(logits, boxes, labels, tboxes)[0]  # [M, Q]
    p = logits[0].sigmoid()[:, labels[0]]  # [Q, M]
    focal = 0.25 * (1 - p) ** 2 * -(p + 1e-8).log() - 0.75 * p ** 2 * -(1 - p + 1e-8).log()
    l1 = (boxes[0][:, None] - tboxes[0][None]).abs().sum(-1)
    g = pairwise_giou(cxcywh_to_xyxy(boxes), cxcywh_to_xyxy(tboxes))[0]
    assert torch.allclose(cost, (2 * focal + 5 * l1 - 2 * g).T, atol=1e-5)


def test_giou_against_torchvision():
    torchvision = pytest.importorskip("torchvision")
    gen = torch.Generator().manual_seed(3)
    a = cxcywh_to_xyxy(torch.rand(1, 5, 4, generator=gen) * 0.5 + 0.1)
    b = cxcywh_to_xyxy(torch.rand(1, 6, 4, generator=gen) * 0.5 + 0.1)
    assert torch.allclose(pairwise_giou(a, b)[0], torchvision.ops.generalized_box_iou(a[0], b[0]), atol=1e-5)


def test_the_registry_does_not_import_the_solvers():
    # Every command imports every family; the solvers (and scipy.optimize under the Triton one, 0.7 s
    # on a 2-core machine) load on a DETR's first match only.
    code = ("import sys, libreyolo.model, libreyolo.families; "
            "print(sorted(m for m in ('scipy', 'torch_linear_assignment') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def _fresh_caches(monkeypatch, module):
    from libreyolo.families.detr import matcher

    matcher._tla.cache_clear()
    matcher._unchecked_triton.cache_clear()
    monkeypatch.setitem(sys.modules, "torch_linear_assignment._triton", module)
    monkeypatch.setattr("torch_linear_assignment._triton", module, raising=False)


@pytest.mark.parametrize("has_switch", [True, False], ids=["with-switch", "without"])
def test_the_unchecked_triton_solve_is_used_only_where_its_signature_has_the_switch(monkeypatch, has_switch):
    """The private switch is checked by signature, not assumed: a torch-linear-assignment whose
    Triton solve takes no `validation` keeps its checked (host-reading) solve."""
    import types

    from libreyolo.families.detr import matcher

    calls = []
    if has_switch:
        def batch_linear_assignment(cost, *, validation="full"):
            calls.append(validation)
            return cost.argmin(-1)
    else:
        def batch_linear_assignment(cost):
            calls.append(None)
            return cost.argmin(-1)
    _fresh_caches(monkeypatch, types.SimpleNamespace(batch_linear_assignment=batch_linear_assignment))
    try:
        fn = matcher._unchecked_triton()
        if has_switch:
            assert fn is not None
            fn(torch.zeros(1, 2, 3))
            assert calls == ["off"]
        else:
            assert fn is None
    finally:
        matcher._tla.cache_clear()
        matcher._unchecked_triton.cache_clear()


def test_a_cpu_solve_makes_no_device_sync_and_tells_the_capture_check():
    """On CPU tensors the solve has no CUDA sync to count, but it runs on the host: it says so
    through markers.host_work, which is what the whole-step capture check listens to."""
    from libreyolo import markers
    from libreyolo.families.detr.matcher import host_syncs

    assert host_syncs(torch.device("cpu")) == 0
    seen = []
    with markers.watching_host_work(seen.append):
        solve(torch.rand(1, 3, 5), torch.ones(1, 3, dtype=torch.bool), "scipy")
    assert len(seen) == 1 and "host" in seen[0]
