"""Trajectory trace: what our trainer and the peer's (Ultralytics) do at every iteration.

    # both sides, one case, and the first iteration where they part (needs the peer installed)
    python benchmarks/trajectory.py run --case one-batch-epochs --peer-python /path/to/peer/python \
        --out /tmp/trace [--fixture tests/fixtures/peer/trajectory.json]
    python benchmarks/trajectory.py compare /tmp/trace/peer_one-batch-epochs.json /tmp/trace/ours_one-batch-epochs.json

Per iteration, for every parameter group: the learning rate, the momentum (SGD) or beta1 (AdamW)
and the weight decay; for the iteration: the batches accumulated so far, whether the optimizer
stepped, the EMA's decay and update count, the loss items and the gradient norm that clipping saw.

Both trainers train YOLOv9-t from the same initial weights (the peer's, mapped onto ours:
`map_weights`) on the same generated PNG images (`trace_data`: square, exactly `imgsz`, so
neither side resizes) with every augmentation off, on the CPU in float32. A case whose epoch is
one batch feeds both sides the same images at every iteration, so the loss items and gradient
norms are comparable value for value until the first difference in what the trainers do; in a
case of several batches an epoch the two samplers order the images differently, and only the
schedule columns (LR, momentum, decay, accumulation, steps, EMA) are comparable.

`--fixture` writes the peer's schedule columns, rounded, to the fixture that
tests/unit/test_trajectory.py checks ours against without the peer installed.
Ultralytics (AGPL) runs in its own environment and is driven through its public API and callbacks
only; nothing of it is copied here.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Each case: the keys a user would type (plus augmentation off, which the trace needs). nb, the
# batches an epoch, and accumulate = round(nbs / batch) are what the cases vary.
CASES = {
    # nb = 1 < accumulate = 8: the small-data regime, where an epoch is shorter than one accumulation
    "one-batch-epochs": {"images": 8, "batch": 8, "nbs": 64, "epochs": 40, "imgsz": 96, "classes": 1},
    # nb = 3, accumulate 8, a 30-epoch run: warmup that counts epochs against a fixed floor
    "short-run": {"images": 24, "batch": 8, "nbs": 64, "epochs": 30, "imgsz": 96, "classes": 2},
    # nb = 7, accumulate 8: the aerial-tile regime (56 tiles, batch 8), an accumulation that
    # straddles epoch ends
    "seven-batch-epochs": {"images": 56, "batch": 8, "nbs": 64, "epochs": 16, "imgsz": 96, "classes": 1},
    # nb = 4, no accumulation (nbs = batch), 10 epochs: the decay and the warmup alone
    "no-accumulation": {"images": 32, "batch": 8, "nbs": 8, "epochs": 10, "imgsz": 96, "classes": 3},
}
AUG_OFF = {"mosaic": 0.0, "mixup": 0.0, "scale": 0.0, "translate": 0.0, "fliplr": 0.0,
           "hsv_h": 0.0, "hsv_s": 0.0, "hsv_v": 0.0, "degrees": 0.0, "shear": 0.0}
# Columns compared, with their relative tolerance. Schedule columns must agree to rounding; loss
# items and gradient norms (same weights, same images) to float32 noise that grows over steps.
TOLERANCE = {"lr": 1e-6, "momentum": 1e-6, "weight_decay": 1e-6, "accumulate": 0, "stepped": 0,
             "ema_decay": 1e-6, "ema_updates": 0, "loss_items": 2e-3, "grad_norm": 2e-2}
SCHEDULE = ("lr", "momentum", "weight_decay", "accumulate", "stepped", "ema_decay", "ema_updates")


def trace_data(root: Path, case: dict) -> Path:
    """`case['images']` square PNGs of exactly `imgsz` with 2-6 shapes each, and their yaml."""
    import numpy as np
    import torch
    from torchvision.io import encode_png

    from libreyolo.data.regimes import Regime, render
    from libreyolo.data.shapes import NAMES

    size, n = case["imgsz"], case["images"]
    regime = Regime(tuple(NAMES[:case["classes"]]), n, 0, (size, size), (size, size), (2, 6), ((1.0, 10, 40),))
    for split in ("train", "val"):
        (root / "images" / split).mkdir(parents=True, exist_ok=True)
        (root / "labels" / split).mkdir(parents=True, exist_ok=True)
        for i in range(n if split == "train" else 2):
            img, rows = render(np.random.default_rng([17, i, split == "val"]), regime)
            png = encode_png(torch.from_numpy(img).permute(2, 0, 1).contiguous())
            (root / "images" / split / f"{i:03d}.png").write_bytes(png.numpy().tobytes())
            (root / "labels" / split / f"{i:03d}.txt").write_text("".join(rows))
    names = "\n".join(f"  {i}: {c}" for i, c in enumerate(regime.classes))
    yaml = root / "data.yaml"
    yaml.write_text(f"path: {root}\ntrain: images/train\nval: images/val\nnames:\n{names}\n")
    return yaml


# ----------------------------------------------------------------------------- the peer's side
def run_peer(case_name: str, data: Path, out: Path, work: Path) -> None:
    """Train the peer (in this process: call it from the peer's environment) and write its trace
    and initial weights (`out`.pt)."""
    import torch
    from ultralytics import YOLO

    case = CASES[case_name]
    rows: list[dict] = []
    norms: list[float] = []
    clip = torch.nn.utils.clip_grad_norm_

    def clip_and_record(*args, **kwargs):  # the norm clipping saw: what the optimizer step used
        norm = clip(*args, **kwargs)
        norms.append(float(norm))
        return norm

    torch.nn.utils.clip_grad_norm_ = clip_and_record
    state: dict = {}

    def on_train_start(trainer) -> None:
        model = trainer.model
        state.update(state={k: v.detach().clone() for k, v in model.state_dict().items()},
                     order=_exec_order(model, lambda x: model(x), case["imgsz"], skip="model.22."))
        state["updates"] = trainer.ema.updates

    def on_batch_start(trainer) -> None:
        state["norms_before"] = len(norms)
        state["updates_before"] = trainer.ema.updates

    def on_batch_end(trainer) -> None:
        groups = trainer.optimizer.param_groups
        stepped = trainer.ema.updates > state["updates_before"]
        rows.append({
            "epoch": trainer.epoch, "images": [Path(f).stem for f in trainer.batch_im_files],
            "lr": [g["lr"] for g in groups],
            "momentum": [g["momentum"] if "momentum" in g else g["betas"][0] for g in groups],
            "weight_decay": [g["weight_decay"] for g in groups],
            "accumulate": int(trainer.accumulate), "stepped": bool(stepped),
            "ema_decay": float(trainer.ema.decay(trainer.ema.updates)), "ema_updates": int(trainer.ema.updates),
            "loss_items": [float(v) for v in (trainer.loss_items.values() if isinstance(trainer.loss_items, dict)
                                              else trainer.loss_items)],
            "grad_norm": norms[-1] if len(norms) > state["norms_before"] else None,
        })

    model = YOLO("yolov9t.yaml")
    model.add_callback("on_train_start", on_train_start)
    model.add_callback("on_train_batch_start", on_batch_start)
    model.add_callback("on_train_batch_end", on_batch_end)
    _record_batch_files(model)
    model.train(data=str(data), epochs=case["epochs"], batch=case["batch"], nbs=case["nbs"], imgsz=case["imgsz"],
                workers=0, device="cpu", amp=False, val=False, plots=False, seed=0, deterministic=True,
                project=str(work), name=f"peer-{case_name}", exist_ok=True, verbose=False, close_mosaic=0,
                **AUG_OFF)
    import ultralytics

    torch.save({"state": state["state"], "order": state["order"]}, out.with_suffix(".pt"))
    _write(out, "peer", case_name, rows, version=ultralytics.__version__)


def _record_batch_files(model) -> None:
    """Keep each batch's image files on the trainer (`batch_im_files`), through the public
    `preprocess_batch` the trainer calls on every batch."""
    def on_pretrain(trainer) -> None:
        original = trainer.preprocess_batch

        def preprocess(batch):
            trainer.batch_im_files = list(batch["im_file"])
            return original(batch)

        trainer.preprocess_batch = preprocess

    model.add_callback("on_pretrain_routine_start", on_pretrain)


# ----------------------------------------------------------------------------- our side
def run_ours(case_name: str, data: Path, out: Path | None, work: Path, init: Path | None = None) -> list[dict]:
    """Train ours with the case's keys (from the peer's initial weights when `init` is given) and
    return (and with `out`, write) our trace."""
    import torch

    from libreyolo import LibreYOLO
    from libreyolo.engine.hooks import Hook

    case = CASES[case_name]
    rows: list[dict] = []
    norms: list[float] = []
    clip = torch.nn.utils.clip_grad_norm_

    def clip_and_record(*args, **kwargs):
        norm = clip(*args, **kwargs)
        norms.append(float(norm))
        return norm

    class Trace(Hook):
        def before_train(self, trainer) -> None:
            if init is not None:
                ref = torch.load(init, weights_only=True)
                mapped = map_weights(ref, trainer.model, case["imgsz"])
                with torch.no_grad():
                    for name, t in {**dict(trainer.model.named_parameters()),
                                    **dict(trainer.model.named_buffers())}.items():
                        if name in mapped:
                            t.copy_(mapped[name])
                    if trainer.ema is not None:
                        trainer.ema.ema.load_state_dict(trainer.model.state_dict())
            criterion = trainer.ctx.criterion
            self.items = None

            def traced(preds, targets):
                loss, items = criterion(preds, targets)
                self.items = [float(v) for v in items]
                return loss, items

            trainer.ctx.criterion = traced

        def before_step(self, trainer) -> None:
            self.updates, self.norms = trainer.ema.updates, len(norms)

        def after_step(self, trainer) -> None:
            groups = trainer.optimizer.param_groups
            rows.append({
                "epoch": trainer.epoch, "images": None,
                "lr": [g["lr"] for g in groups],
                "momentum": [g["momentum"] if "momentum" in g else g["betas"][0] for g in groups],
                "weight_decay": [g["weight_decay"] for g in groups],
                "accumulate": int(trainer.schedule.accumulate_at(trainer.epoch, trainer.batch_index)),
                "stepped": trainer.ema.updates > self.updates,
                "ema_decay": float(trainer.ema.current_decay()), "ema_updates": int(trainer.ema.updates),
                "loss_items": self.items,
                "grad_norm": norms[-1] if len(norms) > self.norms else None,
            })

    torch.nn.utils.clip_grad_norm_ = clip_and_record
    try:
        LibreYOLO("yolo9-t").train(data=str(data), epochs=case["epochs"], batch=case["batch"], nbs=case["nbs"],
                                   imgsz=case["imgsz"], workers=0, device="cpu", val=False, seed=0,
                                   project=str(work), name=f"ours-{case_name}", exist_ok=True, hooks=[Trace()],
                                   **AUG_OFF)
    finally:
        torch.nn.utils.clip_grad_norm_ = clip
    if out is not None:
        _write(out, "ours", case_name, rows)
    return rows


def _exec_order(model, forward, imgsz: int, skip: str) -> list[str]:
    """Names of the Conv2d/BatchNorm2d modules in the order a forward first runs them, leaving out
    those whose name starts with `skip` (the head, mapped by name instead)."""
    import torch
    from torch import nn

    names = {m: n for n, m in model.named_modules()}
    seen: list[str] = []
    hooks = [m.register_forward_hook(lambda m, i, o: seen.append(names[m])) for m in model.modules()
             if isinstance(m, (nn.Conv2d, nn.BatchNorm2d))]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            forward(torch.zeros(1, 3, imgsz, imgsz))
    finally:
        model.train(was_training)
        for h in hooks:
            h.remove()
    return [n for i, n in enumerate(seen) if n not in seen[:i] and not n.startswith(skip)]


def map_weights(ref: dict, model, imgsz: int) -> dict:
    """The peer's YOLOv9-t tensors under our names: the body's modules pair up in the order a
    forward runs them (the two networks define their sub-modules in different orders, but compute
    the same graph: docs/training-performance.md), the head by name (cv2 -> box, cv3 -> cls)."""
    net = model.net
    ours = _exec_order(net, net, imgsz, skip="head.")
    theirs = ref["order"]
    if len(ours) != len(theirs):
        raise ValueError(f"the networks differ: {len(ours)} body modules here, {len(theirs)} in the peer's")
    state = ref["state"]
    mapped: dict = {}
    ours_modules = dict(net.named_modules())
    for mine, other in zip(ours, theirs):
        for key, tensor in {**dict(ours_modules[mine].named_parameters(recurse=False)),
                            **dict(ours_modules[mine].named_buffers(recurse=False))}.items():
            src = state[f"{other}.{key}"]
            if src.shape != tensor.shape:
                raise ValueError(f"{mine}.{key} {tuple(tensor.shape)} != {other}.{key} {tuple(src.shape)}")
            mapped[f"net.{mine}.{key}"] = src
    for key, src in state.items():
        for theirs_prefix, ours_prefix in (("model.22.cv2.", "net.head.box."), ("model.22.cv3.", "net.head.cls.")):
            if key.startswith(theirs_prefix) and "num_batches_tracked" not in key:
                mapped[ours_prefix + key[len(theirs_prefix):]] = src
    return mapped


# ----------------------------------------------------------------------------- comparing
def _write(out: Path, side: str, case: str, rows: list[dict], version: str | None = None) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"side": side, "case": case, "version": version, "settings": CASES[case],
                               "rows": rows}))


def first_differences(peer: list[dict], ours: list[dict], columns=tuple(TOLERANCE)) -> dict[str, dict]:
    """Per column, the first iteration where the two traces differ beyond its tolerance:
    {column: {"iteration", "peer", "ours"}}; a column that agrees throughout is absent. A length
    mismatch is reported under "iterations"."""
    found: dict[str, dict] = {}
    if len(peer) != len(ours):
        found["iterations"] = {"iteration": min(len(peer), len(ours)), "peer": len(peer), "ours": len(ours)}
    for i, (p, o) in enumerate(zip(peer, ours)):
        for col in columns:
            if col in found or p.get(col) is None or o.get(col) is None:
                continue
            if not _close(p[col], o[col], TOLERANCE[col]):
                found[col] = {"iteration": i, "epoch": p.get("epoch"), "peer": p[col], "ours": o[col]}
    return found


def _close(a, b, rel: float) -> bool:
    if isinstance(a, list):
        return len(a) == len(b) and all(_close(x, y, rel) for x, y in zip(a, b))
    if isinstance(a, bool) or rel == 0:
        return a == b
    return abs(a - b) <= rel * max(abs(a), abs(b)) + 1e-12


def report(peer: dict, ours: dict) -> str:
    same_images = peer["settings"]["images"] == peer["settings"]["batch"]
    columns = tuple(TOLERANCE) if same_images else SCHEDULE
    diffs = first_differences(peer["rows"], ours["rows"], columns)
    lines = [f"case {peer['case']} ({peer['settings']}): {len(peer['rows'])} peer / {len(ours['rows'])} ours iterations"
             + ("" if same_images else "; losses not compared (the samplers order the images differently)")]
    if not diffs:
        lines.append("no column differs beyond its tolerance")
    for col, d in sorted(diffs.items(), key=lambda kv: kv[1]["iteration"]):
        lines.append(f"  {col:12s} first differs at iteration {d['iteration']} (epoch {d.get('epoch')}): "
                     f"peer {_short(d['peer'])}  ours {_short(d['ours'])}")
    steps = (sum(r["stepped"] for r in peer["rows"]), sum(r["stepped"] for r in ours["rows"]))
    lines.append(f"  optimizer steps: peer {steps[0]}, ours {steps[1]}")
    return "\n".join(lines)


def _short(v) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(_short(x) for x in v) + "]"
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def fixture_rows(rows: list[dict]) -> dict:
    """The schedule columns of a trace, compact and rounded. Once per case: each group's weight
    decay (constant through a run), the momentum/beta1 when it is constant (else a column), and
    the EMA decay after each update count (the count is the steps so far: one EMA update a step);
    per iteration: [lr (one value when every group has the same, else one a group), accumulate,
    stepped(, momentum)]."""
    r = lambda x: float(f"{x:.6g}")  # the CPU test's tolerance is 1e-5
    steps = 0
    for row in rows:
        steps += row["stepped"]
        if row["ema_updates"] != steps:
            raise ValueError(f"EMA updates {row['ema_updates']} after {steps} optimizer steps")
    decays = {tuple(map(r, row["weight_decay"])) for row in rows}
    if len(decays) != 1:
        raise ValueError(f"the weight decay changed during the run: {sorted(decays)}")
    momenta = {r(row["momentum"][0]) for row in rows}
    out = []
    for row in rows:
        lr = [r(x) for x in row["lr"]]
        out.append([lr[0] if len(set(lr)) == 1 else lr, row["accumulate"], int(row["stepped"]),
                    *([] if len(momenta) == 1 else [r(row["momentum"][0])])])
    return {"weight_decay": list(decays.pop()), "momentum": momenta.pop() if len(momenta) == 1 else None,
            "ema_decay": {str(row["ema_updates"]): r(row["ema_decay"]) for row in rows}, "rows": out}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="trace both sides of one or more cases and print where they part")
    r.add_argument("--case", nargs="+", default=list(CASES), choices=list(CASES))
    r.add_argument("--peer-python", default=os.environ.get("PEER_PYTHON"), help="a Python with ultralytics installed")
    r.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "trajectory")
    r.add_argument("--fixture", type=Path, help="write the peer's schedule columns here (tests/fixtures/peer/trajectory.json)")
    c = sub.add_parser("compare", help="print where two trace files part")
    c.add_argument("peer", type=Path)
    c.add_argument("ours", type=Path)
    side = sub.add_parser("side", help=argparse.SUPPRESS)  # one side in this process (run calls it)
    side.add_argument("who", choices=("peer", "ours"))
    side.add_argument("case", choices=list(CASES))
    side.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    sys.path.insert(0, str(ROOT / "src"))

    if args.cmd == "compare":
        print(report(json.loads(args.peer.read_text()), json.loads(args.ours.read_text())))
        return 0
    if args.cmd == "side":
        data = trace_data(args.out / f"data-{args.case}", CASES[args.case])
        trace = args.out / f"{args.who}_{args.case}.json"
        if args.who == "peer":
            run_peer(args.case, data, trace, args.out / "runs")
        else:
            run_ours(args.case, data, trace, args.out / "runs", init=args.out / f"peer_{args.case}.pt")
        return 0
    if not args.peer_python:
        print("trajectory.py run needs --peer-python (or PEER_PYTHON): a Python with ultralytics", file=sys.stderr)
        return 2
    env = {**os.environ, "YOLO_OFFLINE": "1", "PYTHONPATH": str(ROOT / "src"),
           "YOLO_CONFIG_DIR": str(args.out / "peer-cfg"), "OMP_NUM_THREADS": "1"}
    fixture = {"cases": {}, "columns": "per case: weight_decay x groups, momentum (None: a last row column), "
                                       "ema_decay by update count; per row: lr (one, or x groups), accumulate, "
                                       "stepped(, momentum)"}
    for case in args.case:
        for who, python in (("peer", args.peer_python), ("ours", sys.executable)):
            cmd = [python, __file__, "side", who, case, "--out", str(args.out)]
            log = args.out / f"{who}_{case}.log"
            args.out.mkdir(parents=True, exist_ok=True)
            with log.open("w") as err:
                if subprocess.run(cmd, env=env, stdout=err, stderr=subprocess.STDOUT).returncode:
                    print(f"the {who} side of {case} failed; see {log}", file=sys.stderr)
                    return 1
        peer = json.loads((args.out / f"peer_{case}.json").read_text())
        ours = json.loads((args.out / f"ours_{case}.json").read_text())
        print(report(peer, ours))
        fixture["cases"][case] = {"settings": CASES[case], "peer": fixture_rows(peer["rows"])}
    if args.fixture:
        fixture["peer_version"] = peer.get("version")
        args.fixture.write_text(json.dumps(fixture, separators=(",", ":")) + "\n")
        print(f"wrote {args.fixture} ({args.fixture.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
