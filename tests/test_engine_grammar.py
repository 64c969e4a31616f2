"""Constrained decoding through the engine: tool calls and response formats on the bundled model and on random
weights, where the grammar alone must make the output valid."""

from __future__ import annotations

import json
import shutil

import jsonschema
import pytest

from hypic_rag import Engine, Segment
from hypic_rag.eval.data import make
from hypic_rag.testing.synthetic import add_chat_files

from .chat.conftest import TEMPLATES

BOUNDED = {  # every valid instance is short, so a random model finishes it within a small budget
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 8},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "unit": {"type": "string", "enum": ["c", "f"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": BOUNDED}},
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "parameters": {
                "type": "object",
                "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 99}},
                "required": ["ok"],
                "additionalProperties": False,
            },
        },
    },
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Lima?"}]


@pytest.fixture(scope="module")
def bundled() -> Engine:
    return Engine.from_pretrained()


@pytest.fixture(scope="module", params=["qwen3", "qwen3_5"])
def random_chat(request, checkpoint, tmp_path_factory) -> Engine:
    """Random weights behind a Qwen3 (JSON calls) or Qwen3.5 (XML calls) template, with room for its long
    tool prompt."""
    path = tmp_path_factory.mktemp(request.param) / "model"
    shutil.copytree(checkpoint("qwen3_5_text"), path)
    add_chat_files(path, (TEMPLATES / f"{request.param}.jinja").read_text())
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 8192}))
    return Engine.from_pretrained(path)


def _valid_calls(out, offered: set[str]) -> bool:
    for call in out.tool_calls:
        assert call["name"] in offered, call
        jsonschema.validate(call["arguments"], SCHEMAS[call["name"]])
    return bool(out.tool_calls)


def test_random_weights_call_only_offered_tools_with_valid_arguments(random_chat):
    for seed in range(3):
        # one call each (a random model given parallel calls goes on calling); a 320-token vocabulary spells tags out
        sampled = {"temperature": 1.0, "seed": seed, "max_new_tokens": 200, "parallel_tool_calls": False}
        out = random_chat.chat(ASK, tools=TOOLS, tool_choice="required", **sampled)
        assert out.finish_reason == "stop" and _valid_calls(out, set(SCHEMAS)) and len(out.tool_calls) == 1
        named = {"type": "function", "function": {"name": "lookup"}}
        out = random_chat.chat(ASK, tools=TOOLS, tool_choice=named, **sampled)
        assert out.finish_reason == "stop" and _valid_calls(out, {"lookup"})
        out = random_chat.chat(ASK, tools=TOOLS[1:], tool_choice="auto", **sampled)
        _valid_calls(out, {"lookup"})
        assert "<tool_call>" not in out.text


def test_random_weights_answer_in_the_schema(random_chat):
    fmt = {"type": "json_schema", "json_schema": {"name": "w", "schema": BOUNDED, "strict": True}}
    for seed in range(3):
        out = random_chat.chat(ASK, response_format=fmt, temperature=1.0, seed=seed, max_new_tokens=120)
        assert out.finish_reason == "stop"
        jsonschema.validate(json.loads(out.text), BOUNDED)
    out = random_chat.chat(ASK, response_format={"type": "choice", "choice": ["yes", "no"]}, temperature=1.0, seed=1)
    assert out.text in ("yes", "no")


def test_the_stream_of_a_constrained_answer_is_the_answer(random_chat):
    fmt = {"type": "json_schema", "json_schema": {"schema": BOUNDED}}
    pieces: list[str] = []
    run = random_chat.start_chat(
        ASK, response_format=fmt, temperature=1.0, seed=4, on_token=lambda _i, d: pieces.append(d or "")
    )
    out = random_chat.run_together([run])[0]
    jsonschema.validate(json.loads(out.text), BOUNDED)
    assert "".join(pieces).strip() == out.text


def test_generate_takes_a_response_format(random_chat):
    out = random_chat.generate(
        [Segment("Lima is sunny.")],
        "Weather?",
        response_format={"type": "json_schema", "json_schema": {"schema": BOUNDED}},
        temperature=1.0,
        seed=0,
        max_new_tokens=64,
        stop_token_ids=[random_chat.tokenizer.token_to_id("<|im_end|>")],
    )
    jsonschema.validate(json.loads(out.text), BOUNDED)


def test_the_bundled_model_calls_the_required_tool_with_valid_arguments(bundled):
    for example in make("tool_call", 8, 5):
        schemas = {t["function"]["name"]: t["function"]["parameters"] for t in example.tools}
        out = bundled.chat(example.messages, tools=example.tools, tool_choice="required", max_new_tokens=48)
        assert [c["name"] for c in out.tool_calls][:1] and out.tool_calls[0]["name"] in schemas
        jsonschema.validate(out.tool_calls[0]["arguments"], schemas[out.tool_calls[0]["name"]])
        named = json.loads(example.answers[0])["name"]  # a tool the question fits: the small model's strings end
        choice = {"type": "function", "function": {"name": named}}
        out = bundled.chat(example.messages, tools=example.tools, tool_choice=choice, max_new_tokens=48)
        assert [c["name"] for c in out.tool_calls] == [named]
        jsonschema.validate(out.tool_calls[0]["arguments"], schemas[named])


def test_the_bundled_model_never_calls_a_tool_it_was_not_offered(bundled):
    lookup = next(t for t in make("tool_call", 1, 0)[0].tools if t["function"]["name"] == "lookup_employee")
    out = bundled.chat([{"role": "user", "content": "Get the weather in Kothvenville."}], tools=[lookup])
    assert all(c["name"] == "lookup_employee" for c in out.tool_calls)


def test_the_bundled_model_answers_in_a_json_schema(bundled):
    for example in make("tool_call", 6, 3):
        name = json.loads(example.answers[0])["name"]
        tool = next(t for t in example.tools if t["function"]["name"] == name)
        schema = {**tool["function"]["parameters"], "additionalProperties": False}
        fmt = {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}
        out = bundled.chat(example.messages, response_format=fmt, max_new_tokens=48)
        jsonschema.validate(json.loads(out.text), schema)
        assert not out.tool_calls


def test_logprobs_and_penalties_reach_the_output(bundled):
    ask = make("tool_call", 1, 0)[0].messages
    out = bundled.chat(ask, max_new_tokens=6, logprobs=True, top_logprobs=3)
    assert len(out.logprobs) == len(out.token_ids)
    for entry, token in zip(out.logprobs, out.token_ids, strict=True):
        assert entry.token == token and entry.logprob <= 0 and len(entry.top) == 3
        assert entry.top[0][0] == token  # greedy: the chosen token is the likeliest
    assert bundled.chat(ask, max_new_tokens=6).logprobs is None
    plain = bundled.chat(ask, max_new_tokens=12, mode="full").token_ids
    penalised = bundled.chat(ask, max_new_tokens=12, mode="full", repetition_penalty=5.0).token_ids
    assert penalised != plain
    assert len(set(penalised)) == len(penalised)  # a token once seen is too costly to write again
