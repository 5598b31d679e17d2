"""Family registry: one line per family. A duplicate name or alias is an error at import."""

from __future__ import annotations

from ..errors import ModelNameError
from ..names import arch_name, parse_arch, parse_official, weights_name  # noqa: F401 (re-exported)
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


from .deim.spec import SPEC as _DEIM  # noqa: E402
from .dfine.spec import SPEC as _DFINE  # noqa: E402
from .fomo.spec import SPEC as _FOMO  # noqa: E402
from .lingbot.spec import SPEC as _LINGBOT  # noqa: E402
from .mobilenetv4.spec import SPEC as _MOBILENETV4  # noqa: E402
from .resnet.spec import SPEC as _RESNET  # noqa: E402
from .rtdetr.spec import SPEC as _RTDETR  # noqa: E402
from .rtdetr.spec import SPEC_V2 as _RTDETRV2  # noqa: E402
from .rtdetrv4.spec import SPEC as _RTDETRV4  # noqa: E402
from .rtmdet.spec import SPEC as _RTMDET  # noqa: E402
from .segformer.spec import SPEC as _SEGFORMER  # noqa: E402
from .yolo9.spec import SPEC as _YOLO9  # noqa: E402
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
register(_FOMO)
register(_SEGFORMER)
register(_LINGBOT)
