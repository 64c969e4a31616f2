"""Schemas as the grammar takes them: one linear walk, objects closed to their listed properties, values never
read as schemas, and the bounds a request's schema is held to before any grammar is built."""

from __future__ import annotations

import pytest

from hypic_rag.json_schema import (
    MAX_SCHEMA_NODES,
    SAFE_INTEGER,
    check_schema,
    count_nodes,
    for_grammar,
    is_object_schema,
    wrapped,
)


def _nested(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"b": schema, "a": {"type": "integer"}}, "required": ["b"]}
    return schema


def test_a_deep_schema_is_rewritten_in_one_visit_per_subschema():
    out = for_grammar(_nested(60), sort_keys=True)  # 2^60 visits, were each level walked twice
    node, depth = out, 0
    while node.get("type") == "object":
        assert list(node["properties"]) == ["a", "b"] and node["additionalProperties"] is False
        node, depth = node["properties"]["b"], depth + 1
    assert depth == 60


def test_objects_listing_properties_are_closed_whatever_they_say():
    schema = {
        "type": "object",
        "properties": {"x": {"type": "object", "properties": {"y": {}}, "additionalProperties": True}},
        "required": ["x", "z"],
    }
    out = for_grammar(schema)
    assert out["additionalProperties"] is False and out["properties"]["x"]["additionalProperties"] is False
    assert out["properties"]["z"] == {}  # a required key the properties do not list stays writable
    assert for_grammar({"type": "object"}) == {"type": "object"}  # nothing listed: open
    branches = for_grammar({"allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]})["allOf"]
    assert all("additionalProperties" not in b for b in branches)  # closing each would refuse the other's key


def test_values_are_never_read_as_schemas():
    value = {"properties": {"b": 1, "a": 2}}
    out = for_grammar(
        {"enum": [value], "const": value, "default": value, "properties": {"properties": {"type": "string"}}},
        sort_keys=True,
    )
    assert out["enum"] == [value] and out["const"] == value and out["default"] == value
    assert list(out["enum"][0]["properties"]) == ["b", "a"]
    assert out["properties"] == {"properties": {"type": "string"}} and out["additionalProperties"] is False


def test_unbounded_integers_are_held_to_the_safe_range():
    assert for_grammar({"type": "integer"}) == {"type": "integer", "minimum": -SAFE_INTEGER, "maximum": SAFE_INTEGER}
    assert for_grammar({"type": "integer", "maximum": 5}) == {"type": "integer", "maximum": 5}
    assert for_grammar({"type": "number"}) == {"type": "number"}


def test_check_schema_reads_true_refuses_false_and_bounds_the_size():
    assert check_schema(True, "s") == {}
    with pytest.raises(ValueError, match="s: the schema false admits no value"):
        check_schema(False, "s")
    with pytest.raises(ValueError, match="s must be a JSON schema"):
        check_schema("notadict", "s")
    with pytest.raises(ValueError, match=f"more than {MAX_SCHEMA_NODES} values"):
        check_schema({"enum": list(range(200_000))}, "s")
    assert count_nodes({"enum": list(range(200_000))}) == MAX_SCHEMA_NODES + 1  # the count stops past the limit


def test_roots_that_are_not_objects_are_wrapped_with_their_definitions():
    assert is_object_schema({"type": "object"}) and is_object_schema({"properties": {}})
    for root in ({"type": "integer"}, {"enum": ["a"]}, {"oneOf": [{"const": 1}]}, {"$ref": "#/$defs/x"}, {}):
        assert not is_object_schema(root)
    out = wrapped({"$ref": "#/$defs/x", "$defs": {"x": {"type": "string"}}}, "value")
    assert out == {
        "type": "object",
        "properties": {"value": {"$ref": "#/$defs/x"}},
        "required": ["value"],
        "$defs": {"x": {"type": "string"}},
    }


def test_a_one_of_of_distinct_constants_is_the_any_of_it_equals():
    consts = [{"const": "a"}, {"const": 1}, {"enum": [None]}]
    assert for_grammar({"oneOf": consts}) == {"anyOf": consts}
    overlapping = [{"const": "a"}, {"enum": ["a"]}]  # "a" matches both: not a valid oneOf value, kept as asked
    assert for_grammar({"oneOf": overlapping}) == {"oneOf": overlapping}
    assert for_grammar({"oneOf": [{"type": "integer"}]}) == {"oneOf": [for_grammar({"type": "integer"})]}
    both = {"anyOf": [{"type": "string"}], "oneOf": [{"const": 1}, {"const": 2}]}
    assert for_grammar(both)["anyOf"] == [{"type": "string"}]  # a schema's own anyOf is never overwritten
