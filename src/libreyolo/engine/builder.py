"""From a config and a model to what a step needs: placement, seeds, the step context.

One builder for every caller, so `libreyolo bench step` times exactly the step training runs:
the trainer, `bench`, the benchmarks and the GPU tests build through here.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from ..config import TrainConfig
from ..errors import CheckpointError
from ..families.base import FamilySpec
from . import fullstep
from .ema import ModelEMA
from .graphs import GraphManager
from .optim import GradHandoff, build_optimizer, resolve_auto
from .precision import Precision
from .step import StepContext

log = logging.getLogger("libreyolo")


def build_model(source, num_classes: int, *, exact: bool = False, pretrained: Callable | None = None) -> nn.Module:
    """The training model of a resolved model name (`resolve.ModelSource`) with `num_classes`
    classes: built from its family, then every checkpoint tensor whose name and shape match
    loaded into it (the EMA weights when the checkpoint has them). A class head of another size
    starts fresh, said in one line. `exact` (validation: same classes) refuses a checkpoint that
    does not fill the model, in one line, instead of measuring a partly random model.
    `pretrained` (training): the fetcher of published weights by name (`resolve.fetch_weights`,
    handed down by the facade, above this layer); without a checkpoint, the family's published
    part weights come through it (`FamilySpec.pretrained`), with the one line that says what
    happened."""
    model = source.spec.build(source.size, num_classes)
    ckpt = source.checkpoint
    if ckpt is None and pretrained and source.spec.pretrained is not None:
        log.info(source.spec.pretrained(model, pretrained))
    if ckpt is not None:
        state = ckpt.get("ema") or ckpt["model"]
        own = model.state_dict()
        matched = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
        if state and not matched:  # a header naming this architecture over another model's weights
            raise CheckpointError(f"'{source.path}' says {source.arch}, but its weights do not fit {source.arch}: none "
                                  f"of its {len(state)} tensors has a name and shape of the model (another model's "
                                  f"checkpoint?)")
        model.load_state_dict(matched, strict=False)
        unfilled = [k for k in own if k not in matched]
        if unfilled and exact:
            raise CheckpointError(
                f"'{source.path}' does not fit {source.arch}: {len(unfilled)} of {len(own)} tensors are missing "
                f"or of another shape (e.g. '{unfilled[0]}'); written by an older layout of the architecture "
                f"(YOLOv9's box branch used to be grouped)? Fine-tune from it (model=) to keep what fits")
        if unfilled:
            log.info(f"transferred {len(matched)}/{len(own)} tensors from {source.path}; {len(unfilled)} start "
                     f"fresh (e.g. '{unfilled[0]}': a class head of another size, or another layout)")
    return model


def place_model(model: nn.Module, cfg: TrainConfig, device: torch.device) -> nn.Module:
    """`model` on `device`, in channels_last when `cfg.channels_last`: before the EMA copies it and
    the graph manager sees it, which both need its final device and memory format."""
    model = model.to(device)
    if cfg.channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model


def build_step_context(cfg: TrainConfig, family: FamilySpec, model: nn.Module, device: torch.device) -> StepContext:
    """Optimizer, precision, EMA and criterion for `model` (placed by `place_model`).

    The trainer resolves `optimizer=auto` for its run length first; any other caller gets what
    auto gives a short run (a fine-tune at defaults).
    """
    cfg, _ = resolve_auto(cfg, model.num_classes, optimizer_steps=1)
    precision = Precision.create(cfg.amp, cfg.amp_dtype, device)
    if precision.message:
        log.info(precision.message)
    # EMA before graphs: the manager must see the model in its final device and memory format.
    ema = ModelEMA(model, tau=cfg.ema_tau) if cfg.ema else None
    # compile=true: what the steps run for model.capturable (after the EMA's copy: it stays plain).
    network = compiled_network(model, cfg, family)
    # With cuda_graph off (or unsupported) this is a silent pass-through to `model.capturable`.
    graphs = GraphManager.for_run(model, cfg, family, device, precision, module=network)
    # The optimizer holds one flat tensor per parameter group (optim.flatten): clipping reads
    # those few gradients, not one per parameter.
    optimizer = build_optimizer(model, cfg, device_type=device.type,
                                backbone=family.backbone(model) if family.backbone is not None else None)
    ctx = StepContext(model=model, capturable=graphs.step_callable, criterion=family.criterion(model, cfg),
                      optimizer=optimizer, precision=precision,
                      params=[p for group in optimizer.param_groups for p in group["params"]],
                      clip_grad=cfg.clip_grad, ema=ema, device=device, channels_last=cfg.channels_last,
                      graphs=graphs)
    if not graphs.enabled and device.type == "cuda":
        # A run without graphs never gets them: its backward hands the gradients over, saving a
        # kernel launch per parameter (on a CPU an add is no launch, and the handoff's Python loop
        # made the step 3 % slower: benchmarks/results/grad_handoff_cpu2core.json).
        ctx.handoff = GradHandoff(optimizer)
    if cfg.cuda_graph == fullstep.FULL and graphs.enabled:  # else the manager said why it is off
        reason = fullstep.unsupported_reason(ctx, family)
        if reason is not None:
            log.info(f"cuda_graph=full: {reason}; training with cuda_graph=true")
        else:
            ctx.whole = fullstep.WholeStep(ctx, name=family.display, on_fallback=lambda _: setattr(graphs, "hold", False))
            graphs.hold = True  # whole-step graphs stand in for the network's
    return ctx


# torch.compile's settings for compile=true: inductor's default mode, which makes no CUDA graphs of
# its own (the modes that do would nest them inside ours), and static shapes (a batch of a new
# size recompiles, as it re-captures).
COMPILE_OPTIONS: dict = {"mode": "default", "dynamic": False}


def compiled_network(model: nn.Module, cfg: TrainConfig, family: FamilySpec) -> nn.Module:
    """`model.capturable` compiled for the training steps under compile=true (else itself), with
    the line that says so. The model keeps its plain module: its state_dict, its EMA copy, its
    validation and predict never see the compiled wrapper, which shares its parameters."""
    module = model.capturable
    if not getattr(cfg, "compile", False):
        return module
    if family.capture.region != "network":
        log.info(f"compile=true: {family.display} compiles only where its captured region is the whole network "
                 f"(it is {family.capture.region}); training uncompiled")
        return module
    log.info(f"compile=true: torch.compile({', '.join(f'{k}={v!r}' for k, v in COMPILE_OPTIONS.items())}) of "
             f"{family.display}'s network; the first step compiles it")
    return torch.compile(module, **COMPILE_OPTIONS)


def compile_cache_dir() -> str:
    """Where inductor keeps compiled kernels between runs (TORCHINDUCTOR_CACHE_DIR sets it)."""
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        return cache_dir()
    except Exception:  # another torch's layout: the documented default
        import getpass
        import os
        import tempfile

        return os.environ.get("TORCHINDUCTOR_CACHE_DIR") or os.path.join(tempfile.gettempdir(),
                                                                         f"torchinductor_{getpass.getuser()}")


def seed_everything(seed: int, deterministic: bool) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = not deterministic


# cudnn_benchmark=auto turns autotuning on only for runs this long (steps per image size). On the
# H200 (YOLOv9-t, batch 8, 640 px, float16, graphed) autotuning cost 13 s in the first epoch and
# then saved 7.6 ms a step (2.36 s against 3.12 s per 100-step epoch): it pays for itself after
# about 1,700 steps (docs/training-performance.md, "Fixed cost of a run").
AUTOTUNE_MIN_STEPS = 2000


def steady_autotune(cfg: TrainConfig) -> bool:
    """cudnn.benchmark for a measurement of the steady step (`bench step`, a `profile run` window):
    a long run's steady step has autotuned, so `auto` is on; `false` and `deterministic` are off.
    The two tools share this rule so that they time the same kernels (on the H200 an un-autotuned
    YOLOv9-t b8 step kept its kernels busy 25.3 ms against 17.4 ms autotuned)."""
    return not cfg.deterministic and cfg.cudnn_benchmark is not False


def set_cudnn_autotune(cfg: TrainConfig, on: bool) -> None:
    """Turn cuDNN autotuning on or off for this process, timing at most `cudnn_benchmark_limit`
    algorithms per convolution shape when on."""
    torch.backends.cudnn.benchmark = on
    torch.backends.cudnn.benchmark_limit = cfg.cudnn_benchmark_limit


def cudnn_autotune(cfg: TrainConfig, steps_per_epoch: int, sizes: int) -> tuple[bool, str | None]:
    """(cudnn.benchmark for this run, a line saying why when `auto` decided).

    Autotuning times every algorithm for each new convolution shape, so each training size (and
    the validation shapes) pays it once; multi-scale runs pay it per size."""
    if cfg.deterministic:
        return False, None
    if cfg.cudnn_benchmark != "auto":
        return bool(cfg.cudnn_benchmark), None
    steps = cfg.epochs * steps_per_epoch
    on = steps >= AUTOTUNE_MIN_STEPS * sizes
    per = f" over {sizes} image sizes" if sizes > 1 else ""
    return on, (f"cudnn_benchmark=auto: {'on' if on else 'off'} ({steps} steps{per}; autotuning pays for "
                f"itself after about {AUTOTUNE_MIN_STEPS} steps per size)")
