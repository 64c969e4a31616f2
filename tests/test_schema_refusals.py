"""A schema the grammar cannot hold is refused in the request's terms (hypic_rag.schema_refusals): the keyword, where
it sits in the request, and what to write instead; never llguidance's options, which a client cannot set."""

from __future__ import annotations

import pytest

from hypic_rag import Engine
from hypic_rag.schema_refusals import explain

ASK = [{"role": "user", "content": "Where does Ana Lee live?"}]
OVERLAPPING = {"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 3}]}
CASES = [  # (a property's schema, what the refusal must say)
    (OVERLAPPING, "oneOf (at {at}.properties.v.oneOf) has alternatives that one value could match at once"),
    (
        {"type": "array", "uniqueItems": True},
        "does not support the keyword uniqueItems (at {at}.properties.v.uniqueItems)",
    ),
    (
        {"$ref": "http://example.com/v.json"},
        "$ref 'http://example.com/v.json' (at {at}.properties.v.$ref) points outside",
    ),
    ({"type": "string", "format": "hostname-x"}, "format 'hostname-x' (at {at}.properties.v.format) is not one"),
]


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine.from_pretrained()  # the bundled model: its grammar tokenizer is what compiles the schemas


def _object(value: dict) -> dict:
    return {"type": "object", "properties": {"v": value}, "required": ["v"]}


@pytest.mark.parametrize(("value", "said"), CASES)
def test_a_refused_schema_names_its_keyword_where_the_request_holds_it(engine, value, said):
    as_response = {"type": "json_schema", "json_schema": {"name": "r", "schema": _object(value)}}
    with pytest.raises(ValueError) as refused:
        engine.prepare_chat(ASK, response_format=as_response)
    message = str(refused.value)
    assert message.startswith("response_format: the grammar cannot hold it: ")
    assert said.format(at="response_format.json_schema.schema") in message and "coerce_one_of" not in message
    tool = {"type": "function", "function": {"name": "f", "parameters": _object(value)}}
    with pytest.raises(ValueError) as refused:
        engine.prepare_chat(ASK, tools=[{"type": "function", "function": {"name": "g"}}, tool])
    assert said.format(at="tools.1.function.parameters") in str(refused.value)


def test_exclusive_alternatives_are_held_and_property_names_are_not_keywords(engine):
    exclusive = {
        "type": "json_schema",
        "json_schema": {"name": "r", "schema": _object({"oneOf": [{"const": "a"}, {"const": "b"}]})},
    }
    engine.prepare_chat(ASK, response_format=exclusive)  # no refusal
    schema = {"type": "object", "properties": {"if": {"type": "string"}, "v": {"if": {"type": "string"}}}}
    said = explain('Unimplemented keys: ["if"]', schema, "response_format.json_schema.schema")
    assert "(at response_format.json_schema.schema.properties.v.if)" in said
    data = {"type": "object", "default": {"oneOf": 1}, "properties": {"v": OVERLAPPING}}  # a value, not a keyword
    said = explain("oneOf constraints are not supported", data, "tools.0.function.parameters")
    assert "(at tools.0.function.parameters.properties.v.oneOf)" in said


def test_a_message_it_does_not_know_is_passed_on_as_it_is():
    assert explain("something new", {"type": "object"}, "tools.0.function.parameters") == "something new"
