"""Helpers shared by the test suites (importable as `testkit`: tests/ is on pytest's pythonpath)."""

import json
import shutil
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from libreyolo.data import Batch
from libreyolo.families.base import Targets
from libreyolo.profiler.artifacts import SCHEMA, SCHEMA_VERSION


def sync_free_step(ctx, warmup, batch) -> torch.Tensor:
    """One training step under torch's sync debug mode "error" (any host sync raises), after the
    `warmup` batches have built cuDNN plans, the allocator's blocks and the optimizer state: the
    step's loss items. CUDA only."""
    from libreyolo.engine.step import train_step

    for b in warmup:
        train_step(ctx, b, update=True)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        return train_step(ctx, batch, update=True)
    finally:
        torch.cuda.set_sync_debug_mode(0)


def random_targets(gen, b, m, px, nc, counts, *, min_wh=4.0, pos=0.7, extent=0.5) -> Targets:
    """Padded targets with counts[i] valid boxes in image i (padding rows hold junk on purpose).

    Boxes start in the first `pos` of the image, span `min_wh` px plus up to `extent` of it."""
    xy = torch.rand(b, m, 2, generator=gen) * px * pos
    wh = min_wh + torch.rand(b, m, 2, generator=gen) * px * extent
    boxes = torch.cat((xy, (xy + wh).clamp(max=px)), -1)
    labels = torch.randint(0, nc, (b, m), generator=gen)
    valid = torch.arange(m).unsqueeze(0) < torch.tensor(counts).unsqueeze(1)
    return Targets(boxes, labels, valid)


def check_model_contract(model, channels: int):
    """The model contract on a 2 x 3 x 64 x 96 input: `capturable` in train mode gives one map per
    stride 8/16/32 with `channels` channels, `forward_train` passes it through, eval forward equals
    `predict`, which gives one finite (box, scores in [0, 1]) row per cell. Returns (maps, pred);
    the model is left in eval mode."""
    nc = model.num_classes
    assert model.strides == (8, 16, 32)
    x = torch.rand(2, 3, 64, 96)
    out = model.train().capturable(x)
    assert isinstance(out, tuple) and len(out) == 3
    for o, s in zip(out, model.strides):
        assert o.shape == (2, channels, 64 // s, 96 // s)
    assert model.forward_train(out, None) is out
    model.eval()
    with torch.no_grad():
        pred = model.predict(x)
        assert torch.equal(model(x), pred)  # eval forward = predict
    cells = sum((64 // s) * (96 // s) for s in model.strides)
    assert pred.shape == (2, cells, 4 + nc) and pred.dtype == torch.float32 and torch.isfinite(pred).all()
    scores = pred[..., 4:]
    assert (scores >= 0).all() and (scores <= 1).all()
    return out, pred


def gpu_targets(device) -> Targets:
    """The GPU tests' standard targets: 4 images at 128 px, 5 classes, image 1 empty."""
    gen = torch.Generator().manual_seed(0)
    return random_targets(gen, 4, 16, 128, 5, [5, 0, 16, 1], min_wh=8.0, pos=0.6, extent=0.4).to(device)


def synthetic_batch(b: int = 8, size: int = 256, seed: int = 0, empty_first: bool = False) -> Batch:
    """A pinned batch in the trainer's format: random uint8 images, 1-7 random boxes each (10
    classes); image 0 empty if asked."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 255, (b, 3, size, size), dtype=torch.uint8, generator=g)
    m = 8
    xy = torch.rand(b, m, 2, generator=g) * size * 0.6
    wh = torch.rand(b, m, 2, generator=g) * size * 0.3 + 8
    boxes = torch.cat([xy, xy + wh], -1)
    labels = torch.randint(0, 10, (b, m), generator=g)
    valid = torch.arange(m).expand(b, m) < torch.randint(1, m, (b, 1), generator=g)
    if empty_first:
        valid[0] = False
    return Batch(images=images.pin_memory(),
                 targets=Targets(boxes.pin_memory(), labels.pin_memory(), valid.pin_memory()))


def box_batch(seed: int, boxes: int, b: int = 2, size: int = 64, pin: bool = False) -> Batch:
    """A batch in the trainer's format with exactly `boxes` random boxes an image (3 classes), padded
    as the loaders pad (data/loader.pad_targets: a multiple of 8 slots); pinned if asked (CUDA)."""
    from libreyolo.data.loader import pad_targets

    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 255, (b, 3, size, size), dtype=torch.uint8, generator=g)
    xy = torch.rand(b, boxes, 2, generator=g) * size * 0.6
    wh = torch.rand(b, boxes, 2, generator=g) * size * 0.3 + 4
    labels = torch.randint(0, 3, (b, boxes), generator=g)
    targets = pad_targets([torch.cat([xy[i], xy[i] + wh[i]], -1).numpy() for i in range(b)],
                          [labels[i].numpy() for i in range(b)])
    if pin:
        images, targets = images.pin_memory(), Targets(*(t.pin_memory() for t in targets))
    return Batch(images, targets)


def shapes_subset(root, n: int) -> str:
    """The built-in shapes dataset cut to `n` train (and 4 val) images, as a dataset yaml under `root`."""
    from libreyolo.data import load_data_config

    shapes = load_data_config("shapes")
    (root / "train.txt").write_text("\n".join(str(p) for p in shapes.train[:n]))
    (root / "val.txt").write_text("\n".join(str(p) for p in shapes.val[:4]))
    (root / "data.yaml").write_text(json.dumps({"path": str(root), "train": "train.txt", "val": "val.txt",
                                                "names": shapes.names}))
    return str(root / "data.yaml")


# A kernel name with markup and a closing script tag: reports and timeline.html must show it as text.
KERNEL = "void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>, at::detail::Array<char*, 3> >(int, T&) [clone]</script>"


def make_profile():
    phases = [{"phase": name, "host_ms": 1.0, "synced_ms": 2.0, "cpu_ms": 1.0, "gpu_ms": 1.5, "busy_ms": 1.2,
               "steps": 2, "share": 1 / 8} for name in ("data", "h2d", "forward", "loss", "backward", "optimizer",
                                                        "ema", "other")]
    head = {"verdict": "launch-bound", "step_ms_mean": 16.0, "step_ms_std": 0.5, "utilisation": 0.25,
            "kernel_busy_ms": 4.0, "data_wait_ms": 0.2, "data_wait_frac": 0.0125, "syncs_per_step": 0.1,
            "peak_memory_mb": 900.0, "precision": "float16 autocast, scaler on", "cuda_graph": False,
            "device": "NVIDIA H200", "overhead_frac": 0.05}
    return {
        "schema": SCHEMA, "schema_version": SCHEMA_VERSION, "created": "2026-01-01T00:00:00",
        "run": {"arch": "yolo9-t", "batch": 8, "imgsz": 640, "workers": 8, "device_name": "NVIDIA H200",
                "precision": head["precision"], "cuda_graph": {"enabled": False, "replayed_steps": 0, "pool_mb": None},
                "run_dir": "runs/profile/prof"},
        "window": {"skip": 5, "steps": 4, "first_half": 2, "second_half": 2, "first_iteration": 5, "last_iteration": 8},
        "headline": head,
        "verdict": {"name": "launch-bound", "reason": "GPU busy 25%: idle between 900 kernels per step",
                    "lever": "cuda_graph=True (launch the network as one graph), or a larger batch"},
        "utilisation": {"basis": "kernel busy / unsynchronised step time", "utilisation": 0.25},
        "phases": phases,
        "kernels": {"kind": "kernel", "rows": [
            {"name": KERNEL, "count": 40, "total_ms": 3.0, "mean_us": 75.0, "share": 0.75},
            {"name": "sm90_xmma_gemm [x]", "count": 10, "total_ms": 1.0, "mean_us": 100.0, "share": 0.25}]},
        "steps": [
            {"half": 1, "iteration": 5, "epoch": 0, "wall_ms": 16.0, "data_ms": 0.2, "busy_ms": 4.0, "kernels": 900,
             "syncs": 0, "host_ms": {"data": 0.2, "forward": 6.0, "backward": 8.0}},
            {"half": 1, "iteration": 6, "epoch": 0, "wall_ms": 16.5, "data_ms": 0.2, "busy_ms": 4.1, "kernels": 900,
             "syncs": 1, "host_ms": {"data": 0.2, "forward": 6.1, "backward": 8.1}},
            {"half": 2, "iteration": 7, "epoch": 0, "wall_ms": 20.0, "data_ms": 0.3,
             "phases": {"forward": {"wall_ms": 7.0, "cpu_ms": 6.0, "gpu_ms": 2.0, "busy_ms": 1.8}}},
            {"half": 2, "iteration": 8, "epoch": 0, "wall_ms": 21.0, "data_ms": 0.3,
             "phases": {"forward": {"wall_ms": 7.5, "cpu_ms": 6.0, "gpu_ms": 2.0, "busy_ms": 1.8}}}],
        "memory": {"peak_allocated_mb": 900.0, "peak_reserved_mb": 1024.0, "host_peak_rss_mb": 3000.0},
        "overhead": {"reference_ms": [15.0, 15.5], "profiled_ms": [16.0], "fraction": 0.05},
    }


# --- self-contained pages in headless Chromium (timeline.html, results.html) ----------------------
CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
NEEDS_CHROMIUM = "needs chromium (.ci/run installs Debian's package)"
# Chromium with every background connection off and a proxy that refuses everything: a page draws
# from what it embeds or not at all.
HEADLESS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--disable-quic", "--proxy-server=http://127.0.0.1:9",
            "--proxy-bypass-list=<-loopback>", "--virtual-time-budget=20000"]


def chromium_render(page, tmp_path, window: str = "1280,2000") -> tuple[str, "object"]:
    """(the DOM after scripts ran, a screenshot path) of the HTML file `page`."""
    import subprocess

    browse = [CHROMIUM, *HEADLESS, f"--user-data-dir={tmp_path / 'chromium-profile'}"]
    dom = subprocess.run([*browse, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=180)
    assert dom.returncode == 0, dom.stderr[-2000:]
    shot = tmp_path / "shot.png"
    run = subprocess.run([*browse, f"--window-size={window}", f"--screenshot={shot}", page.as_uri()],
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0 and shot.is_file(), run.stderr[-2000:]
    return dom.stdout, shot


def ink(shot) -> tuple[float, int]:
    """(share of pixels that are not near-white, distinct colours in a sample): a drawn page has both."""
    from torchvision.io import ImageReadMode, read_image

    pixels = read_image(str(shot), ImageReadMode.RGB).flatten(1)  # 3 x H*W
    inked = (pixels < 235).any(0).float().mean().item()
    colours = len(set(map(tuple, pixels[:, ::97].T.tolist())))
    return inked, colours


def run_in_process(argv: list[str], capsys) -> tuple[int, str, str]:
    """`libreyolo ARGV` through the CLI's entry point in this process (no interpreter or torch
    start-up per case): (exit code, stdout, stderr). `capsys` or `capfd` captures."""
    import logging

    from libreyolo.cli.app import main

    logger = logging.getLogger("libreyolo")
    saved = logger.handlers[:], logger.propagate, logger.level
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:  # the CLI sets up the libreyolo logger; other tests' caplog must still see it
        logger.handlers, logger.propagate, logger.level = saved
    out = capsys.readouterr()
    return code, out.out, out.err



def live_corners(model) -> None:
    """D-FINE-style models: random last layers in the corner heads. At init they are zero, every
    decoder layer's distribution is the same and the distillation term (DDF) is exactly 0."""
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for head in model.decoder.corners:
            head.layers[-1].weight.copy_(torch.randn(head.layers[-1].weight.shape, generator=gen) * 0.05)


# --- multi-process training (tests/cli/test_ddp_cli.py, test_elastic_cli.py) ---------------------
def train_here(args, **extra):
    """The same command in this process (the single-process reference)."""
    from libreyolo import LibreYOLO
    from libreyolo.cli.grammar import parse_overrides

    kwargs = {**parse_overrides(args), **extra}
    return LibreYOLO(kwargs.pop("model")).train(**kwargs)


def patch_half_batch_bn(mp):
    """BatchNorm as two processes compute it: statistics per half batch; running statistics from
    the first half (rank 0's, which DDP broadcasts to the others before each forward). Only in the
    training steps: precise_bn's measurement (no gradient) runs on rank 0 alone, whole batches."""
    plain = nn.BatchNorm2d.forward

    def forward(self, x):
        if not self.training or not torch.is_grad_enabled():
            return plain(self, x)
        return torch.cat([F.batch_norm(c, self.running_mean if i == 0 else None, self.running_var if i == 0 else None,
                                       self.weight, self.bias, True, self.momentum if i == 0 else 0.0, self.eps)
                          for i, c in enumerate(x.chunk(2))])

    mp.setattr(nn.BatchNorm2d, "forward", forward)


def checkpoint_difference(a: Path, b: Path) -> tuple[float, float, float]:
    """How far checkpoint `a` is from `b`: (largest |a - b| of a trained parameter, model or EMA;
    largest |a - b| / max(|b|, 1) of a BatchNorm running statistic; |update_a - update_b| /
    |update_b| of the model's parameters, updates measured from the seed-0 initial weights)."""
    from libreyolo.engine.builder import seed_everything
    from libreyolo.families import get_family

    seed_everything(0, False)
    init = get_family("yolo9").build("t", 10)
    params = {k for k, _ in init.named_parameters()}
    init = init.state_dict()
    ca, cb = (torch.load(p, map_location="cpu", weights_only=True) for p in (a, b))
    weights, stats, num, den = 0.0, 0.0, 0.0, 0.0
    for part in ("model", "ema"):
        for k, vb in cb[part].items():
            if not vb.is_floating_point():
                continue
            diff = (ca[part][k] - vb).abs().max().item()
            if k in params:
                weights = max(weights, diff)
            else:
                stats = max(stats, diff / max(vb.abs().max().item(), 1.0))
            if part == "model" and k in params:
                num += (ca[part][k] - vb).double().square().sum().item()
                den += (vb - init[k]).double().square().sum().item()
    return weights, stats, (num / den) ** 0.5


# Measured on this 2-core machine: parameters within 2.4e-7 (float32 rounding of weights of order
# 1), running statistics within 6e-5 of their size (variances of 2x2 maps over 8 images are
# touchy; they feed validation, not training), parameter updates within 7e-4 of each other. The
# plain single-process run (BatchNorm over all 16 images) is 2e-4 away in the parameters and its
# updates differ by 137 %. The bounds leave room for rounding, not for a missing factor, a wrong
# shard or an unreduced gradient.
MAX_WEIGHT, MAX_STAT, MAX_UPDATE = 1e-5, 1e-3, 1e-2


def checkpoints_close(a: Path, b: Path, max_stat: float = MAX_STAT, max_update: float = MAX_UPDATE) -> str | None:
    weights, stats, update = checkpoint_difference(a, b)
    if weights < MAX_WEIGHT and stats < max_stat and update < max_update:
        return None
    return f"parameters {weights:.3g} apart, running statistics {stats:.3g}, updates {update:.3g}"


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def environ_of(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def cli_main(argv) -> int:
    """The CLI in this process; the libreyolo logger as it was afterwards (the CLI sets it up, and
    rank 1 quiets it), so other tests' caplog still sees it."""
    import logging

    from libreyolo.cli.app import main

    logger = logging.getLogger("libreyolo")
    saved = logger.handlers[:], logger.propagate, logger.level
    try:
        main(argv)
        return 0
    except SystemExit as exc:
        return exc.code
    finally:
        logger.handlers, logger.propagate = saved[:2]
        logger.setLevel(saved[2])  # setLevel also clears logging's cache of the quieted level
