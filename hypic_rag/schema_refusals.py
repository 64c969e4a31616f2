"""A grammar compiler's refusal of a JSON schema, said in the request's terms: which keyword, where in the
request, and what to write instead. llguidance's own words name its options (``coerce_one_of``, ``lenient``),
which a client cannot set, and no path; a client can act on a field name and a keyword to change.

Written here because the mapping is from llguidance's messages to our request's fields, which no library knows.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

_UNIMPLEMENTED = re.compile(r"Unimplemented keys: \[([^\]]*)\]")
_REMOTE_REF = re.compile(r"Resource '([^']*)' is not present in a registry")
_UNKNOWN_FORMAT = re.compile(r"Unknown format: (\S+)")
_ONE_OF = ("coerce_one_of", "oneOf constraints are not supported")
MOST_PATHS = 3  # places named in one message
MOST_NODES = 10_000  # of a schema walked for them (``json_schema.check_schema`` bounds a schema before this)


# keywords whose object's keys are names (of properties, of definitions), not keywords
_NAMING = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
# keywords whose values are data, not schemas: a keyword's name inside them is a value
_DATA = frozenset({"enum", "const", "default", "examples"})


def _places(schema: Any, keys: set[str], at: str) -> Iterator[str]:
    """Dotted paths, under ``at``, of each of ``keys`` where a schema object holds it as a keyword (a property
    named ``if`` is not the keyword), in document order."""
    stack: list[tuple[Any, str, bool]] = [(schema, at, False)]
    seen = 0
    while stack and seen < MOST_NODES:
        node, path, names = stack.pop()
        seen += 1
        if isinstance(node, dict):
            if not names:
                yield from (f"{path}.{key}" for key in node if key in keys)
            items = [(k, v) for k, v in reversed(list(node.items())) if names or k not in _DATA]
            stack.extend((value, f"{path}.{key}", not names and key in _NAMING) for key, value in items)
        elif isinstance(node, list):
            stack.extend((value, f"{path}.{i}", False) for i, value in reversed(list(enumerate(node))))


def _where(schema: Any, keys: set[str], at: str) -> str:
    found = []
    for path in _places(schema, keys, at):
        found.append(path)
        if len(found) == MOST_PATHS:
            break
    return f" (at {', '.join(found)})" if found else ""


def explain(message: str, schema: Any, at: str) -> str:
    """The compiler's ``message`` on ``schema`` (found at request field ``at``), rewritten where we know it; else
    the message as it is."""
    if any(sign in message for sign in _ONE_OF):
        return (
            f"oneOf{_where(schema, {'oneOf'}, at)} has alternatives that one value could match at once, which the "
            "grammar cannot rule out: write anyOf instead, or make the alternatives exclusive (a different type, "
            "const or enum in each)"
        )
    if match := _UNIMPLEMENTED.search(message):
        keys = [k.strip().strip('"') for k in match.group(1).split(",") if k.strip()]
        return (
            f"the grammar does not support the keyword{'s' if len(keys) > 1 else ''} {', '.join(keys)}"
            f"{_where(schema, set(keys), at)}: remove {'them' if len(keys) > 1 else 'it'} (the answer is then held "
            "to the rest of the schema) or say the same with type, properties, required, enum, const, anyOf or "
            "pattern"
        )
    if match := _REMOTE_REF.search(message):
        return (
            f"$ref {match.group(1)!r}{_where(schema, {'$ref'}, at)} points outside the schema, and only references "
            "inside it are followed: copy the definition into $defs and refer to it as #/$defs/NAME"
        )
    if match := _UNKNOWN_FORMAT.search(message):
        return (
            f"format {match.group(1)!r}{_where(schema, {'format'}, at)} is not one the grammar knows: remove it, "
            "write a pattern instead, or use a standard format (date-time, date, time, email, uuid, ...)"
        )
    return message
