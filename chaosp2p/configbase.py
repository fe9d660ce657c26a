"""Shared machinery for the frozen config dataclasses.

Every component has one frozen dataclass with units in its field names, validated in
``__post_init__``, and ``local()``/``lan()``/``wan()`` profiles. :func:`from_table` builds one from a
TOML table so that ``peers/*.toml`` can override any field by name; an unknown key or a value of the
wrong type is a :class:`ConfigError` naming the file section and key, never a silent default.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from chaosp2p.errors import ConfigError

C = TypeVar("C")


def require(condition: bool, message: str) -> None:
    """Raise :class:`ConfigError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise ConfigError(message)


def require_positive(owner: object, *names: str) -> None:
    """Every named numeric field of ``owner`` must be > 0."""
    for name in names:
        value = getattr(owner, name)
        require(value > 0, f"{type(owner).__name__}.{name} must be > 0 (got {value!r})")


def require_non_negative(owner: object, *names: str) -> None:
    """Every named numeric field of ``owner`` must be >= 0."""
    for name in names:
        value = getattr(owner, name)
        require(value >= 0, f"{type(owner).__name__}.{name} must be >= 0 (got {value!r})")


def from_table(base: C, table: Mapping[str, Any], *, section: str) -> C:
    """A copy of the frozen dataclass ``base`` with the fields in ``table`` replaced.

    Values are type-checked against the field annotations (ints are accepted for float fields,
    lists for tuple fields); ``__post_init__`` then validates the result.
    """
    if not dataclasses.is_dataclass(base) or isinstance(base, type):
        raise TypeError("base must be a dataclass instance")
    hints = typing.get_type_hints(type(base))
    known = {f.name for f in dataclasses.fields(base)}
    changes: dict[str, Any] = {}
    for key, value in table.items():
        if key not in known:
            raise ConfigError(f"[{section}] has no setting {key!r} (known: {', '.join(sorted(known))})")
        changes[key] = _coerce(value, hints[key], f"[{section}].{key}")
    return dataclasses.replace(base, **changes)


def _coerce(value: Any, hint: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0], where)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where} must be a list")
        element = args[0] if args else Any
        return tuple(_coerce(v, element, where) for v in value)
    if hint is float:
        if type(value) not in (int, float):
            raise ConfigError(f"{where} must be a number (got {value!r})")
        return float(value)
    if hint is int or hint is bool or hint is str:
        if type(value) is not hint:
            raise ConfigError(f"{where} must be a {hint.__name__} (got {value!r})")
        return value
    return value
