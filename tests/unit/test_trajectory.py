"""Our training schedule, iteration by iteration, against the peer's recorded trace.

tests/fixtures/peer/trajectory.json holds Ultralytics' schedule columns (benchmarks/trajectory.py
`run --fixture`): per iteration the LR, momentum/beta1 and weight decay of every parameter group,
the batches it accumulates per step, whether it stepped, and the EMA's update count and decay. Our
columns come from the code the trainer runs (config resolution, LRSchedule, build_optimizer,
ModelEMA), driven through the same iterations. LR, momentum, weight decay and the accumulation
ramp must agree at every iteration; where the optimizer steps differs by design only at epoch
ends (we always step there, the peer carries a partial accumulation over), and the EMA decay must
agree at every update count both reach.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from torch import nn

from libreyolo.config import TrainConfig
from libreyolo.engine.ema import ModelEMA
from libreyolo.engine.optim import accumulate_steps, build_optimizer, resolve_auto
from libreyolo.engine.schedule import LRSchedule

FIXTURE = json.loads((Path(__file__).parents[1] / "fixtures" / "peer" / "trajectory.json").read_text())
CASES = FIXTURE["cases"]


def _peer(case: str) -> list[dict]:
    """The fixture's compact form (benchmarks/trajectory.py `fixture_rows`) as one dict a row."""
    c = CASES[case]["peer"]
    out, updates = [], 0
    for row in c["rows"]:
        lr, accumulate, stepped = row[:3]
        updates += stepped
        out.append({"lr": lr if isinstance(lr, list) else [lr] * 3,
                    "momentum": c["momentum"] if c["momentum"] is not None else row[3],
                    "weight_decay": c["weight_decay"], "accumulate": accumulate, "stepped": bool(stepped),
                    "ema_updates": updates, "ema_decay": c["ema_decay"][str(updates)]})
    return out


def _ours(case: str) -> list[dict]:
    """Our columns for the case's settings, from the trainer's own pieces."""
    s = CASES[case]["settings"]
    steps_per_epoch = math.ceil(s["images"] / s["batch"])
    cfg = TrainConfig(epochs=s["epochs"], batch=s["batch"], nbs=s["nbs"], imgsz=s["imgsz"])
    updates = cfg.epochs * math.ceil(steps_per_epoch / accumulate_steps(cfg.batch, cfg.nbs))
    cfg, _ = resolve_auto(cfg, s["classes"], updates)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Conv2d(4, 4, 1))
    optimizer = build_optimizer(model, cfg, device_type="cpu")
    schedule = LRSchedule(optimizer, cfg, steps_per_epoch, accumulate_steps(cfg.batch, cfg.nbs))
    ema = ModelEMA(model, tau=cfg.ema_tau)
    rows, since = [], 0
    for epoch in range(cfg.epochs):
        for b in range(steps_per_epoch):
            schedule.step(epoch * steps_per_epoch + b)
            since += 1
            stepped = schedule.steps_optimizer(epoch, b, since)
            since = 0 if stepped else since
            ema.updates += stepped
            groups = optimizer.param_groups
            rows.append({"lr": [g["lr"] for g in groups], "momentum": groups[0]["betas"][0]
                         if "betas" in groups[0] else groups[0]["momentum"],
                         "weight_decay": [g["weight_decay"] for g in groups],
                         "accumulate": schedule.accumulate_at(epoch, b), "stepped": stepped,
                         "ema_updates": ema.updates, "ema_decay": ema.current_decay(), "epoch_end":
                         b + 1 == steps_per_epoch})
    return rows


def test_the_fixture_covers_the_regimes_that_matter():
    settings = {c: v["settings"] for c, v in CASES.items()}
    per_epoch = {c: math.ceil(s["images"] / s["batch"]) for c, s in settings.items()}
    accumulate = {c: accumulate_steps(s["batch"], s["nbs"]) for c, s in settings.items()}
    assert any(per_epoch[c] < accumulate[c] for c in CASES)  # an epoch shorter than one accumulation
    assert any(accumulate[c] == 1 for c in CASES)             # no accumulation at all
    assert FIXTURE["peer_version"]


@pytest.mark.parametrize("case", list(CASES))
def test_schedule_columns_match_every_iteration(case):
    peer, ours = _peer(case), _ours(case)
    assert len(ours) == len(peer)
    for i, (p, o) in enumerate(zip(peer, ours)):
        assert o["lr"] == pytest.approx(p["lr"], rel=1e-5, abs=1e-10), f"lr at iteration {i}"
        assert o["momentum"] == pytest.approx(p["momentum"], rel=1e-5), f"momentum at iteration {i}"
        assert o["weight_decay"] == pytest.approx(p["weight_decay"], rel=1e-5), f"decay at iteration {i}"
        assert o["accumulate"] == p["accumulate"], f"accumulation ramp at iteration {i}"


@pytest.mark.parametrize("case", list(CASES))
def test_steps_differ_only_at_epoch_ends(case):
    """Replaying the peer's rule (step once `accumulate` batches are in, counted across epochs)
    with our one difference (also step at every epoch end) gives exactly our steps; where an
    accumulation fits every epoch, the two are the same steps."""
    peer, ours = _peer(case), _ours(case)
    since_peer = since_ours = 0
    for i, (p, o) in enumerate(zip(peer, ours)):
        since_peer, since_ours = since_peer + 1, since_ours + 1
        assert p["stepped"] == (since_peer >= p["accumulate"]), f"peer's rule at iteration {i}"
        assert o["stepped"] == (since_ours >= p["accumulate"] or o["epoch_end"]), f"ours at iteration {i}"
        since_peer = 0 if p["stepped"] else since_peer
        since_ours = 0 if o["stepped"] else since_ours
    if all(p["accumulate"] == 1 for p in peer):
        assert [p["stepped"] for p in peer] == [o["stepped"] for o in ours]


@pytest.mark.parametrize("case", list(CASES))
def test_ema_decay_matches_per_update(case):
    peer = {p["ema_updates"]: p["ema_decay"] for p in _peer(case)}
    ours = {o["ema_updates"]: o["ema_decay"] for o in _ours(case)}
    common = sorted(set(peer) & set(ours))
    assert len(common) >= 3
    for n in common:
        assert ours[n] == pytest.approx(peer[n], rel=1e-5), f"EMA decay after {n} updates"
