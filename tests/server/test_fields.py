"""The body-field policy (hypic_rag/server/fields.py) and the server's message preparation."""

from __future__ import annotations

import json

import pytest

from hypic_rag.chat.formats import BUNDLED, QWEN3_JSON
from hypic_rag.server.fields import FieldError, check_fields, structured_alias
from hypic_rag.server.protocol import APIError, engine_messages, parse_request, request_options

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}


def test_fields_are_honoured_refused_accepted_or_ignored():
    own = frozenset({"model", "messages"})
    body = {"model": "m", "messages": [], "temperature": 0, "max_tokens": 3, "user": "u", "store": False}
    assert check_fields({**body, "wibble": 1, "echo": False, "logit_bias": {}}, own) == ["wibble"]
    for name, value in (("logit_bias", {"1": 2}), ("functions", [{}]), ("use_beam_search", True), ("echo", 1)):
        with pytest.raises(FieldError) as caught:
            check_fields({name: value}, own)
        assert caught.value.field == name


def test_vllm_structured_fields_are_response_format():
    as_schema = {"type": "json_schema", "json_schema": {"name": None, "schema": SCHEMA}}
    assert structured_alias({"guided_json": SCHEMA}) == as_schema
    assert structured_alias({"guided_json": json.dumps(SCHEMA)}) == as_schema
    assert structured_alias({"structured_outputs": {"json": SCHEMA}}) == as_schema
    assert structured_alias({"structured_outputs": {"json_object": True}}) == {"type": "json_object"}
    assert structured_alias({"guided_regex": "a+"}) == {"type": "regex", "regex": "a+"}
    assert structured_alias({"guided_choice": ["x"], "response_format": {"type": "text"}})["choice"] == ["x"]
    assert structured_alias({"response_format": {"type": "json_object"}}) is None
    for body, field in (
        ({"structured_outputs": {"grammar": "x"}}, "structured_outputs"),
        ({"structured_outputs": {"json": SCHEMA, "regex": "a"}}, "structured_outputs"),
        ({"guided_json": SCHEMA, "guided_regex": "a"}, "guided_regex"),
        ({"guided_json": SCHEMA, "response_format": {"type": "json_object"}}, "guided_json"),
        ({"guided_json": "{not json"}, "guided_json"),
    ):
        with pytest.raises(FieldError) as caught:
            structured_alias(body)
        assert caught.value.field == field, body
    request = parse_request({"model": "m", "messages": [{"role": "user", "content": "q"}], "guided_json": SCHEMA})
    assert request_options(request, "hypic").response_format["json_schema"]["schema"] == SCHEMA
    with pytest.raises(APIError, match="structured_outputs"):
        request_options(
            parse_request({"model": "m", "messages": [{"role": "user", "content": "q"}], "structured_outputs": 3}),
            "hypic",
        )


def _messages(content, *extra, fmt=QWEN3_JSON):
    return engine_messages(
        parse_request({"model": "m", "messages": [{"role": "user", "content": content}, *extra]}), fmt
    )


def test_text_parts_are_joined_with_newlines_as_vllm_joins_them():
    parts = [{"type": "text", "text": "Ana Lee is an engineer."}, {"type": "text", "text": "Bo Ek lives in Rome."}]
    (message,) = _messages(parts)
    assert "".join(p["text"] for p in message["content"]) == "Ana Lee is an engineer.\nBo Ek lives in Rome."
    doc = {"type": "text", "text": "Doc.", "hypic": {"kind": "document"}}
    (message,) = _messages([doc, {"type": "text", "text": "Q?"}, doc])
    texts = [p["text"] for p in message["content"]]
    assert texts == ["Doc.", "\nQ?\n", "Doc."]  # a document's own text never changes with its neighbours


def test_tool_results_are_normalised_as_chat_hypic_normalises_them():
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"b": 1, "a": 2}'}}
    spaced = json.dumps({"name": "Bo Ek", "city": "Kothvenville"})
    history = [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": spaced},
    ]
    messages = _messages("Where is Bo?", *history, fmt=BUNDLED)
    assert messages[-1]["content"] == '{"city":"Kothvenville","name":"Bo Ek"}'
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    from hypic_rag.integrations.langchain import to_chat_messages

    theirs = to_chat_messages(
        [
            HumanMessage("Where is Bo?"),
            AIMessage("", tool_calls=[{"name": "f", "args": {"b": 1, "a": 2}, "id": "c1"}]),
            ToolMessage(spaced, tool_call_id="c1"),
        ],
        chat_format=BUNDLED,
    )
    assert messages[-1]["content"] == theirs[-1]["content"]
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == theirs[1]["tool_calls"][0]["function"]["arguments"]
    # LlamaIndex's FunctionTool sends a returned dict as a Python literal: the same text reaches the model
    literal = str({"name": "Bo Ek", "city": "Kothvenville"})
    history[-1] = {**history[-1], "content": literal}
    assert _messages("Where is Bo?", *history, fmt=BUNDLED)[-1]["content"] == messages[-1]["content"]


def test_the_ignored_fields_header_value_is_printable_ascii_and_bounded():
    from hypic_rag.server.fields import IGNORED_HEADER_CHARS, ignored_header_value

    assert ignored_header_value(["a", "b c"]) == "a, b c"
    assert ignored_header_value(["x\ny", "é"]) == "x%0Ay, %C3%A9"
    names = [f"n{i:03d}" for i in range(400)]
    value = ignored_header_value(names)
    assert len(value) <= IGNORED_HEADER_CHARS and value.startswith("n000, n001") and value.endswith(" more)")
    kept = value.split(", ")[:-1]
    assert kept == names[: len(kept)] and value.endswith(f"... ({400 - len(kept)} more)")
    assert ignored_header_value(["z" * 5000]) == "... (1 more)"
