"""What a model name resolves to, and what an inference command takes from it.

`resolve_model(name)` applies the model-name rules (names.py; the LibreYOLO facade, model.py,
states them for users): an existing file is a checkpoint, an absent official weights name is
downloaded into the cache (or, when that is impossible, the model is built from scratch with one
warning line), an architecture name builds from scratch, anything else is one ModelNameError line.
The answer, a `ModelSource`, is the family, the size and the checkpoint (when there are weights).

`inference_args` and `inference_setup` are what `val`, `predict`, `export` and `profile infer`
take from a source's checkpoint when the user does not say: the image size it learned, the data it
learned from, its class names, its task.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import FIELDS
from .errors import CheckpointError, ConfigError, DataError, ModelNameError
from .families import REGISTRY, arch_name, get_family, parse_arch, parse_official, weights_name
from .families.base import FamilySpec
from .tasks import task_for

log = logging.getLogger("libreyolo")

DEFAULT_WEIGHTS_URL = "https://github.com/libreyolo/libreyolo/releases/download/weights-v1"


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
    official = parse_official(path.name)
    if official is not None:
        spec, size = official
        cached, problem = fetch_weights(path.name, load_checkpoint)
        if cached is not None:
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
        official = parse_official(path.name)
        if official is not None:
            return official
    source = resolve_model(name)  # a file or an architecture name: nothing to download
    return source.spec, source.size


def fetch_weights(name: str, check: Callable[[Path], Any]) -> tuple[Path | None, str | None]:
    """A published weights file by name, through the path official weights take: the cached
    copy (`$LIBREYOLO_CACHE/weights/<name>`), else downloaded from `$LIBREYOLO_WEIGHTS_URL/<name>`
    and accepted by `check` (which raises CheckpointError on a file it cannot use). Returns
    (path, None), or (None, why not in one line)."""
    cached = cache_dir() / "weights" / name
    problem = None if cached.is_file() else _try_download(name, cached, check)
    return (None, problem) if problem else (cached, None)


def _try_download(name: str, dest: Path, check: Callable[[Path], Any]) -> str | None:
    """Fetch published weights into the cache; None on success, else why not (one line)."""
    from .data.download import download_file

    url = os.environ.get("LIBREYOLO_WEIGHTS_URL", DEFAULT_WEIGHTS_URL).rstrip("/") + "/" + name
    try:
        download_file(url, dest)
        check(dest)  # an HTML error page saved as .pt must not poison the cache
    except (DataError, CheckpointError) as exc:
        dest.unlink(missing_ok=True)
        return f"weights {name} are not available ({exc})"
    return None


# Keys an inference command (val, predict) takes from a checkpoint's training arguments
# when they are not given: a model is measured at the image size it learned, on the data it
# learned from. Validating a 128 px model at 640 px reported mAP50-95 0.0006 instead of the
# training run's figure.
INFERENCE_KEYS = ("imgsz", "data")
ORIGIN = {"given": "as given", "checkpoint": "from the checkpoint's training arguments",
           "default": "the default"}


def inference_args(source: ModelSource, user: dict[str, Any],
                   keys: tuple[str, ...] = INFERENCE_KEYS) -> tuple[dict[str, Any], dict[str, str]]:
    """The values of `keys` to run with, and where each comes from.

    Returns ({key: value} for the keys the checkpoint supplies, {key: 'given' | 'checkpoint' |
    'default'}): the user's value wins, then the value the checkpoint was trained with (its
    `config`), else the config default applies (an architecture name, or an old checkpoint)."""
    trained = source.checkpoint.get("config") if source.checkpoint is not None else None
    trained = trained if isinstance(trained, dict) else {}
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for key in keys:
        if user.get(key) is not None:
            origin[key] = "given"
        elif trained.get(key) is not None:
            values[key], origin[key] = trained[key], "checkpoint"
        else:
            origin[key] = "default"
    return values, origin


def inference_setup(source: ModelSource, imgsz: int | None, device: Any, command: str):
    """What predict and export run a model with: (task, class names, imgsz, device). The names
    are the checkpoint's, else class0, class1, ... of the task's default count; imgsz as given,
    else the size the checkpoint was trained at, else the family's default (as val chooses it);
    one device (a GPU list is one ConfigError line naming `command`)."""
    from .engine.device import device_list, select_device

    ckpt = source.checkpoint
    task = task_for(source.spec, (ckpt or {}).get("task"))
    names = [str(n) for n in ckpt["names"]] if ckpt is not None else [f"class{i}" for i in range(task.default_classes)]
    if imgsz is None:
        trained, _ = inference_args(source, {}, ("imgsz",))
        imgsz = trained.get("imgsz") or source.defaults.get("imgsz", FIELDS["imgsz"].default)
    if device_list(str(device).strip().lower()) is not None:
        raise ConfigError(f"device={device}: {command} runs on one device (e.g. device=0)")
    return task, names, int(imgsz), select_device(device)
