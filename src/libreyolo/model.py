"""The LibreYOLO facade: resolve a model name, then `.train()` / `.val()`.

Model names follow four rules, in order (the CLI's `model=` uses the same):
1. an existing file is a LibreYOLO checkpoint and is loaded;
2. an official weights name (`LibreYOLO9s.pt`) that is absent is downloaded from
   `$LIBREYOLO_WEIGHTS_URL/<name>` into the cache; if that is impossible the model is built from
   scratch with one warning line saying exactly that;
3. an architecture name (`yolo9-t`, `YOLOv9-t`, `yolo9t`) builds from scratch, silently;
4. anything else is a one-line error. An architecture is never guessed from a file name.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import FIELDS, VAL_KEYS, TrainConfig, build_config
from .errors import ConfigError, DataError, ModelNameError
from .families import REGISTRY, arch_name, get_family, parse_arch, weights_name
from .families.base import FamilySpec

log = logging.getLogger("libreyolo")

DEFAULT_WEIGHTS_URL = "https://github.com/libreyolo/libreyolo/releases/download/weights-v1"
# Keys that may change when resuming; every other key comes from the checkpoint's config.
RESUME_KEYS = {"resume", "device", "workers", "cache", "exist_ok", "log_interval"}


def cache_dir() -> Path:
    return Path(os.environ.get("LIBREYOLO_CACHE", Path.home() / ".cache" / "libreyolo"))


@dataclass
class ModelSource:
    spec: FamilySpec
    size: str
    checkpoint: dict | None  # loaded checkpoint when weights exist
    path: Path | None

    @property
    def arch(self) -> str:
        return arch_name(self.spec, self.size)

    @property
    def defaults(self) -> dict[str, Any]:
        """The config overrides this model trains with (its family's recipe, then its size's)."""
        return self.spec.defaults_for(self.size)


def _official(name: str) -> tuple[FamilySpec, str] | None:
    for spec in REGISTRY.values():
        m = re.fullmatch(re.escape(spec.weights_prefix) + r"([a-z]+)\.pt", name)
        if m and m.group(1) in spec.sizes:
            return spec, m.group(1)
    return None


def resolve_model(name: str) -> ModelSource:
    from .engine.checkpoint import load_checkpoint

    if not isinstance(name, str) or not name.strip():
        raise ModelNameError("model name is empty (e.g. model=yolo9-t or model=LibreYOLO9s.pt)")
    path = Path(name).expanduser()
    if path.is_file():
        ckpt = load_checkpoint(path)
        spec = get_family(ckpt["family"])
        if ckpt["size"] not in spec.sizes:
            raise ModelNameError(f"checkpoint '{path}' names size '{ckpt['size']}' unknown to {spec.display}")
        return ModelSource(spec, ckpt["size"], ckpt, path)
    official = _official(path.name)
    if official is not None:
        spec, size = official
        cached = cache_dir() / "weights" / path.name
        problem = None if cached.is_file() else _try_download(path.name, cached)
        if problem is None:
            return ModelSource(spec, size, load_checkpoint(cached), cached)
        log.warning(f"{problem}; building {arch_name(spec, size)} from scratch (random init)")
        return ModelSource(spec, size, None, None)
    arch = parse_arch(name)
    if arch is not None:
        return ModelSource(arch[0], arch[1], None, None)
    if path.suffix in (".pt", ".pth"):
        raise ModelNameError(f"weights file '{name}' does not exist")
    examples = ", ".join(f"{arch_name(s, s.sizes[0])}" for s in REGISTRY.values())
    raise ModelNameError(f"unknown model '{name}': not a file, an official weights name "
                         f"(e.g. {weights_name(next(iter(REGISTRY.values())), 's')}) or an architecture "
                         f"(e.g. {examples})")


def arch_of(name: str) -> tuple[FamilySpec, str]:
    """The (family, size) a model name trains as, without downloading weights: a checkpoint file
    is read, official weights names and architecture names are parsed; else the one-line error of
    `resolve_model`."""
    path = Path(name).expanduser() if isinstance(name, str) else None
    if path is not None and not path.is_file():
        official = _official(path.name)
        if official is not None:
            return official
    source = resolve_model(name)  # a file or an architecture name: nothing to download
    return source.spec, source.size


def _try_download(name: str, dest: Path) -> str | None:
    """Fetch official weights into the cache; None on success, else why not (one line)."""
    from .data.download import download_file
    from .engine.checkpoint import load_checkpoint
    from .errors import CheckpointError

    url = os.environ.get("LIBREYOLO_WEIGHTS_URL", DEFAULT_WEIGHTS_URL).rstrip("/") + "/" + name
    try:
        download_file(url, dest)
        load_checkpoint(dest)  # an HTML error page saved as .pt must not poison the cache
    except (DataError, CheckpointError) as exc:
        dest.unlink(missing_ok=True)
        return f"weights {name} are not available ({exc})"
    return None


def _transfer(model, state: dict, origin: Path) -> None:
    """Load every tensor of `state` whose name and shape match (class count may differ)."""
    own = model.state_dict()
    matched = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
    model.load_state_dict(matched, strict=False)
    if len(matched) < len(own):
        log.info(f"transferred {len(matched)}/{len(own)} tensors from {origin} (the rest, e.g. a "
                 f"class head of another size, start fresh)")


class LibreYOLO:
    """`LibreYOLO("LibreYOLO9s.pt")` or `LibreYOLO("yolo9-t")`; then `.train(data=...)`, `.val(data=...)`."""

    def __init__(self, model: str):
        self.name = model
        self.source = resolve_model(model)

    @property
    def arch(self) -> str:
        return self.source.arch

    def _build(self, num_classes: int):
        model = self.source.spec.build(self.source.size, num_classes)
        ckpt = self.source.checkpoint
        if ckpt is not None:
            weights = ckpt.get("ema") or ckpt["model"]
            _transfer(model, weights, self.source.path)
        return model

    def train(self, data: str | None = None, **overrides: Any):
        """Train; returns a TrainResult (metrics, run_dir, best, last)."""
        from .data import load_data_config
        from .engine.device import select_device
        from .engine.trainer import Trainer, make_run_dir, seed_everything, write_args

        user = dict(overrides)
        if data is not None:
            user["data"] = data
        user["model"] = self.name
        for key in user:
            if key not in FIELDS:
                from .config import unknown_key_message
                raise ConfigError(unknown_key_message(key))
        resume = user.get("resume", False)
        if resume not in (False, None, "", "false"):
            return self._resume(user)
        if not user.get("data"):
            raise ConfigError("no dataset given: pass data=NAME or data=path/to/data.yaml (e.g. data=shapes)")
        cfg = build_config(user, self.source.defaults)
        device = select_device(cfg.device)
        data_cfg = load_data_config(cfg.data)
        seed_everything(cfg.seed, cfg.deterministic)  # before building: the initial weights are seeded too
        model = self._build(len(data_cfg.names))
        run_dir = make_run_dir(cfg.project, cfg.name, cfg.exist_ok)
        write_args(run_dir, cfg)
        trainer = Trainer(cfg, self.source.spec, self.source.size, model, data_cfg, run_dir, device)
        return trainer.train()

    def _resume(self, user: dict[str, Any]):
        from .data import load_data_config
        from .engine.checkpoint import load_checkpoint
        from .engine.device import select_device
        from .engine.trainer import Trainer

        resume = user["resume"]
        if resume is True or resume == "true":
            path = self.source.path if self.source.path is not None else _latest_last(user)
        else:
            path = Path(str(resume))
        ckpt = load_checkpoint(path)
        changed = sorted(k for k in user if k not in RESUME_KEYS | {"model", "data"}
                         and user[k] != ckpt["config"].get(k))
        if changed:
            raise ConfigError(f"cannot change {', '.join(changed)} when resuming (only "
                              f"{', '.join(sorted(RESUME_KEYS - {'resume'}))} may change)")
        saved = {k: v for k, v in ckpt["config"].items() if k in FIELDS}
        saved.update({k: user[k] for k in RESUME_KEYS if k in user})
        saved["resume"] = str(path)
        cfg = build_config(saved)
        if int(ckpt["epoch"]) + 1 >= cfg.epochs:
            raise ConfigError(f"'{path}' finished all {cfg.epochs} epochs; nothing to resume")
        spec = get_family(ckpt["family"])
        data_cfg = load_data_config(cfg.data)
        model = spec.build(ckpt["size"], len(ckpt["names"]))
        run_dir = path.resolve().parent.parent
        trainer = Trainer(cfg, spec, ckpt["size"], model, data_cfg, run_dir, select_device(cfg.device),
                          resume=ckpt)
        return trainer.train()

    def val(self, data: str | None = None, **overrides: Any) -> dict[str, float]:
        """Validate on a dataset's val split; returns {'map50_95', 'map50', ...}."""
        from .data import build_val_loader, load_data_config
        from .engine.device import select_device
        from .engine.precision import Precision
        from .eval import evaluate

        user = dict(overrides)
        if data is not None:
            user["data"] = data
        for key in user:
            if key not in VAL_KEYS:
                from .config import unknown_key_message
                raise ConfigError(unknown_key_message(key, VAL_KEYS))
        if not user.get("data"):
            raise ConfigError("no dataset given: pass data=NAME or data=path/to/data.yaml (e.g. data=shapes)")
        user.setdefault("model", self.name)
        cfg = build_config(user, self.source.defaults)
        device = select_device(cfg.device)
        data_cfg = load_data_config(cfg.data)
        ckpt = self.source.checkpoint
        if ckpt is not None and len(ckpt["names"]) != len(data_cfg.names):
            raise DataError(f"model was trained on {len(ckpt['names'])} classes but dataset "
                            f"'{data_cfg.name}' has {len(data_cfg.names)}")
        if ckpt is None:
            log.warning(f"validating {self.arch} with random weights (no checkpoint given)")
        model = self._build(len(data_cfg.names)).to(device).eval()
        precision = Precision.create(cfg.amp, cfg.amp_dtype, device)
        loader = build_val_loader(data_cfg, cfg)
        return evaluate(model, loader, device, conf=cfg.conf, iou=cfg.iou, max_det=cfg.max_det,
                        amp_dtype=precision.dtype, names=data_cfg.names, progress=True)


def _latest_last(user: dict[str, Any]) -> Path:
    project = Path(user.get("project", FIELDS["project"].default))
    found = sorted(project.glob("*/weights/last.pt"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise ConfigError(f"resume=true but no last.pt under '{project}'; pass resume=path/to/last.pt")
    return found[-1]


__all__ = ["LibreYOLO", "resolve_model", "TrainConfig"]
