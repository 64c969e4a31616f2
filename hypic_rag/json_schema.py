"""JSON schemas as the output grammar takes them: bounded, checked, and rewritten in one walk each.

A schema arrives from a request (``response_format``, a tool's ``parameters``), so every pass over it is linear
in its size and refuses one past ``MAX_SCHEMA_NODES`` before any grammar is built. The rewrite knows which keywords
hold subschemas (``properties`` maps names to schemas, ``enum`` holds values), so a value is never read as a
schema.

Objects that list ``properties`` are closed to them (``additionalProperties: false``) whatever the schema says, as
xgrammar's strict mode closes them: a model that does not know what to write otherwise fills an open object with
invented keys until ``max_tokens``, and an answer holding only listed keys still validates against the schema as
given. An object that lists none stays open. An integer without bounds is held to JSON's safe range
(``SAFE_INTEGER``: what a JavaScript client reads exactly), so its digits cannot run on to ``max_tokens`` either.
Branches of an ``allOf`` are left open, as closing each would refuse the keys the others list. A ``oneOf`` of
distinct constants is written as the ``anyOf`` it equals, which the compiler reads (it refuses ``oneOf``, whose
branches it cannot keep apart in general). Written by hand: no schema library rewrites a schema for a grammar
compiler.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

SAFE_INTEGER = 2**53 - 1
MAX_SCHEMA_NODES = 10_000  # values in one schema (keys, items, leaves): far past any real tool's

_SCHEMA = ("additionalProperties", "items", "contains", "not", "if", "then", "else", "propertyNames")
_SCHEMA += ("unevaluatedProperties", "unevaluatedItems", "additionalItems")
_SCHEMA_LIST = ("anyOf", "oneOf", "prefixItems", "items")
_SCHEMA_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_DEFS = ("$defs", "definitions")


def count_nodes(value: Any, limit: int = MAX_SCHEMA_NODES) -> int:
    """The values in ``value`` (a JSON document), counting stopped just past ``limit``."""
    stack, seen = [value], 0
    while stack and seen <= limit:
        item = stack.pop()
        seen += 1
        if isinstance(item, Mapping):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return seen


def check_schema(schema: Any, where: str) -> dict[str, Any]:
    """``schema`` as an object schema the grammar can take: ``true`` is ``{}`` (any value), ``false`` (no value)
    and anything but an object a ``ValueError`` naming ``where``, as is one of more than ``MAX_SCHEMA_NODES``."""
    if schema is True:
        return {}
    if schema is False:
        raise ValueError(f"{where}: the schema false admits no value")
    if not isinstance(schema, Mapping):
        raise ValueError(f"{where} must be a JSON schema (an object), got {type(schema).__name__}")
    if count_nodes(schema) > MAX_SCHEMA_NODES:
        raise ValueError(f"{where}: the schema has more than {MAX_SCHEMA_NODES} values; the limit keeps grammars small")
    return dict(schema)


def for_grammar(schema: Any, *, sort_keys: bool = False, closed: bool = True) -> Any:
    """``schema`` rewritten for the grammar compiler (see the module docstring): objects listing properties
    closed to them, a required key the properties do not list added as any value, and with ``sort_keys`` each
    ``properties`` in key order (the bundled model writes JSON with sorted keys, and the grammar writes an
    object's properties in the order its schema lists them). One visit per subschema."""
    if not isinstance(schema, Mapping):
        return schema  # true, false, or a value where a schema was expected: the compiler judges it
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _SCHEMA_MAP and isinstance(value, Mapping):
            names = sorted(value) if sort_keys and key == "properties" else list(value)
            out[key] = {n: for_grammar(value[n], sort_keys=sort_keys) for n in names}
        elif key == "oneOf" and "anyOf" not in schema and _distinct_constants(value):  # the compiler reads anyOf
            out["anyOf"] = [for_grammar(v, sort_keys=sort_keys) for v in value]
        elif key in _SCHEMA_LIST and isinstance(value, list):
            out[key] = [for_grammar(v, sort_keys=sort_keys) for v in value]
        elif key == "allOf" and isinstance(value, list):
            out[key] = [for_grammar(v, sort_keys=sort_keys, closed=False) for v in value]
        elif key in _SCHEMA:
            out[key] = for_grammar(value, sort_keys=sort_keys)
        else:
            out[key] = value
    kind = out.get("type")
    bounds = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
    if (kind == "integer" or (isinstance(kind, list) and "integer" in kind)) and not any(b in out for b in bounds):
        out["minimum"], out["maximum"] = -SAFE_INTEGER, SAFE_INTEGER
    props = out.get("properties")
    if closed and isinstance(props, Mapping):
        required = out.get("required")
        missing = [k for k in required if isinstance(k, str) and k not in props] if isinstance(required, list) else []
        if missing:
            listed = {**props, **{k: {} for k in missing}}
            out["properties"] = {k: listed[k] for k in sorted(listed)} if sort_keys else listed
        out["additionalProperties"] = False
    return out


def allowed_keys(schema: Any) -> frozenset[str] | None:
    """The keys an object under ``schema`` may hold once ``for_grammar`` has closed it (its properties and required
    keys), or None where any key may come: no properties listed, or branches and patterns that may allow others."""
    if not isinstance(schema, Mapping) or not isinstance(schema.get("properties"), Mapping):
        return None
    if any(key in schema for key in ("anyOf", "oneOf", "allOf", "$ref", "patternProperties")):
        return None
    required = schema.get("required")
    listed = {key for key in required if isinstance(key, str)} if isinstance(required, list) else set()
    return frozenset(schema["properties"]) | listed


def _distinct_constants(branches: Any) -> bool:
    """Whether ``branches`` (a ``oneOf``) are each one constant, no two alike: no value matches two of them,
    so the ``anyOf`` of them is the same schema."""
    if not isinstance(branches, list) or not branches:
        return False
    values = []
    for branch in branches:
        if not isinstance(branch, Mapping) or not ("const" in branch or _one_enum(branch)):
            return False
        values.append(json.dumps(branch["const"] if "const" in branch else branch["enum"][0], sort_keys=True))
    return len(set(values)) == len(values)


def _one_enum(branch: Mapping[str, Any]) -> bool:
    return isinstance(branch.get("enum"), list) and len(branch["enum"]) == 1


def is_object_schema(schema: Mapping[str, Any]) -> bool:
    """Whether every value ``schema`` admits is an object, as far as its own keywords say (no ``$ref`` or
    combinator followed): what may stand as a call's arguments."""
    kind = schema.get("type")
    if any(k in schema for k in ("enum", "const", "anyOf", "oneOf", "allOf", "$ref", "not", "if")):
        return False
    return kind == "object" or (kind is None and ("properties" in schema or "required" in schema))


def wrapped(schema: Mapping[str, Any], key: str) -> dict[str, Any]:
    """An object schema whose one required property ``key`` holds a value of ``schema``: a root that is not an
    object, as a call's arguments. Its definitions move to the new root, where its ``$ref``s look for them."""
    inner = {k: v for k, v in schema.items() if k not in _DEFS}
    out: dict[str, Any] = {"type": "object", "properties": {key: inner}, "required": [key]}
    out.update({k: schema[k] for k in _DEFS if k in schema})
    return out
