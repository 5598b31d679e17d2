"""The `key=value` grammar of `libreyolo train|val` (also `--key value` and `--key=value`).

Values are parsed by a small typed parser driven by the key's type in `TrainConfig`, never by
`eval`: booleans (true/false/1/0/yes/no), ints, floats, `none`, lists (`device=0,1`) and quoted
strings. Every mistake raises `ConfigError` with one line naming the key, the value and what is
allowed.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Iterable
from typing import Any, Literal, Union

from ..config import FIELDS, check_value, describe_type, key_type, unknown_key_message
from ..errors import ConfigError

_TRUE = {"true", "yes", "1", "on"}
_FALSE = {"false", "no", "0", "off"}
_INT = re.compile(r"[+-]?[0-9]+(_[0-9]+)*")


def _unquote(raw: str) -> tuple[str, bool]:
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"":
        return raw[1:-1], True
    return raw, False


def _parse_as(raw: str, tp: Any, quoted: bool) -> Any:
    """Parse `raw` as type `tp`; raise ValueError when it does not fit."""
    origin = typing.get_origin(tp)
    if origin is Union:
        # Try the narrow arms first so 'false' is a bool for `cache`, 'ram' a literal.
        arms = sorted(typing.get_args(tp), key=lambda a: a is str)
        for arm in arms:
            try:
                return _parse_as(raw, arm, quoted)
            except ValueError:
                continue
        raise ValueError(raw)
    if origin is Literal:
        if raw.lower() in typing.get_args(tp):
            return raw.lower()
        raise ValueError(raw)
    if tp is type(None):
        if not quoted and raw.lower() in {"none", "null", ""}:
            return None
        raise ValueError(raw)
    if tp is bool:
        low = raw.lower()
        if not quoted and low in _TRUE | _FALSE:
            return low in _TRUE
        raise ValueError(raw)
    if tp is int:
        # Digits only (an optional sign, '_' between digit groups): int() alone would also take
        # ' 5', '٣' and other spellings nobody means, and '1e3' or '2.0' are floats, not ints.
        if quoted or not _INT.fullmatch(raw):
            raise ValueError(raw)
        return int(raw)
    if tp is float:
        if quoted:
            raise ValueError(raw)
        value = float(raw)
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(raw)
        return value
    if tp is str:
        return raw
    raise ValueError(raw)


def parse_value(key: str, raw: str, tp: Any = None) -> Any:
    """Parse one CLI value for `key` according to its type in TrainConfig, or as `tp` for a key
    that is not a training key (then no range check)."""
    if tp is None and key not in FIELDS:
        raise ConfigError(unknown_key_message(key))
    text, quoted = _unquote(raw.strip())
    try:
        value = _parse_as(text, tp or key_type(key), quoted)
    except ValueError:
        raise ConfigError(f"bad value for '{key}': '{raw}' (allowed: {describe_type(tp or key_type(key))})") from None
    return value if tp is not None else check_value(key, value)  # ranges too: a bad value fails before any work


class _Bare(str):
    """The value of a bare --flag: "true", told apart from a typed `key=true` by its type."""


BARE = _Bare("true")


def split_pairs(tokens: Iterable[str]) -> list[tuple[str, str]]:
    """Turn CLI tokens into (key, raw value) pairs: `k=v`, `--k v`, `--k=v`, `--flag` (= true)."""
    pairs: list[tuple[str, str]] = []
    items = list(tokens)
    i = 0
    while i < len(items):
        tok = items[i]
        i += 1
        if tok.startswith("--"):
            body = tok[2:]
            if "=" in body:
                key, raw = body.split("=", 1)
            elif i < len(items) and "=" not in items[i] and not items[i].startswith("--"):
                key, raw = body, items[i]  # the value may start with '-': --epochs -1
                i += 1
            else:
                key, raw = body, BARE  # a bare --flag: true, for a key that takes true
            # `--save-period` means `save_period`; only the key is respelled, never the value
            # (`--data=/a/my-data.yaml`, `--name=my-run`, `--batch=-4` stay as typed).
            key = key.replace("-", "_")
        elif "=" in tok:
            key, raw = tok.split("=", 1)
        else:
            hint = f" (did you mean '{tok}=...'?)" if tok in FIELDS else ""
            raise ConfigError(f"expected key=value, got '{tok}'{hint}")
        key = key.strip()
        if not key:
            raise ConfigError(f"missing key in '{tok}'")
        pairs.append((key, raw))
    return pairs


def parse_overrides(tokens: Iterable[str], allowed: Iterable[str] | None = None,
                    types: dict[str, Any] | None = None) -> dict[str, Any]:
    """Parse CLI tokens into a {key: typed value} dict; duplicates are an error.

    `types` gives the type of allowed keys that are not training keys (predict's `source`)."""
    types = types or {}
    allowed_set = set(allowed) if allowed is not None else set(FIELDS)
    out: dict[str, Any] = {}
    for key, raw in split_pairs(tokens):
        if key not in allowed_set:
            if key in FIELDS:
                raise ConfigError(f"key '{key}' does not apply here (allowed: {', '.join(sorted(allowed_set))})")
            raise ConfigError(unknown_key_message(key, allowed_set))
        if key in out:
            raise ConfigError(f"key '{key}' given twice")
        bare = isinstance(raw, _Bare)
        try:
            value = parse_value(key, raw, None if key in FIELDS else types.get(key))
        except ConfigError:
            if not bare:
                raise
            value = None
        if bare and value is not True:  # `--epochs` alone: say what is missing, not "bad value 'true'"
            raise ConfigError(f"'--{key.replace('_', '-')}' needs a value: {key}=VALUE")
        out[key] = value
    return out
