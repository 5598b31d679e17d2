"""`--fail-if EXPR`: CI gates on a profile's headline figures (`profile summary`, `profile compare`).

A gate is `FIELD OP VALUE`, parsed by hand (never eval): FIELD is a key of profile_summary.json
(`summary()` in artifacts.py, less `schema` and `schema_version`) or one of the short ALIASES; OP
is one of `< <= > >= == !=`; VALUE is a number (`12`, `0.7`, `-1`, `1e3`) for a numeric field,
`true`/`false` for `cuda_graph`, a word for a text field (`verdict!=compute-bound`; quotes
optional; a verdict must be one the profiler gives, so a typo cannot make a gate that never
fires). Text and flag fields take `==` and `!=` only. `profile compare A B` measures FIELD on B;
its VALUE may also be `A` (A's same figure) or `N*A` (`step_ms>1.05*A`: B more than 5 % slower).

A gate fails when its expression holds (`--fail-if "utilisation<0.7"` fails a run whose
utilisation is below 0.7), so a list of gates reads as the conditions that break the build. Every
gate is parsed before a file is read: a malformed one is a ConfigError line (exit code 2) that
costs no I/O. A figure the profile did not measure (null, e.g. overhead_frac of a graphed window
whose timed steps all ran eager) cannot pass or fail: that is a ConfigError too, rather than a
gate that silently never fires.
"""

from __future__ import annotations

import difflib
import math
import operator
import re
from dataclasses import dataclass

from ..errors import ConfigError

NUMBERS = ("step_ms_mean", "step_ms_std", "utilisation", "kernel_busy_ms", "data_wait_ms", "data_wait_frac",
           "syncs_per_step", "peak_memory_mb", "overhead_frac", "batch", "imgsz", "workers", "steps")
TEXTS = ("verdict", "precision", "device", "reason", "lever", "mode", "arch")
FLAGS = ("cuda_graph",)
FIELDS = (*NUMBERS, *TEXTS, *FLAGS)
ALIASES = {"step_ms": "step_ms_mean", "step_std": "step_ms_std", "utilization": "utilisation",
           "kernel_busy": "kernel_busy_ms", "data_wait": "data_wait_ms", "syncs": "syncs_per_step",
           "peak_memory": "peak_memory_mb"}
VERDICTS = ("compute-bound", "dataloader-bound", "host-bound", "launch-bound", "memory-bound")  # verdict.verdict's names
MODES = ("train", "infer")
OPS = ("<", "<=", ">", ">=", "==", "!=")
_CMP = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq, "!=": operator.ne}
_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NUMBER = r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
_TIMES_A = re.compile(rf"({_NUMBER})\s*\*\s*A")
HELP = ('FIELD OP VALUE, e.g. "utilisation<0.7", "verdict!=compute-bound", "step_ms>1.05*A" (compare); '
        "fails the command (exit code 1) when it holds")


@dataclass(frozen=True)
class Gate:
    text: str  # as written, for messages
    field: str  # the summary key (aliases resolved)
    op: str
    value: float | str | bool | None  # None: the value is A's figure times `factor`
    factor: float | None = None


def parse(text: str, compare: bool = False) -> Gate:
    """One gate, or ConfigError naming what is wrong with it. `compare`: `A` and `N*A` are allowed."""
    expr = text.strip()
    where = f"--fail-if '{expr}'"
    if not expr:
        raise ConfigError(f"--fail-if '': empty; write {HELP}")
    m = _FIELD.match(expr)
    if not m:
        raise ConfigError(f"{where}: no field name first; write {HELP}")
    name = m.group()
    rest = expr[m.end():].lstrip()
    op = re.match(r"[<>=!]*", rest).group()
    if not op:
        raise ConfigError(f"{where}: no comparison after '{name}' (use one of {' '.join(OPS)})")
    if op not in OPS:
        hint = " ('=' alone: write '==')" if op == "=" else ""
        raise ConfigError(f"{where}: unknown operator '{op}'{hint} (use one of {' '.join(OPS)})")
    field = ALIASES.get(name, name)
    if field not in FIELDS:
        close = difflib.get_close_matches(name, [*FIELDS, *ALIASES], n=1, cutoff=0.6)
        hint = f"did you mean '{close[0]}'?" if close else f"fields: the keys of profile_summary.json: {', '.join(FIELDS)}"
        raise ConfigError(f"{where}: unknown field '{name}' ({hint})")
    raw = rest[len(op):].strip()
    if not raw:
        raise ConfigError(f"{where}: no value after '{op}'")
    if field not in NUMBERS and op not in ("==", "!="):
        raise ConfigError(f"{where}: {field} is compared with == or != only")
    times = _TIMES_A.fullmatch(raw)
    if raw != "A" and not times:
        return Gate(expr, field, op, _value(where, field, raw))
    if not compare:
        raise ConfigError(f"{where}: 'A' is the first profile of 'profile compare A B'; a 'profile summary' "
                          f"gate takes a value")
    if times and field not in NUMBERS:
        raise ConfigError(f"{where}: '{raw}' multiplies a number and {field} is not one (write {field}{op}A)")
    factor = float(times.group(1)) if times else 1.0
    if not math.isfinite(factor):
        raise ConfigError(f"{where}: '{times.group(1)}' is not a number")
    return Gate(expr, field, op, None, factor)


def parse_all(texts: list[str] | None, compare: bool = False) -> list[Gate]:
    """Every --fail-if of a command, in order; the first malformed one raises."""
    return [parse(t, compare) for t in texts or []]


def _value(where: str, field: str, raw: str) -> float | str | bool:
    if field in NUMBERS:
        if not re.fullmatch(_NUMBER, raw) or not math.isfinite(float(raw)):
            raise ConfigError(f"{where}: '{raw}' is not a number ({field} is one)")
        return float(raw)
    if field in FLAGS:
        if raw.lower() not in ("true", "false"):
            raise ConfigError(f"{where}: '{raw}' is not true or false ({field} is one of them)")
        return raw.lower() == "true"
    word = raw[1:-1] if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"" else raw
    for name, allowed in (("verdict", VERDICTS), ("mode", MODES)):
        if field == name and word not in allowed:
            raise ConfigError(f"{where}: unknown {name} '{word}' (one of {', '.join(allowed)})")
    return word


def failure(gates: list[Gate], figures: dict, a: dict | None = None, *, name: str = "the profile",
            notes: dict[str, str] | None = None) -> str | None:
    """The line naming the first gate whose expression holds on `figures`, or None when none does.

    For compare, `figures` are B's and `a` A's (`name` "B"); `notes` follow a field's value in the
    line (", the mean of 3 trials"). ConfigError when a gate's figure is absent or null."""
    own = f"{name}'s " if a is not None else ""
    for g in gates:
        value = _figure(g, figures, name)
        base = None if g.factor is None else _figure(g, a, "A")
        bound = g.value if base is None else base * g.factor if g.field in NUMBERS else base
        if not _CMP[g.op](value, bound):
            continue
        line = f"gate failed: {g.text} ({own}{g.field} is {_show(value)}{(notes or {}).get(g.field, '')}"
        if base is not None:
            line += f"; A's is {_show(base)}" + (f", so {g.factor:g}*A is {_show(bound)}" if g.factor != 1 else "")
        return line + ")"
    return None


def repeat_figures(rep: dict) -> tuple[dict, dict[str, str]]:
    """What gates read in a --repeat aggregate (profile_repeat.json), and the notes for their line:
    the mean over the trials of each figure, the verdict most trials gave, and the setup."""
    figures = {k: v["mean"] for k, v in rep["figures"].items()}
    figures.update({k: rep[k] for k in ("verdict", "mode", "arch", "batch", "imgsz", "device") if k in rep})
    notes = {k: f", the mean of {rep['trials']} trials" for k in rep["figures"]}
    notes["verdict"] = f", the verdict of {rep['verdict_count']} of {rep['trials']} trials"
    return figures, notes


def _figure(g: Gate, figures: dict, name: str) -> float | str | bool:
    """The gate's figure in `figures`, checked to be of the field's kind."""
    if g.field not in figures:
        raise ConfigError(f"gate '{g.text}': {name} has no {g.field} (it has {', '.join(k for k in FIELDS if k in figures)})")
    value = figures[g.field]
    if value is None:
        raise ConfigError(f"gate '{g.text}' cannot be checked: {name}'s {g.field} is null (not measured in that "
                          f"window); drop the gate or measure it")
    kind = "number" if g.field in NUMBERS else "string" if g.field in TEXTS else "boolean"
    fits = {"number": isinstance(value, (int, float)) and not isinstance(value, bool),
            "string": isinstance(value, str), "boolean": isinstance(value, bool)}[kind]
    if not fits:
        raise ConfigError(f"gate '{g.text}' cannot be checked: {name}'s {g.field} is {value!r}, not a {kind}")
    return value


def _show(x: float | str | bool) -> str:
    if isinstance(x, bool):
        return str(x).lower()
    if isinstance(x, (int, float)):
        return format(x, ".4g")
    return x
