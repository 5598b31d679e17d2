"""Dataset yaml resolution (Ultralytics-compatible).

A dataset is a yaml with `path` (root), `train`, `val` (an images folder, a .txt file listing
images, or a list of those, relative to `path`) and `names` (a list, or a dict {id: name} with ids
0..n-1). `data=NAME` (no slash, no .yaml suffix) means the packaged `configs/datasets/NAME.yaml`.

Relative roots: a user yaml's relative `path` resolves against the yaml's folder; a packaged
yaml's relative `path` resolves against `$LIBREYOLO_CACHE/datasets` (the package folder is no
place for data). Packaged yamls may say `builtin: shapes` / `shapes-cls` / `shapes-seg` or a data regime of
`regimes.py` (`shapes-dense`, ...) (generated on
first use) or `download: FILE.zip` + `sha256:` (fetched on first use, see download.py). `task:
classify` marks a classification dataset (class folders, see classify.py), `task: segment` a
segmentation one (images + masks, see segment.py); absent means detect. A split given as
`{images: DIR, annotations: FILE.json}`, or `data=` an instances json, is a COCO-json dataset
(coco_json.py).

Labels are not read here: scanning and verifying happen when a split is built (labels.py).
"""

from __future__ import annotations

import os
import re
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from ..errors import DataError
from .cache import cache_root
from .dataconfig import DataConfig
from .safe_yaml import load_yaml

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")


def builtin_names() -> list[str]:
    folder = _packaged_folder()
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_data_config(data: str | os.PathLike) -> DataConfig:
    """Resolve `data` (a built-in name or a yaml path) into a DataConfig. Raises DataError."""
    text = str(data)
    if text.lower().endswith(".json"):  # an instances_*.json in the COCO layout
        from .coco_json import load_coco_json

        return load_coco_json(Path(text))
    packaged = _is_builtin_name(text)
    if Path(text).expanduser().is_dir() and not (packaged and _packaged_folder().joinpath(f"{text}.yaml").is_file()):
        raise DataError(f"data={text} is a folder: a detector reads a dataset yaml (path, train, val, names); "
                        f"a folder of class folders trains a classifier (model=resnet18)")
    yaml_path, raw = _read_yaml_source(text, packaged, "dataset yaml not found: {}")
    name = text if packaged else yaml_path.stem
    _check_task(raw, name, "detect")
    from .coco_json import is_coco_yaml, load_coco_yaml

    if is_coco_yaml(raw):  # train: {images: DIR, annotations: FILE.json}
        return load_coco_yaml(raw, yaml_path, _resolve_root(raw, yaml_path, packaged), name)
    names = _parse_names(raw, yaml_path)
    root = _resolve_root(raw, yaml_path, packaged)
    _materialise(raw, root, name)
    splits = {s: _split_files(raw, s, root, yaml_path) for s in ("train", "val")}
    known = {"path", "train", "val", "names", "nc", "builtin", "download", "sha256", "task"}
    extra = {k: v for k, v in raw.items() if k not in known}
    return DataConfig(name, yaml_path, root, splits["train"], splits["val"], names, extra)


TASK_WORDS = {"detect": "detection", "classify": "classification", "segment": "segmentation"}
TASK_EXAMPLES = {"detect": "shapes", "classify": "shapes-cls", "segment": "shapes-seg"}


def _check_task(raw: dict, name: str, task: str, default: str = "detect") -> None:
    """A yaml may say `task: classify` (absent: `default`); the other task's loader refuses it in
    one line instead of failing later on missing labels or class folders."""
    given = raw.get("task", default)
    if given == task:
        return
    if given not in TASK_WORDS:
        raise DataError(f"dataset {name}: unknown task '{given}' (known: {', '.join(TASK_WORDS)})")
    raise DataError(f"dataset {name} is a {TASK_WORDS[given]} dataset: train a {TASK_WORDS[given]} "
                    f"model on it, or pick a {TASK_WORDS[task]} dataset (e.g. {TASK_EXAMPLES[task]})")


def task_builtins(task: str) -> list[str]:
    """The packaged datasets whose yaml says `task: <task>` (shapes-cls, shapes-seg)."""
    out = []
    for entry in sorted(_packaged_folder().iterdir(), key=lambda p: p.name):
        if entry.name.endswith(".yaml") and (yaml.safe_load(entry.read_text(encoding="utf-8")) or {}).get("task") == task:
            out.append(entry.name[: -len(".yaml")])
    return out


def _read_yaml_source(text: str, packaged: bool, missing: str) -> tuple[Path, dict]:
    """(yaml path, its mapping) of a built-in name or a user's yaml path; `missing` is the
    not-found line, `{}` standing for the path."""
    if packaged:
        return _read_packaged(text)
    yaml_path = Path(text).expanduser()
    if not yaml_path.is_file():
        raise DataError(missing.format(yaml_path))
    return yaml_path, _parse_yaml(_read_text(yaml_path, "dataset yaml"), yaml_path)


def read_task_yaml(text: str, task: str, forms: str) -> tuple[Path, dict, bool]:
    """(yaml path, its mapping, packaged?) of `text`, a built-in name or a yaml path, for a task
    whose datasets also come as folders (`forms` names them for the not-found line); the yaml must
    be of `task` (a user's yaml without `task` is taken as one; a packaged one must say so)."""
    packaged = _is_builtin_name(text)
    if packaged:
        if not _packaged_folder().joinpath(f"{text}.yaml").is_file():
            raise DataError(f"dataset '{text}' not found: no such folder, and the built-in {TASK_WORDS[task]} "
                            f"datasets are {', '.join(task_builtins(task))}")
    yaml_path, raw = _read_yaml_source(text, packaged,
                                       f"dataset not found: {{}} (pass {forms}, a dataset .yaml or a built-in name)")
    _check_task(raw, text, task, default="detect" if packaged else task)
    return yaml_path, raw, packaged


def _is_builtin_name(text: str) -> bool:
    return "/" not in text and "\\" not in text and not text.lower().endswith((".yaml", ".yml", ".json"))


def _packaged_folder():
    return resources.files("libreyolo").joinpath("configs").joinpath("datasets")


def _read_packaged(name: str) -> tuple[Path, dict]:
    entry = _packaged_folder().joinpath(f"{name}.yaml")
    if not entry.is_file():
        known = ", ".join(builtin_names())
        raise DataError(f"unknown dataset '{name}': built-in datasets are {known} "
                        f"(or pass a path to a dataset .yaml)")
    return Path(str(entry)), _parse_yaml(entry.read_text(encoding="utf-8"), name)


def _read_text(path: Path, what: str) -> str:
    """A user's text file, or one DataError line: binary garbage is not a decode traceback."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{what} {path} is not UTF-8 text (byte {exc.start}); a binary file?") from None
    except OSError as exc:
        raise DataError(f"cannot read {what} {path} ({exc.strerror or type(exc).__name__})") from None


def _parse_yaml(text: str, where: Any) -> dict:
    try:
        raw = load_yaml(text, where)  # bounded: an alias bomb is one line, not a MemoryError
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f" (line {mark.line + 1})" if mark is not None else ""
        raise DataError(f"dataset yaml {where} is not valid yaml{line}") from None
    if not isinstance(raw, dict):
        raise DataError(f"dataset yaml {where} must be a mapping with path, train, val and names")
    return raw


def _resolve_root(raw: dict, yaml_path: Path, packaged: bool) -> Path:
    base = cache_root() / "datasets" if packaged else yaml_path.parent
    path = str(raw.get("path") or "").strip()
    if not path:  # a packaged yaml's data is named after it; a user's sits beside it
        return (base / yaml_path.stem if packaged else base).resolve()
    root = Path(path).expanduser()
    return (root if root.is_absolute() else base / root).resolve()


def _materialise(raw: dict, root: Path, name: str) -> None:
    """Generate a builtin dataset or download a missing one before its files are listed."""
    builtin = raw.get("builtin")
    if builtin is not None:
        if builtin == "shapes":
            from .shapes import ensure_shapes

            ensure_shapes(root)
        elif builtin == "shapes-cls":
            from .shapes_cls import ensure_shapes_cls

            ensure_shapes_cls(root)
        elif builtin == "shapes-seg":
            from .shapes_seg import ensure_shapes_seg

            ensure_shapes_seg(root)
        else:
            from .regimes import REGIMES, ensure_regime

            if builtin not in REGIMES:
                known = ", ".join(["shapes", "shapes-cls", "shapes-seg", *REGIMES])
                raise DataError(f"dataset {name}: unknown builtin '{builtin}' (known: {known})")
            ensure_regime(root, builtin)
        return
    sha = raw.get("sha256")
    if sha is not None and not (isinstance(sha, str) and re.fullmatch(r"[0-9a-fA-F]{64}", sha)):
        raise DataError(f"dataset {name}: sha256 must be 64 hex digits in quotes, not {sha!r}")
    if raw.get("download") and not _splits_present(raw, root):
        from .download import fetch_dataset

        fetch_dataset(str(raw["download"]), root, sha, name)


def _splits_present(raw: dict, root: Path) -> bool:
    entries = [raw.get("train"), raw.get("val")]
    flat = [e for entry in entries for e in (entry if isinstance(entry, list) else [entry])]
    return all(e is not None and (root / str(e)).exists() for e in flat)


def _parse_names(raw: dict, where: Path) -> list[str]:
    names = raw.get("names")
    if isinstance(names, list) and names:
        out = [str(n) for n in names]
    elif isinstance(names, dict) and names:
        try:
            ids = sorted(int(k) for k in names)
        except (TypeError, ValueError):
            raise DataError(f"dataset yaml {where}: names keys must be class ids 0..n-1") from None
        if ids != list(range(len(ids))):
            raise DataError(f"dataset yaml {where}: names ids must be 0..{len(ids) - 1} "
                            f"without gaps (got {ids})")
        out = [str(names[k]) for k in sorted(names, key=int)]
    else:
        raise DataError(f"dataset yaml {where}: 'names' must be a non-empty list or {{id: name}}")
    if "nc" in raw and raw["nc"] != len(out):
        raise DataError(f"dataset yaml {where}: nc is {raw['nc']} but names has {len(out)} entries")
    return out


def _split_files(raw: dict, split: str, root: Path, where: Path) -> list[Path]:
    entry = raw.get(split)
    if entry is None or entry == "" or entry == []:
        raise DataError(f"dataset yaml {where}: '{split}' is missing")
    files: list[Path] = []
    for item in entry if isinstance(entry, list) else [entry]:
        files += _list_images(root / str(item), split)
    if not files:
        where = root / str(entry) if not isinstance(entry, list) else f"{entry} under {root}"
        raise DataError(f"{split}: no images ({', '.join(IMAGE_SUFFIXES)}) in {where}")
    return files


def _list_images(source: Path, split: str) -> list[Path]:
    if source.is_dir():
        return sorted(p for p in source.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
    if source.is_file() and source.suffix == ".txt":
        # One image per line; a relative line is relative to the list file's folder.
        lines = _read_text(source, f"{split} image list").splitlines()
        out = []
        for line in (ln.strip() for ln in lines):
            if line and not line.startswith("#"):
                p = Path(line).expanduser()
                out.append((p if p.is_absolute() else source.parent / p).resolve())
        return out
    raise DataError(f"{split}: images not found at {source}")
