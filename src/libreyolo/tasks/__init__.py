"""Task registry: one line per task. A family lists the tasks it can do (FamilySpec.tasks, the
first is its default); `task=` picks one of them."""

from __future__ import annotations

from ..errors import ConfigError
from .base import TaskSpec

TASKS: dict[str, TaskSpec] = {}


def register(spec: TaskSpec) -> TaskSpec:
    if spec.name in TASKS:
        raise ValueError(f"task '{spec.name}' is registered twice")
    TASKS[spec.name] = spec
    return spec


def get_task(name: str) -> TaskSpec:
    try:
        return TASKS[name]
    except KeyError:
        raise ConfigError(f"unknown task '{name}' (tasks: {', '.join(TASKS)})") from None


def task_for(family, requested: str | None) -> TaskSpec:
    """The task a model of `family` trains: `requested`, which the family must support, or the
    family's first task. One ConfigError line when the family cannot do it."""
    if requested in (None, ""):
        return get_task(family.tasks[0])
    task = get_task(requested)
    if task.name not in family.tasks:
        raise ConfigError(f"{family.display} cannot do task={task.name} (it does: {', '.join(family.tasks)}); "
                          f"drop task= or pick a model made for {task.display}")
    return task


from .classify import SPEC as _CLASSIFY  # noqa: E402
from .detect import SPEC as _DETECT  # noqa: E402
from .points import SPEC as _POINTS  # noqa: E402
from .segment import SPEC as _SEGMENT  # noqa: E402

register(_DETECT)
register(_CLASSIFY)
register(_POINTS)
register(_SEGMENT)
