"""recipe=auto: a family's long-schedule recipe only in long runs; keys the user gave always kept.
Registry-driven: every family's `long_run` keys are checked the day it registers."""

from __future__ import annotations

import pytest

from libreyolo.config import FIELDS, build_config
from libreyolo.engine.optim import resolve_auto
from libreyolo.engine.recipe import AUTO_MAX_STEPS, long_run_values, resolve_recipe
from libreyolo.families import REGISTRY, get_family


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_long_run_keys_are_config_keys_of_the_recipe(name):
    spec = REGISTRY[name]
    for key in spec.long_run:
        assert key in FIELDS, f"{name}: long_run key {key!r} is no config key"
        assert any(key in spec.defaults_for(size) for size in spec.sizes), f"{name}: {key!r} is not in its recipe"


def _cfg(spec, size, **user):
    return build_config(user, spec.defaults_for(size)), set(user)


def test_a_short_run_trains_with_the_generic_values_and_says_so():
    spec = get_family("yolo9")
    cfg, explicit = _cfg(spec, "t", epochs=100)
    out, line = resolve_recipe(cfg, spec, "t", explicit, optimizer_steps=800)
    assert (out.scale, out.mixup, out.no_aug_epochs, out.recipe) == (0.5, 0.0, 10, "generic")
    assert line.startswith("recipe=auto: the generic values scale=0.5 mixup=0.0 no_aug_epochs=10 instead of "
                           "YOLOv9's published scale=0.9 mixup=0.15 no_aug_epochs=15")
    assert "800 optimizer steps <= 10000" in line


def test_keys_given_are_kept_and_named():
    spec = get_family("yolo9")
    cfg, explicit = _cfg(spec, "t", scale=0.8)
    out, line = resolve_recipe(cfg, spec, "t", explicit, optimizer_steps=10)
    assert (out.scale, out.mixup) == (0.8, 0.0)
    assert "kept as given: scale=0.8" in line and "scale=0.5" not in line


def test_a_long_run_keeps_the_published_recipe():
    spec = get_family("yolo9")
    cfg, explicit = _cfg(spec, "t")
    out, line = resolve_recipe(cfg, spec, "t", explicit, optimizer_steps=AUTO_MAX_STEPS + 1)
    assert (out.scale, out.mixup, out.recipe) == (0.9, 0.15, "published")
    assert line.startswith("recipe=auto: YOLOv9's published recipe scale=0.9 mixup=0.15 no_aug_epochs=15")


def test_named_recipes_and_resumes_are_not_chosen_again():
    spec = get_family("yolo9")
    cfg, explicit = _cfg(spec, "t", recipe="published")
    assert resolve_recipe(cfg, spec, "t", explicit, optimizer_steps=10) == (cfg, None)
    cfg, explicit = _cfg(spec, "t", recipe="generic")
    out, line = resolve_recipe(cfg, spec, "t", explicit, optimizer_steps=AUTO_MAX_STEPS * 10)
    assert out.scale == 0.5 and line.startswith("recipe=generic:") and "optimizer steps" not in line
    # A resumed run's config was resolved when it started: explicit=None leaves it as it is.
    cfg, _ = _cfg(spec, "t")
    assert resolve_recipe(cfg, spec, "t", None, optimizer_steps=10) == (cfg, None)


def test_a_family_without_long_run_keys_is_untouched():
    spec = next(s for s in REGISTRY.values() if not s.long_run)
    size = spec.sizes[0]
    cfg, explicit = _cfg(spec, size)
    assert long_run_values(spec, size) == {}
    assert resolve_recipe(cfg, spec, size, explicit, optimizer_steps=10) == (cfg, None)


@pytest.mark.parametrize("family", ["yolox", "rtmdet"])
def test_coco_optimizers_give_way_to_optimizer_auto_in_short_runs(family):
    """YOLOX's SGD and RTMDet's AdamW settings are their 300-epoch schedules': a short run gets
    optimizer=auto (AdamW, the peer's fine-tune rule) and the generic augmentation."""
    spec = get_family(family)
    cfg, explicit = _cfg(spec, "t")
    out, _ = resolve_recipe(cfg, spec, "t", explicit, optimizer_steps=500)
    assert out.optimizer == "auto" and out.mixup == 0.0
    assert (out.box, out.cls) == (cfg.box, cfg.cls)  # the head's loss gains are not a schedule's
    resolved, _ = resolve_auto(out, 3, 500, explicit)
    assert (resolved.optimizer, resolved.lr0) == ("adamw", round(0.002 * 5 / 7, 6))


def test_optimizer_auto_names_the_values_it_replaces():
    cfg = build_config({"lr0": 0.02, "momentum": 0.9})
    out, line = resolve_auto(cfg, 10, 100, explicit={"lr0", "momentum"})
    assert out.lr0 == 0.000714
    assert "replaced your lr0=0.02" in line and "momentum" not in line.split("replaced your")[1]
    assert "optimizer=adamw" in line.split("replaced your")[1]
    assert "replaced" not in resolve_auto(cfg, 10, 100)[1]
