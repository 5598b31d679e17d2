"""`recipe=auto`: a family's published recipe for long runs, the generic defaults for short ones.

A family's published recipe (YOLOv9's scale jitter 0.9 and mixup, YOLOX's and RTMDet's SGD or
AdamW settings and heavy mixup) was tuned for about 300 epochs of COCO: 118k images, hundreds of
thousands of optimizer steps. A fine-tune of a few thousand images, or a few dozen, takes a few
hundred steps, and the same augmentation then shows the network mostly images it never meets at
validation (objects of 15-80 px shrunk to 2-8 px, two scenes blended) for too few steps to learn
through it. The keys a family marks `long_run` (FamilySpec) are therefore its recipe only in runs
of more than `AUTO_MAX_STEPS` optimizer steps, the threshold `optimizer=auto` uses for the same
question (engine/optim.py); a shorter run trains with the generic defaults of those keys. A key
the user gave is never changed, and the one line the policy logs names what it chose and why.
`recipe=published` and `recipe=generic` choose yourself. The choice is written into the run's
config, so a resume trains on with it (and does not choose again).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import Any

from ..config import FIELDS, show_value
from .optim import AUTO_MAX_ADAMW_STEPS

AUTO_MAX_STEPS = AUTO_MAX_ADAMW_STEPS  # one threshold for "a long schedule", as optimizer=auto's


def long_run_values(spec: Any, size: str) -> dict[str, Any]:
    """The long-schedule part of the recipe of `spec` at `size`: {key: published value}."""
    recipe = spec.defaults_for(size)
    return {key: recipe[key] for key in spec.long_run if key in recipe}


def resolve_recipe(cfg: Any, spec: Any, size: str, explicit: Collection[str] | None,
                   optimizer_steps: int) -> tuple[Any, str | None]:
    """`cfg` with `recipe=auto` made concrete ("published" or "generic"), and the line that says so.

    `explicit`: the keys the user gave, kept whatever the choice; None for a config resolved
    before (a resume), which is returned unchanged, as is one without long-run keys.
    """
    published = long_run_values(spec, size)
    if explicit is None or not published or cfg.recipe == "published":
        return cfg, None
    why = ""
    if cfg.recipe == "auto":
        long = optimizer_steps > AUTO_MAX_STEPS
        cfg = dataclasses.replace(cfg, recipe="published" if long else "generic")
        why = (f" ({optimizer_steps} optimizer steps {'>' if long else '<='} {AUTO_MAX_STEPS}; "
               f"recipe={'generic' if long else 'published'} chooses the other)")
        if long:
            return cfg, f"recipe=auto: {spec.display}'s published recipe {_pairs(published)}{why}"
    generic = {k: FIELDS[k].default for k in published if k not in explicit and FIELDS[k].default != published[k]}
    kept = {k: getattr(cfg, k) for k in published if k in explicit}
    cfg = dataclasses.replace(cfg, **generic)
    line = (f"recipe={'auto' if why else 'generic'}: the generic values {_pairs(generic) or '(none)'} "
            f"instead of {spec.display}'s published {_pairs({k: published[k] for k in generic}) or '(none)'}")
    if kept:
        line += f"; kept as given: {_pairs(kept)}"
    return cfg, line + why


def _pairs(values: dict[str, Any]) -> str:
    return " ".join(f"{k}={show_value(v)}" for k, v in values.items())
