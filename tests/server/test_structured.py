"""Answers that parse, over HTTP with the openai client on the bundled model: JSON schemas, forced and named tool
calls, no call to a tool that was not offered, vLLM's structured-output fields, log-probabilities, penalties."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import openai
import pytest

from hypic_rag.eval.data import make

from .conftest import MODEL

# Questions that name their arguments ("Find the Temme kettle in the catalogue."): what the bundled model was trained
# to extract. On questions about documents it writes a runaway string in about 1 answer of 20 (measured 39 of 41),
# which no grammar can end for it.
EXAMPLES = [x for x in make("tool_call", 80, 7) if not any(p.get("hypic") for p in x.messages[-1]["content"])][:20]


def _each(ask, examples) -> list:
    """``ask(example)`` for every example, eight at a time: the server decodes them together, each answer the one
    it gets alone."""
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(ask, examples))


def _expected_tool(example) -> dict:
    name = json.loads(example.answers[0])["name"]
    return next(t for t in example.tools if t["function"]["name"] == name)


def test_json_schema_answers_validate_twenty_of_twenty(client):
    def ask(example) -> None:
        function = _expected_tool(example)["function"]
        schema = {**function["parameters"], "additionalProperties": False}
        out = client.chat.completions.create(
            model=MODEL,
            messages=example.messages,
            max_tokens=48,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": function["name"], "schema": schema, "strict": True},
            },
        )
        jsonschema.validate(json.loads(out.choices[0].message.content), schema)
        assert out.choices[0].finish_reason == "stop" and not out.choices[0].message.tool_calls

    _each(ask, EXAMPLES)


PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"}},
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}


def _one_document(example) -> list[dict]:
    """A question about one person, with the document about them as a cached segment (the composed modes' case)."""
    *docs, question = example.messages[0]["content"]
    asked = r"^(Where does|How old is|Which company does|What is the job of) |( live| work for)?\?$"
    name = re.sub(asked, "", question["text"])
    doc = next(d for d in docs if name in d["text"])
    return [{"role": "user", "content": [doc, question]}]


def test_json_schema_answers_over_documents_validate_ten_of_ten_in_the_default_mode(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "Person", "schema": PERSON, "strict": True}}
    examples = make("single_doc", 10, 11)
    for example in examples:
        out = client.chat.completions.create(
            model=MODEL, messages=_one_document(example), max_tokens=60, response_format=fmt
        )
        jsonschema.validate(json.loads(out.choices[0].message.content), PERSON)
        assert out.choices[0].finish_reason == "stop"
    for example in examples[:3]:  # streamed, and through vLLM's alias
        ask = {"model": MODEL, "messages": _one_document(example), "max_tokens": 60}
        chunks = list(client.chat.completions.create(**ask, response_format=fmt, stream=True))
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        jsonschema.validate(json.loads(streamed), PERSON)
        assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
        out = client.chat.completions.create(**ask, extra_body={"guided_json": PERSON})
        jsonschema.validate(json.loads(out.choices[0].message.content), PERSON)


def test_named_and_required_tool_calls_are_valid_twenty_of_twenty(client):
    def ask(example) -> None:
        schemas = {t["function"]["name"]: t["function"]["parameters"] for t in example.tools}
        named = _expected_tool(example)["function"]["name"]
        for choice, allowed in (
            ({"type": "function", "function": {"name": named}}, {named}),
            ("required", set(schemas)),
        ):
            out = client.chat.completions.create(
                model=MODEL, messages=example.messages, tools=example.tools, tool_choice=choice, max_tokens=48
            )
            calls = out.choices[0].message.tool_calls
            assert calls and out.choices[0].finish_reason == "tool_calls"
            for call in calls:
                assert call.function.name in allowed
                jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])

    _each(ask, EXAMPLES)


def test_no_call_to_a_tool_that_was_not_offered_in_fifty_prompts(client):
    def calls(example) -> int:
        expected = _expected_tool(example)["function"]["name"]
        offered = [t for t in example.tools if t["function"]["name"] != expected]  # the one it wants is missing
        out = client.chat.completions.create(model=MODEL, messages=example.messages, tools=offered, max_tokens=24)
        names = {t["function"]["name"] for t in offered}
        made = out.choices[0].message.tool_calls or ()
        assert all(call.function.name in names for call in made)
        return len(made)

    assert sum(_each(calls, make("tool_call", 50, 11)))  # it did call, only never what was not there


@pytest.mark.fleet
def test_json_object_and_vllm_aliases(server, client):
    ask = EXAMPLES[0].messages
    out = client.chat.completions.create(
        model=MODEL, messages=ask, max_tokens=32, response_format={"type": "json_object"}
    )
    assert isinstance(json.loads(out.choices[0].message.content), dict)
    schema = {"type": "object", "properties": {"product": {"type": "string"}}, "required": ["product"]}
    for extra in (
        {"guided_json": schema},
        {"structured_outputs": {"json": schema}},
        {"guided_json": json.dumps(schema)},
    ):
        out = client.chat.completions.create(model=MODEL, messages=ask, max_tokens=32, extra_body=extra)
        jsonschema.validate(json.loads(out.choices[0].message.content), schema)
    out = client.chat.completions.create(
        model=MODEL, messages=ask, max_tokens=8, extra_body={"structured_outputs": {"choice": ["yes", "no"]}}
    )
    assert out.choices[0].message.content in ("yes", "no")
    for extra, field in (
        ({"structured_outputs": {"grammar": "root ::= 'a'"}}, "structured_outputs"),
        ({"guided_grammar": "root ::= 'a'"}, "guided_grammar"),
        ({"guided_json": schema, "response_format": {"type": "json_object"}}, "guided_json"),
        ({"functions": [{"name": "f", "parameters": {}}]}, "functions"),
        ({"logit_bias": {"5": 10}}, "logit_bias"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"schema": {"type": "object", "minProperties": "x"}},
                }
            },
            "response_format",
        ),
    ):
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model=MODEL, messages=ask, max_tokens=8, extra_body=extra)
        assert caught.value.body["param"] == field, extra


@pytest.mark.fleet
def test_unknown_fields_are_ignored_and_named_known_neutral_ones_accepted(server):
    body = {"model": MODEL, "messages": EXAMPLES[0].messages, "max_tokens": 4}
    response = httpx.post(server + "/v1/chat/completions", json={**body, "frobnicate": 1, "zeta": None, "user": "u"})
    assert response.status_code == 200
    assert response.headers["x-hypic-ignored-fields"] == "frobnicate, zeta"
    assert response.json()["hypic"]["ignored_fields"] == ["frobnicate", "zeta"]
    neutral = {"logit_bias": {}, "functions": [], "echo": False, "min_tokens": 0, "metadata": {"a": "b"}}
    response = httpx.post(server + "/v1/chat/completions", json={**body, **neutral})
    assert response.status_code == 200 and "x-hypic-ignored-fields" not in response.headers


@pytest.mark.fleet
def test_logprobs_plain_and_streamed(client):
    ask = EXAMPLES[1].messages
    out = client.chat.completions.create(model=MODEL, messages=ask, max_tokens=6, logprobs=True, top_logprobs=2)
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens
    assert all(t.logprob <= 0 and len(t.top_logprobs) == 2 and t.top_logprobs[0].token == t.token for t in content)
    assert "".join(bytes(t.bytes).decode() for t in content) == out.choices[0].message.content
    stream = client.chat.completions.create(model=MODEL, messages=ask, max_tokens=6, logprobs=True, stream=True)
    chunks = [c for c in stream if c.choices and c.choices[0].logprobs]
    assert [t.token for t in chunks[-1].choices[0].logprobs.content] == [t.token for t in content]
    with pytest.raises(openai.BadRequestError, match="needs logprobs"):
        client.chat.completions.create(model=MODEL, messages=ask, max_tokens=2, top_logprobs=2)


@pytest.mark.fleet
def test_penalties_and_min_p_are_options(client):
    ask = EXAMPLES[2].messages
    plain = client.chat.completions.create(model=MODEL, messages=ask, max_tokens=12)
    penalised = client.chat.completions.create(
        model=MODEL, messages=ask, max_tokens=12, frequency_penalty=2.0, extra_body={"repetition_penalty": 3.0}
    )
    assert penalised.choices[0].message.content != plain.choices[0].message.content
    client.chat.completions.create(
        model=MODEL, messages=ask, max_tokens=2, presence_penalty=1.0, extra_body={"min_p": 0.1}
    )
    for bad in ({"presence_penalty": 3}, {"extra_body": {"repetition_penalty": 0}}, {"extra_body": {"min_p": 2}}):
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model=MODEL, messages=ask, max_tokens=2, **bad)


@pytest.mark.fleet
def test_parallel_tool_calls_false_is_one_call(client):
    example = EXAMPLES[3]
    out = client.chat.completions.create(
        model=MODEL,
        messages=example.messages,
        tools=example.tools,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=48,
    )
    assert len(out.choices[0].message.tool_calls) == 1


def test_a_schema_the_grammar_cannot_hold_is_a_400_in_the_requests_terms(client):
    schema = {
        "type": "object",
        "properties": {"v": {"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 3}]}},
    }
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Where does Ana Lee live?"}],
            tools=[{"type": "function", "function": {"name": "f", "parameters": schema}}],
        )
    error = refused.value.body
    assert error["param"] == "tools.0.function.parameters" and "coerce_one_of" not in error["message"]
    assert "oneOf (at tools.0.function.parameters.properties.v.oneOf)" in error["message"]
    assert "write anyOf instead" in error["message"]
