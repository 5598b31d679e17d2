"""Which part of the validated model makes a one-epoch dip in val mAP: the EMA or BatchNorm's statistics.

    python benchmarks/val_dip_probe.py --out /tmp/dip/s2.json [--model yolonas-s] [--data shapes-single]
        [--seed 2] [key=value ...]

Trains one run (the model at its defaults on the data, with the regime's typed epochs, imgsz and
batch from benchmarks/parity.py unless the trailing key=value overrides say otherwise; they are
passed to `LibreYOLO(model).train()` as typed). After every validation, a train hook scores three
more versions of the weights on the same val loader with the same evaluator:

  raw        the trained weights themselves (not the EMA), their own BatchNorm running statistics;
  ema_recal  the EMA's weights with every BatchNorm's statistics measured again: reset, then an
             average over the val images, in train mode, no gradient (engine/precise_bn.py's remeasure_);
  raw_recal  the same for the trained weights;
  ema_train  the EMA's weights with the statistics measured on the training images instead, as
             validation loads images (letterboxed, no augmentation): what a trainer could do
             before validating without looking at the val split (precise_bn does it while mosaic is on).

The run's own figure (`ema`) is what the trainer validated, with the running averages (the probe
trains with `precise_bn=0` unless told otherwise, so `ema_train` is what the default measures). So a dip that `ema_recal` does not
show lies in the running statistics; one that `raw` does not show lies in the average. Per epoch
it also keeps, over all BatchNorm layers, the largest |log(running_var / re-measured var)| of the
EMA and which layer holds it. Nothing of this touches the training: the hook works on copies, and
no random number is drawn.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _recalibrated(model, loader, device):
    """A copy of `model` whose BatchNorm statistics are re-measured on `loader`'s images (what
    precise_bn does to the EMA itself)."""
    from libreyolo.engine.precise_bn import remeasure_

    m = copy.deepcopy(model)
    remeasure_(m, loader, device)
    return m


def _var_gap(model, recal) -> dict:
    """The BatchNorm layer whose running variance is furthest, in log ratio, from the re-measured one."""
    import torch

    worst, where = 0.0, None
    ref = dict(recal.named_modules())
    for name, b in model.named_modules():
        if isinstance(b, torch.nn.modules.batchnorm._BatchNorm) and name in ref:
            ratio = (b.running_var.float() + b.eps) / (ref[name].running_var.float() + b.eps)
            gap = float(ratio.log().abs().max())
            if gap > worst:
                worst, where = gap, name
    return {"max_log_var_ratio": round(worst, 4), "layer": where}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="yolonas-s")
    p.add_argument("--data", default="shapes-single")
    p.add_argument("--seed", type=int, default=2)
    p.add_argument("--project", default="/tmp/dip/runs")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("overrides", nargs="*", help="key=value train keys (as the CLI types them)")
    args = p.parse_args()

    from parity import TYPED

    from libreyolo import LibreYOLO
    from libreyolo.cli.grammar import parse_overrides
    from libreyolo.engine.ema import unwrap
    from libreyolo.engine.hooks import Hook

    keys = parse_overrides(args.overrides)  # typed and checked as the CLI does
    epochs, imgsz, batch = TYPED.get(args.data, (30, 320, 8))
    train = {"data": args.data, "epochs": epochs, "imgsz": imgsz, "batch": batch, "seed": args.seed,
             "project": args.project, "name": f"{args.model}-{args.data}-s{args.seed}", "exist_ok": True,
             "tensorboard": False, "precise_bn": 0, **keys}
    rows: list[dict] = []
    plain_train: list = []  # the training images as the val loader loads them, built once

    def train_images(trainer):
        if not plain_train:  # every training image, through the loader precise_bn measures with
            plain_train.append(trainer.task.stats_loader(trainer.data_cfg, trainer.cfg, trainer.train_loader,
                                                         len(trainer.train_loader.dataset), int(trainer.cfg.batch)))
        return plain_train[0]

    class Probe(Hook):
        def after_epoch(self, trainer):
            if trainer.validated_epoch != trainer.epoch:
                return
            t0 = time.time()

            def score(model) -> dict:
                m = trainer.task.evaluate(model, trainer.val_loader, trainer.device, trainer.cfg,
                                          amp_dtype=trainer.precision.dtype, names=trainer.data_cfg.names,
                                          progress=False)
                s = trainer.task.scalars(m)
                return {k: round(float(s[k]), 5) for k in ("map50_95", "map50") if k in s}

            ema = trainer.ema.ema if trainer.ema is not None else None
            raw = copy.deepcopy(unwrap(trainer.model)).eval()
            row = {"epoch": trainer.epoch + 1,
                   "ema": {k: round(float(trainer.metrics[k]), 5) for k in ("map50_95", "map50")
                           if k in trainer.metrics},
                   "ema_decay": round(trainer.ema.current_decay(), 5) if ema is not None else None,
                   "raw": score(raw)}
            raw_recal = _recalibrated(raw, trainer.val_loader, trainer.device)
            row["raw_recal"] = score(raw_recal)
            if ema is not None:
                ema_recal = _recalibrated(ema, trainer.val_loader, trainer.device)
                row["ema_recal"] = score(ema_recal)
                row["ema_bn_gap"] = _var_gap(ema, ema_recal)
                row["ema_train"] = score(_recalibrated(ema, train_images(trainer), trainer.device))
            row["raw_bn_gap"] = _var_gap(raw, raw_recal)
            row["probe_s"] = round(time.time() - t0, 2)
            rows.append(row)
            print("[probe] epoch {epoch}: ema {e} raw {r} ema_recal {er} raw_recal {rr} ema_train {et} gap {g}".format(
                epoch=row["epoch"], e=row["ema"].get("map50_95"), r=row["raw"].get("map50_95"),
                er=row.get("ema_recal", {}).get("map50_95"), rr=row["raw_recal"].get("map50_95"),
                et=row.get("ema_train", {}).get("map50_95"),
                g=row.get("ema_bn_gap", {}).get("max_log_var_ratio")), flush=True)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps({"model": args.model, "data": args.data, "seed": args.seed,
                                            "train": train, "epochs": rows}, indent=1) + "\n")

    t0 = time.time()
    LibreYOLO(args.model).train(hooks=[Probe()], **train)
    curve = {k: [r[k]["map50_95"] for r in rows if k in r] for k in ("ema", "raw", "ema_recal", "raw_recal", "ema_train")}

    def dips(c: list[float]) -> int:  # epochs more than a third below both neighbours
        return sum(c[i] < (2 / 3) * min(c[i - 1], c[i + 1]) for i in range(1, len(c) - 1))

    summary = {k: {"best": max(c), "last": c[-1], "one_epoch_dips": dips(c)} for k, c in curve.items() if c}
    args.out.write_text(json.dumps({"model": args.model, "data": args.data, "seed": args.seed, "train": train,
                                    "wall_s": round(time.time() - t0, 1), "summary": summary,
                                    "epochs": rows}, indent=1) + "\n")
    for k, s in summary.items():
        print(f"{k:10s} best {s['best']:.3f} last {s['last']:.3f} one-epoch dips {s['one_epoch_dips']}")
    return 0 if rows and all(math.isfinite(r["raw"].get("map50_95", 0.0)) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
