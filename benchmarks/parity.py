"""Accuracy at the defaults: our trainer and the peer's (Ultralytics), each given only what a user
types, on the generated data regimes of src/libreyolo/data/regimes.py.

    python benchmarks/parity.py --out parity.json --peer-python /path/to/peer/python \
        [--regimes shapes-dense,shapes-few,...] [--arms ours,peer] [--seeds 0 1 2] [--lanes 8]
    python benchmarks/parity.py --report A.json [B.json ...]   # one table (and the targets) of several

What each side is given, and nothing else: the model (ours `yolo9-t`, the peer `yolov9t.yaml`, both
from scratch), the data, epochs, imgsz and batch of the regime's row in `TYPED`, the seed, the
device, the run's place, and `workers` = the CPU cores of the run's lane. Every other setting is
each trainer's own default (nbs, optimizer, augmentation, warmup, EMA, validation every epoch).

An arm names a side, and may name another of our models or add keys:
    ours                  yolo9-t at our defaults
    ours@yolox-t          another of our models at its defaults
    ours+recipe=published ours with a key added (a diagnostic: a user did not type it)
    peer                  the peer at its defaults

Runs go side by side in `--lanes` lanes, each pinned (taskset) to its own share of the host's
cores; the queue interleaves the sides, so both meet the same contention. Per run: the wall clock
from process start to the end of training, the per-epoch val mAP50-95 curve and its largest drop
from its best in the last third of the run, and the score of best.pt. Ours is scored by its own
validator (the best epoch's row of results.csv, which picks best.pt); the peer's best.pt
predictions (its own validator, COCO json) are scored by the same faster-coco-eval code as ours,
against our val loader's ground truth, and its own figure is kept beside. Results: one JSON file
(rewritten after every run) and markdown tables on stdout, with the targets checked per regime.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# What a user types per regime: (epochs, imgsz, batch). Each run is 300-800 batches, the length of
# a fine-tune on data this small.
TYPED = {
    "shapes-dense": (30, 512, 8),
    "shapes-few": (100, 320, 16),
    "shapes-single": (50, 416, 8),
    "shapes-wide": (40, 384, 8),
    "shapes-clutter": (30, 416, 8),
    "shapes-large": (40, 256, 8),
    "shapes-sparse": (30, 320, 8),
}
LATE_DROP_LIMIT = 1 / 3  # target: no fall of more than a third from the best in the last third


def parse_arm(arm: str) -> tuple[str, str, dict[str, str]]:
    """`side[@model][+key=value...]` -> (side, model, keys)."""
    head, *extra = arm.split("+")
    side, _, model = head.partition("@")
    if side not in ("ours", "peer") or (side == "peer" and model) or any("=" not in kv for kv in extra):
        raise ValueError(f"bad arm {arm!r}: ours[@MODEL][+key=value...] or peer[+key=value...]")
    return side, model or ("yolo9-t" if side == "ours" else "yolov9t.yaml"), dict(kv.split("=", 1) for kv in extra)


def peer_yaml(work: Path, regime: str) -> Path:
    """The generated regime (in our cache) and a dataset yaml the peer reads."""
    from libreyolo.data.regimes import REGIMES, ensure_regime

    root = ensure_regime(work / "datasets" / regime, regime)
    path = work / f"{regime}.yaml"
    names = "\n".join(f"  {i}: {n}" for i, n in enumerate(REGIMES[regime].classes))
    path.write_text(f"path: {root}\ntrain: images/train\nval: images/val\nnames:\n{names}\n")
    return path


def late_drop(curve: list[float]) -> float:
    """The largest fall from the best so far, as a fraction of it, over the last third of `curve`."""
    worst, best = 0.0, 0.0
    start = len(curve) - len(curve) // 3
    for i, v in enumerate(curve):
        best = max(best, v)
        if i >= start and best > 0:
            worst = max(worst, (best - v) / best)
    return worst


def run_ours(job: dict, args) -> dict:
    epochs, imgsz, batch = TYPED[job["regime"]]
    name = job["name"]
    keys = {"model": job["model"], "data": job["regime"], "epochs": epochs, "imgsz": imgsz, "batch": batch,
            "seed": job["seed"], "workers": job["workers"], "device": args.device,
            "project": str(args.work / "runs"), "name": name, "exist_ok": "true", **job["keys"]}
    cmd = [*job["pin"], sys.executable, "-m", "libreyolo", "train", *(f"{k}={v}" for k, v in keys.items()),
           "--json"]
    t0 = time.time()
    out = _run(cmd, args.work / "logs" / f"{name}.log")
    wall = time.time() - t0
    result = json.loads(out.strip().splitlines()[-1])
    with (Path(result["run_dir"]) / "results.csv").open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("map50_95", "").strip()]
    curve = [float(r["map50_95"]) for r in rows]
    best = max(rows, key=lambda r: 0.9 * float(r["map50_95"]) + 0.1 * float(r["map50"]))
    return {"wall_s": wall, "map50_95": float(best["map50_95"]), "map50": float(best["map50"]),
            "best_epoch": int(best["epoch"]), "curve": curve, "late_drop": late_drop(curve),
            "last_map50_95": curve[-1] if curve else None}


def run_peer(job: dict, args) -> dict:
    from time_to_accuracy import score_rows

    epochs, imgsz, batch = TYPED[job["regime"]]
    data = args.work / f"{job['regime']}.yaml"
    cmd = [*job["pin"], args.peer_python, str(HERE / "peer_train.py"), "--defaults", "--data", str(data),
           "--epochs", str(epochs), "--batch", str(batch), "--imgsz", str(imgsz), "--workers", str(job["workers"]),
           "--seed", str(job["seed"]), "--project", str(args.work / "runs"), "--name", job["name"],
           "--device", "cpu" if args.device == "cpu" else args.device,
           "--extra", *(f"{k}={v}" for k, v in job["keys"].items())]
    t0 = time.time()
    out = _run(cmd, args.work / "logs" / f"{job['name']}.log")
    result = json.loads(out.strip().splitlines()[-1])
    scoring = argparse.Namespace(imgsz=imgsz)
    map50_95, map50 = score_rows(data, result["predictions"], scoring)
    curve = result["curve"]
    return {"wall_s": result["timings"]["train_end_unix"] - t0, "map50_95": map50_95, "map50": map50,
            "peer_own_map50_95": result["peer_map50_95"], "peer_own_map50": result["peer_map50"],
            "curve": curve, "late_drop": late_drop(curve), "last_map50_95": curve[-1] if curve else None}


def _run(cmd: list[str], log: Path) -> str:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "YOLO_OFFLINE": "1"}
    with log.open("w") as err:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"exited {proc.returncode}; see {log}")
    return proc.stdout


def summarise(runs: list[dict]) -> list[dict]:
    """Per (regime, arm): the mean and spread over seeds, and the targets against `peer`."""
    rows, by = [], {}
    for r in runs:
        if "error" not in r:
            by.setdefault((r["regime"], r["arm"]), []).append(r)
    for (regime, arm), rs in sorted(by.items()):
        maps = [r["map50_95"] for r in rs]
        rows.append({"regime": regime, "arm": arm, "runs": len(rs), "map50_95_mean": statistics.fmean(maps),
                     "map50_95_sd": statistics.stdev(maps) if len(maps) > 1 else 0.0,
                     "map50_mean": statistics.fmean(r["map50"] for r in rs),
                     "late_drop_max": max(r["late_drop"] for r in rs),
                     "wall_s_mean": statistics.fmean(r["wall_s"] for r in rs),
                     **({"peer_own_map50_95_mean": statistics.fmean(r["peer_own_map50_95"] for r in rs)}
                        if arm == "peer" else {})})
    peer = {r["regime"]: r for r in rows if r["arm"] == "peer"}
    for r in rows:
        p = peer.get(r["regime"])
        if p is not None and r["arm"] != "peer":
            r["vs_peer"] = r["map50_95_mean"] - p["map50_95_mean"]
            r["wall_vs_peer"] = r["wall_s_mean"] / p["wall_s_mean"]
            r["meets_floor"] = r["vs_peer"] >= -0.005
        r["late_drop_ok"] = r["late_drop_max"] <= LATE_DROP_LIMIT
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| regime | arm | runs | mAP50-95 mean (sd) | mAP50 | vs peer | late drop | wall s | wall / peer |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        vs = f"{r['vs_peer']:+.3f}" if "vs_peer" in r else "-"
        ratio = f"{r['wall_vs_peer']:.2f}" if "wall_vs_peer" in r else "-"
        own = f" (own {r['peer_own_map50_95_mean']:.3f})" if "peer_own_map50_95_mean" in r else ""
        lines.append(f"| {r['regime']} | {r['arm']} | {r['runs']} | {r['map50_95_mean']:.3f} ({r['map50_95_sd']:.3f})"
                     f"{own} | {r['map50_mean']:.3f} | {vs} | {r['late_drop_max']:.2f} | {r['wall_s_mean']:.0f} | "
                     f"{ratio} |")
    return "\n".join(lines)


def targets(rows: list[dict]) -> list[str]:
    """The suite's targets, each with whether these results meet it."""
    ours = [r for r in rows if r["arm"] == "ours" and "vs_peer" in r]
    if not ours:  # the targets compare `ours` with the peer on one regime: nothing to judge
        return ["- the targets compare the arm `ours` with `peer` on the same regime: these runs have no such pair"]
    floor = [r["regime"] for r in ours if not r["meets_floor"]]
    above = [r["regime"] for r in ours if r["vs_peer"] > 0]
    drops = [r["regime"] for r in ours if not r["late_drop_ok"]]
    slow = [r["regime"] for r in ours if r["wall_vs_peer"] > 0.5]
    majority = len(ours) // 2 + 1  # the "3 of the 5", for any number of regimes
    return [f"- ours >= peer - 0.005 on every regime: {'met' if not floor else 'NOT met on ' + ', '.join(floor)}",
            f"- ours above the peer on a majority ({majority} of {len(ours)}): "
            f"{'met' if len(above) >= majority else 'NOT met'} ({len(above)}: {', '.join(above)})",
            f"- no late fall of over a third from the best: {'met' if not drops else 'NOT met on ' + ', '.join(drops)}",
            f"- wall clock <= 0.5x the peer's: {'met' if not slow else 'NOT met on ' + ', '.join(slow)}"]


def report(paths: list[Path]) -> str:
    runs = [r for p in paths for r in json.loads(p.read_text())["runs"]]
    rows = summarise(runs)
    return table(rows) + "\n\n" + "\n".join(targets(rows))


def lanes(count: int) -> list[tuple[list[str], int]]:
    """(taskset prefix, cores) per lane: the host's cores split evenly."""
    cores = sorted(os.sched_getaffinity(0))
    per = max(len(cores) // count, 1)
    out = []
    for i in range(count):
        mine = cores[i * per:(i + 1) * per] or cores[-per:]
        pin = ["taskset", "-c", ",".join(map(str, mine))] if count > 1 else []
        out.append((pin, len(mine)))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--regimes", default=",".join(TYPED))
    p.add_argument("--arms", default="ours,peer")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--lanes", type=int, default=1)
    p.add_argument("--device", default="0")
    p.add_argument("--work", type=Path, default=Path("/tmp/parity"))
    p.add_argument("--out", type=Path)
    p.add_argument("--report", type=Path, nargs="+", help="print the table of these result files and stop")
    p.add_argument("--peer-python", default=os.environ.get("PEER_PYTHON", sys.executable))
    p.add_argument("--typed", nargs="*", default=[], metavar="REGIME=E,IMGSZ,B",
                   help="other epochs, imgsz, batch for a regime (a quick trial: the results are not the suite's)")
    args = p.parse_args()
    if args.report:
        print(report(args.report))
        return 0
    if args.out is None:
        p.error("--out is required (or --report)")
    for item in args.typed:
        regime, _, values = item.partition("=")
        TYPED[regime] = tuple(int(v) for v in values.split(","))
    regimes, arms = args.regimes.split(","), args.arms.split(",")
    try:
        parsed = {arm: parse_arm(arm) for arm in arms}
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    if unknown := [r for r in regimes if r not in TYPED]:
        print(f"unknown regime(s) {', '.join(unknown)}; choose from {', '.join(TYPED)}", file=sys.stderr)
        return 2
    (args.work / "logs").mkdir(parents=True, exist_ok=True)
    os.environ["LIBREYOLO_CACHE"] = str(args.work)  # ours finds the regimes where the peer's yamls point
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(len(regimes)) as pool:  # generation is per image, single-threaded
        list(pool.map(peer_yaml, [args.work] * len(regimes), regimes))
    from libreyolo.data.regimes import REGIMES

    # The longest runs first (batches a run, by regime), the sides interleaved within a length:
    # the lanes stay busy to the end and both sides meet the same contention.
    todo = [(seed, regime, arm) for seed in args.seeds for regime in regimes for arm in arms]
    length = lambda r: TYPED[r][0] * -(-REGIMES[r].train // TYPED[r][2])
    todo.sort(key=lambda t: (-length(t[1]), t[0]))
    jobs: queue.Queue = queue.Queue()
    for seed, regime, arm in todo:
        side, model, keys = parsed[arm]
        jobs.put({"arm": arm, "side": side, "model": model, "keys": keys, "regime": regime, "seed": seed,
                  "name": f"{regime}-{arm.replace('@', '_').replace('+', '_').replace('=', '-')}-s{seed}"})
    runs: list[dict] = []
    lock = threading.Lock()

    def lane(pin: list[str], cores: int) -> None:
        while True:
            try:
                job = jobs.get_nowait()
            except queue.Empty:
                return
            job = {**job, "pin": pin, "workers": cores}
            try:
                r = (run_ours if job["side"] == "ours" else run_peer)(job, args)
            except Exception as exc:  # one failed run must not lose the others'
                r = {"error": str(exc)}
                print(f"{job['name']}: {exc}", file=sys.stderr)
            with lock:
                runs.append({k: job[k] for k in ("arm", "model", "keys", "regime", "seed", "workers")}
                            | {"typed": dict(zip(("epochs", "imgsz", "batch"), TYPED[job["regime"]]))} | r)
                args.out.write_text(json.dumps({"settings": {**vars(args), "work": str(args.work),
                                                             "out": str(args.out), "typed": TYPED},
                                                "runs": runs, "summary": summarise(runs)}, indent=1, default=str))
                print(f"{job['name']}: " + (f"mAP50-95 {r['map50_95']:.3f} wall {r['wall_s']:.0f}s"
                                            if "error" not in r else "failed"), file=sys.stderr, flush=True)

    threads = [threading.Thread(target=lane, args=spec) for spec in lanes(args.lanes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(report([args.out]))
    return 0 if runs and all("error" not in r for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
