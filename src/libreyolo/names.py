"""Model names: what a `model=` string means, decided in one place.

In order (resolve.resolve_model applies them; cli/precheck.py the part that needs no torch):
1. an existing file is a checkpoint;
2. an official weights name, `<weights_prefix><size>.pt` (LibreYOLO9s.pt), may be downloaded;
3. an architecture name, family then size, '-', '_' or ' ' between optional (yolo9-t, YOLOv9-t,
   yolov9_tiny);
4. anything else is an error: a `.pt`/`.pth` name is a weights file that does not exist.

Nothing here imports torch or the registry: importing anything in families/ runs its registry,
which imports the networks. This module spells names from a spec's fields (`arch_name`,
`weights_name`, `parse_size`) and answers the one rule that needs no spec (`is_missing_weights`:
the precheck answers a mistyped path at once). The look-ups that take a name to a registered
family (`parse_arch`, `parse_official`, `parse_family`) are the registry's, in families/__init__.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Protocol

WEIGHTS_SUFFIXES = (".pt", ".pth")
# Every family's weights_prefix starts with this (LibreYOLO9, LibreYOLOX, LibreRTMDet; a test holds
# them to it): without the registry, a missing file named so may still be an official name.
OFFICIAL_PREFIX = "Libre"


class Spelling(Protocol):
    """The fields of a family's spec (families/base.py FamilySpec) that its names are made of."""

    name: str
    joiner: str
    weights_prefix: str
    sizes: tuple[str, ...]
    size_names: dict[str, str]


def flat(name: str) -> str:
    """'YOLOv9_tiny ' -> 'yolov9tiny': the form names are compared in (case, '-', '_', ' ' dropped)."""
    return re.sub(r"[-_ ]", "", name.strip().lower())


def arch_name(spec: Spelling, size: str) -> str:
    return f"{spec.name}{spec.joiner}{size}"


def weights_name(spec: Spelling, size: str) -> str:
    return f"{spec.weights_prefix}{size}.pt"


def parse_size(spec: Spelling, text: str) -> str | None:
    """'tiny', 'T' or 't' -> 't' (a size of `spec`, long spellings from its size_names); else None."""
    size = text.strip().lower()
    size = spec.size_names.get(size, size)
    return size if size in spec.sizes else None


def is_missing_weights(name: str) -> bool:
    """A name that can only be a weights file, and none is there (rule 4): a `.pt`/`.pth` name that
    is not a file and cannot be an official name (those may still be downloaded)."""
    path = Path(name).expanduser()
    return path.suffix in WEIGHTS_SUFFIXES and not path.is_file() and not path.name.startswith(OFFICIAL_PREFIX)
