"""Arguments that may be any iterable (a list, a tuple, a generator): read once into a list, so that a check
does not consume a generator the work then finds empty; anything else is a ValueError naming the argument."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def as_list(value: Any, name: str, of: str, single: type | tuple[type, ...] = ()) -> list:
    """``value`` as a list, read once. A string, bytes, a mapping, an instance of ``single`` (one item where a
    list of them is meant) or a value that is not iterable is a ValueError: ``{name} must be a list of {of}``."""
    if isinstance(value, (str, bytes, Mapping, *_tuple(single))) or not isinstance(value, Iterable):
        raise ValueError(f"{name} must be a list of {of}, got {type(value).__name__}")
    return list(value)


def _tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)
