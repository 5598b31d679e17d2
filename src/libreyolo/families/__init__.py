"""Family registry: one line per family. A duplicate name or alias is an error at import.

Besides `get_family`, the registry answers which family a model name means (the rules of
names.py, which spells names without the registry): an official weights name
(`parse_official`), an architecture name (`parse_arch`), a family's own spellings (`parse_family`).
"""

from __future__ import annotations

import re

from ..names import arch_name, flat, parse_size, weights_name  # noqa: F401 (re-exported)
from .base import REGISTRY, FamilySpec, get_family, register  # noqa: F401 (re-exported)


def parse_official(file_name: str) -> tuple[FamilySpec, str] | None:
    """'LibreYOLO9s.pt' -> (yolo9 spec, 's'); None if not an official weights name (exact case)."""
    for spec in REGISTRY.values():
        m = re.fullmatch(re.escape(spec.weights_prefix) + r"([a-z0-9]+)\.pt", file_name)
        if m and m.group(1) in spec.sizes:
            return spec, m.group(1)
    return None


def parse_arch(name: str) -> tuple[FamilySpec, str] | None:
    """'yolo9-t', 'YOLOv9-t', 'yolo9t', 'yolov9_tiny' -> (yolo9 spec, 't'); None if not an arch name.

    Case-insensitive. The longest family spelling that prefixes the name wins, so a family called
    'yolo' could never swallow 'yolo9'.
    """
    text = flat(name)
    spellings = sorted(((s, spec) for spec in REGISTRY.values() for s in (spec.name, *spec.aliases)),
                       key=lambda p: -len(p[0]))
    for spelling, spec in spellings:
        if text.startswith(spelling):
            size = parse_size(spec, text[len(spelling):])
            if size is not None:
                return spec, size
    return None


def parse_family(name: str) -> FamilySpec | None:
    """'yolo9', 'yolov9', 'YOLOv9' (its name, an alias or its display name) -> the spec; else None."""
    text = flat(name)
    for spec in REGISTRY.values():
        if text in {spec.name, *spec.aliases, flat(spec.display)}:
            return spec
    return None


from .deim.spec import SPEC as _DEIM  # noqa: E402
from .deimv2.spec import SPEC as _DEIMV2  # noqa: E402
from .dfine.spec import SPEC as _DFINE  # noqa: E402
from .ec.spec import SPEC as _EC  # noqa: E402
from .fomo.spec import SPEC as _FOMO  # noqa: E402
from .lingbot.spec import SPEC as _LINGBOT  # noqa: E402
from .mobilenetv4.spec import SPEC as _MOBILENETV4  # noqa: E402
from .resnet.spec import SPEC as _RESNET  # noqa: E402
from .rfdetr.spec import SPEC as _RFDETR  # noqa: E402
from .rtdetr.spec import SPEC as _RTDETR  # noqa: E402
from .rtdetr.spec import SPEC_V2 as _RTDETRV2  # noqa: E402
from .rtdetrv4.spec import SPEC as _RTDETRV4  # noqa: E402
from .rtmdet.spec import SPEC as _RTMDET  # noqa: E402
from .segformer.spec import SPEC as _SEGFORMER  # noqa: E402
from .yolo7.spec import SPEC as _YOLO7  # noqa: E402
from .yolo9.spec import SPEC as _YOLO9  # noqa: E402
from .yolonas.spec import SPEC as _YOLONAS  # noqa: E402
from .yolox.spec import SPEC as _YOLOX  # noqa: E402

register(_YOLO9)
register(_YOLOX)
register(_RTMDET)
register(_RESNET)
register(_MOBILENETV4)
register(_RTDETR)
register(_RTDETRV2)
register(_DFINE)
register(_DEIM)
register(_RTDETRV4)
register(_DEIMV2)
register(_EC)
register(_FOMO)
register(_SEGFORMER)
register(_LINGBOT)
register(_YOLO7)
register(_YOLONAS)
register(_RFDETR)
