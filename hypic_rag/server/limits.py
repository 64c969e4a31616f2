"""What a request body may be before the wire models see it, and what every answer must be: JSON.

Python's ``json`` and pydantic recurse once per level of nesting, so a body nested 100,000 deep ends in a
``RecursionError``; the depth is checked first, on the bytes, with string contents skipped. ``json`` also reads
``NaN``, ``Infinity`` and ``1e999`` as floats that no JSON encoder may write back, so a request carrying one
would run and then fail to be answered: each is refused with the path of the field that holds it. On the way
out, ``finite`` turns any non-finite float into ``null``.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

MAX_DEPTH = 64  # levels of arrays and objects: a deep tool schema needs about 20
BODY_TIMEOUT_S = 30.0  # for the whole body to arrive once its headers have

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_PAIR = b"()"


class BadBody(ValueError):
    """A body refused before parsing: ``param`` names the field, when there is one."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class _NonFinite:
    def __init__(self, text: str) -> None:
        self.text = text


def nested_deeper_than(body: bytes, limit: int) -> bool:
    """Whether the JSON text ``body`` nests arrays and objects more than ``limit`` deep. Each pass removes
    the innermost pairs of brackets, so the nesting is over ``limit`` when pairs remain after ``limit`` passes."""
    skeleton = _STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    skeleton = skeleton.translate(bytes.maketrans(b"[{]}", b"(())"))
    for _ in range(limit):
        shorter = skeleton.replace(_PAIR, b"")
        if shorter == skeleton:
            return False
        skeleton = shorter
    return _PAIR in skeleton


def loads(body: bytes, max_depth: int = MAX_DEPTH) -> Any:
    """The body parsed; ``BadBody`` when it is not JSON, nests deeper than ``max_depth``, or holds a number
    that is not finite."""
    if nested_deeper_than(body, max_depth):
        raise BadBody(f"the request body is nested more than {max_depth} levels deep")
    found: list[_NonFinite] = []

    def non_finite(text: str) -> Any:
        found.append(_NonFinite(text))
        return found[-1]

    def number(text: str) -> Any:
        value = float(text)
        return value if math.isfinite(value) else non_finite(text)

    try:
        data = json.loads(body, parse_constant=non_finite, parse_float=number)
    except RecursionError:  # unbalanced brackets the depth check cannot pair up
        raise BadBody(f"the request body is nested more than {max_depth} levels deep") from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError, or an integer of too many digits
        raise BadBody(f"the request body is not valid JSON: {exc}") from None
    if found:
        path, value = _first_non_finite(data)
        raise BadBody(f"{path}: {value.text} is not a finite number", param=path)
    return data


def _first_non_finite(data: Any) -> tuple[str, _NonFinite]:
    stack: list[tuple[tuple[str, ...], Any]] = [((), data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, _NonFinite):
            return ".".join(path) or "(body)", value
        if isinstance(value, dict):
            stack.extend((path + (str(k),), v) for k, v in reversed(list(value.items())))
        elif isinstance(value, list):
            stack.extend((path + (str(i),), v) for i, v in reversed(list(enumerate(value))))
    raise AssertionError("a non-finite number was read but not found")


def finite(data: Any) -> Any:
    """``data`` with each NaN or infinite float replaced by None: what a JSON encoder can write."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: finite(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [finite(v) for v in data]
    return data
