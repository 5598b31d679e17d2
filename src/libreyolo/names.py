"""Model names: what a `model=` string means, decided in one place.

In order (resolve.resolve_model applies them; cli/precheck.py the part that needs no torch):
1. an existing file is a checkpoint;
2. an official weights name, `<weights_prefix><size>.pt` (LibreYOLO9s.pt), may be downloaded;
3. an architecture name, family then size, '-', '_' or ' ' between optional (yolo9-t, YOLOv9-t,
   yolov9_tiny);
4. anything else is an error: a `.pt`/`.pth` name is a weights file that does not exist.

Nothing here imports torch, and this module is outside families/ because importing anything in
that package runs its registry, which imports the networks. The parsers read the registry when
called; `is_missing_weights` needs no registry, so the precheck answers a mistyped path at once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .families.base import FamilySpec

WEIGHTS_SUFFIXES = (".pt", ".pth")
# Every family's weights_prefix starts with this (LibreYOLO9, LibreYOLOX, LibreRTMDet; a test holds
# them to it): without the registry, a missing file named so may still be an official name.
OFFICIAL_PREFIX = "Libre"


def _specs() -> Iterable[FamilySpec]:
    from .families import REGISTRY  # imports torch: only a parser that needs the specs gets here

    return REGISTRY.values()


def _flat(name: str) -> str:
    return re.sub(r"[-_ ]", "", name.strip().lower())


def arch_name(spec: FamilySpec, size: str) -> str:
    return f"{spec.name}{spec.joiner}{size}"


def weights_name(spec: FamilySpec, size: str) -> str:
    return f"{spec.weights_prefix}{size}.pt"


def parse_size(spec: FamilySpec, text: str) -> str | None:
    """'tiny', 'T' or 't' -> 't' (a size of `spec`, long spellings from its size_names); else None."""
    size = text.strip().lower()
    size = spec.size_names.get(size, size)
    return size if size in spec.sizes else None


def parse_official(file_name: str) -> tuple[FamilySpec, str] | None:
    """'LibreYOLO9s.pt' -> (yolo9 spec, 's'); None if not an official weights name (exact case)."""
    for spec in _specs():
        m = re.fullmatch(re.escape(spec.weights_prefix) + r"([a-z0-9]+)\.pt", file_name)
        if m and m.group(1) in spec.sizes:
            return spec, m.group(1)
    return None


def parse_arch(name: str) -> tuple[FamilySpec, str] | None:
    """'yolo9-t', 'YOLOv9-t', 'yolo9t', 'yolov9_tiny' -> (yolo9 spec, 't'); None if not an arch name.

    Case-insensitive. The longest family spelling that prefixes the name wins, so a family called
    'yolo' could never swallow 'yolo9'.
    """
    flat = _flat(name)
    spellings = sorted(((s, spec) for spec in _specs() for s in (spec.name, *spec.aliases)), key=lambda p: -len(p[0]))
    for spelling, spec in spellings:
        if flat.startswith(spelling):
            size = parse_size(spec, flat[len(spelling):])
            if size is not None:
                return spec, size
    return None


def parse_family(name: str) -> FamilySpec | None:
    """'yolo9', 'yolov9', 'YOLOv9' (its name, an alias or its display name) -> the spec; else None."""
    flat = _flat(name)
    for spec in _specs():
        if flat in {spec.name, *spec.aliases, _flat(spec.display)}:
            return spec
    return None


def is_missing_weights(name: str) -> bool:
    """A name that can only be a weights file, and none is there (rule 4): a `.pt`/`.pth` name that
    is not a file and cannot be an official name (those may still be downloaded)."""
    path = Path(name).expanduser()
    return path.suffix in WEIGHTS_SUFFIXES and not path.is_file() and not path.name.startswith(OFFICIAL_PREFIX)
