"""Family registry: one line per family. A duplicate name or alias is an error at import."""

from __future__ import annotations

import re

from ..errors import ModelNameError
from .base import FamilySpec

REGISTRY: dict[str, FamilySpec] = {}


def register(spec: FamilySpec) -> FamilySpec:
    for name in (spec.name, *spec.aliases):
        taken = _by_name(name)
        if taken is not None:
            raise ValueError(f"family name '{name}' of {spec.name} is already used by {taken.name}")
    REGISTRY[spec.name] = spec
    return spec


def _by_name(name: str) -> FamilySpec | None:
    for spec in REGISTRY.values():
        if name in (spec.name, *spec.aliases):
            return spec
    return None


def get_family(name: str) -> FamilySpec:
    spec = _by_name(name)
    if spec is None:
        raise ModelNameError(f"unknown family '{name}' (known: {', '.join(REGISTRY)})")
    return spec


def parse_arch(name: str) -> tuple[FamilySpec, str] | None:
    """'yolo9-t', 'YOLOv9-t', 'yolo9t', 'yolov9_tiny' -> (yolo9 spec, 't'); None if not an arch name.

    Case-insensitive; '-', '_' and spaces between family and size are optional. The longest family
    spelling that prefixes the name wins, so a family called 'yolo' could never swallow 'yolo9'.
    """
    flat = re.sub(r"[-_ ]", "", name.strip().lower())
    spellings = sorted(((s, spec) for spec in REGISTRY.values() for s in (spec.name, *spec.aliases)),
                       key=lambda p: -len(p[0]))
    for spelling, spec in spellings:
        if flat.startswith(spelling):
            rest = flat[len(spelling):]
            size = spec.size_names.get(rest, rest)
            if size in spec.sizes:
                return spec, size
    return None


def arch_name(spec: FamilySpec, size: str) -> str:
    return f"{spec.name}{spec.joiner}{size}"


def weights_name(spec: FamilySpec, size: str) -> str:
    return f"{spec.weights_prefix}{size}.pt"


from .mobilenetv4.spec import SPEC as _MOBILENETV4  # noqa: E402
from .resnet.spec import SPEC as _RESNET  # noqa: E402
from .rtmdet.spec import SPEC as _RTMDET  # noqa: E402
from .yolo9.spec import SPEC as _YOLO9  # noqa: E402
from .yolox.spec import SPEC as _YOLOX  # noqa: E402

register(_YOLO9)
register(_YOLOX)
register(_RTMDET)
register(_RESNET)
register(_MOBILENETV4)
