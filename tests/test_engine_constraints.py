"""Every constraint in every mode: each kind of ``response_format`` and a forced tool call, under ``full``,
``prefix``, ``pic``, ``hypic``, an ``auto`` seam and a fidelity budget, alone (streamed) and batched (chunked
prefill, decoded together), cold and then warm; each answer checked against what was asked and its finish reason.

The prompts hold a document segment, so the composed modes really compose: with none, every mode prefills the same
way and a constraint that only fails where pieces are composed passes unseen."""

from __future__ import annotations

import json
import re
import shutil

import jsonschema
import pytest

from hypic_rag import Engine
from hypic_rag.decoding import Prefilling
from hypic_rag.eval.data import make
from hypic_rag.testing.synthetic import add_chat_files

from .chat.conftest import TEMPLATES
from .test_engine_grammar import BOUNDED  # every valid instance is short: random weights finish it

MODES = {
    "full": {"mode": "full"},
    "prefix": {"mode": "prefix"},
    "pic": {"mode": "pic"},
    "hypic": {"mode": "hypic"},
    "auto": {"mode": "hypic", "seam": "auto"},
    "budget": {"mode": "hypic", "fidelity_budget": 0.05},
}
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"}},
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
CITIES = ["Douthbarport", "Lima", "Oslo"]
DOCS = [
    "Fastos Taisbre lives in Douthbarport. Fastos Taisbre works at Palvaith Foundry. Fastos Taisbre is 33 years old.",
    "Bo Ek lives in Rome. Bo Ek works at Kilnor Systems. Bo Ek is 51 years old.",
]
QUESTIONS = ["Where does Fastos Taisbre live?", "Where does Bo Ek live?"]


def _messages(doc: str, question: str) -> list[dict]:
    parts = [{"type": "text", "text": doc, "hypic": {"kind": "document"}}, {"type": "text", "text": question}]
    return [{"role": "user", "content": parts}]


def _kinds(schema: dict, regex: str) -> dict[str, dict]:
    """Each constraint as the keywords of a chat request."""
    tool = {"type": "function", "function": {"name": "record", "description": "the answer", "parameters": schema}}
    return {
        "json_schema": {"response_format": {"type": "json_schema", "json_schema": {"name": "P", "schema": schema}}},
        "json_object": {"response_format": {"type": "json_object"}},
        "regex": {"response_format": {"type": "regex", "regex": regex}},
        "choice": {"response_format": {"type": "choice", "choice": CITIES}},
        "tool": {"tools": [tool], "tool_choice": "required", "parallel_tool_calls": False},
    }


def _check(out, kind: str, schema: dict, regex: str) -> None:
    """The answer is what ``kind`` asks for, and ended because it was complete."""
    assert out.finish_reason == "stop" and not out.incomplete, (kind, out.finish_reason, out.text)
    if kind == "tool":
        assert [c["name"] for c in out.tool_calls] == ["record"] and not out.text, out
        jsonschema.validate(out.tool_calls[0]["arguments"], schema)
        return
    assert not out.tool_calls, out.tool_calls
    if kind == "json_schema":
        jsonschema.validate(json.loads(out.text), schema)
    elif kind == "json_object":
        assert isinstance(json.loads(out.text), dict), out.text
    elif kind == "regex":
        assert re.fullmatch(regex, out.text), out.text
    else:
        assert out.text in CITIES, out.text


@pytest.fixture(scope="module")
def bundled() -> Engine:
    return Engine.from_pretrained()


@pytest.fixture(scope="module")
def random_xml(checkpoint, tmp_path_factory) -> Engine:
    """Random weights behind the Qwen3.5 template (XML calls), where the grammar alone makes answers valid."""
    path = tmp_path_factory.mktemp("qwen3_5_constraints") / "model"
    shutil.copytree(checkpoint("qwen3_5_text"), path)
    add_chat_files(path, (TEMPLATES / "qwen3_5.jinja").read_text())
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 8192}))
    return Engine.from_pretrained(path)


def _cases(engine: Engine, which: str):
    if which == "bundled":  # greedy, as users run it; a free object about "Bo Ek" (no name of the model's world)
        return engine, PERSON, r"[A-Z][a-z]+", {"max_new_tokens": 160}  # runs to 73 tokens before it closes
    return engine, BOUNDED, r"(yes|no), [a-z]{1,6}", {"max_new_tokens": 160, "temperature": 1.0, "seed": 3}


KINDS = ["json_schema", "json_object", "regex", "choice", "tool"]
# Random weights given a free object go on writing keys past any budget: json_object is held there by its own
# mask test (tests/test_grammar.py); here it is the bundled model's.
ENGINES = ("bundled", "random_xml")
CASES = [(w, m, k) for w in ENGINES for m in MODES for k in KINDS if (w, k) != ("random_xml", "json_object")]


@pytest.mark.parametrize(("which", "mode", "kind"), CASES)
def test_the_constraint_holds_alone_streamed_and_batched(which, mode, kind, request):
    engine, schema, regex, sampling = _cases(request.getfixturevalue(which), which)
    ask = {**_kinds(schema, regex)[kind], **MODES[mode], **sampling}
    engine.clear_cache()
    pieces: list[str] = []
    run = engine.start_chat(_messages(DOCS[0], QUESTIONS[0]), on_token=lambda _i, d: pieces.append(d or ""), **ask)
    alone = engine.run_together([run])[0]  # cold: every segment is filled by this request
    _check(alone, kind, schema, regex)
    if kind != "tool" and not (which == "bundled" and kind in ("json_schema", "json_object")):
        assert "".join(pieces).strip() == alone.text  # the stream is the answer (a bundled call is held whole)
    # warm, chunked and decoded together: the other path a server takes
    started = [engine.start_chat(_messages(d, q), prefill_chunk=8, **ask) for d, q in zip(DOCS, QUESTIONS, strict=True)]
    runs = []
    for start in started:
        while isinstance(start, Prefilling) and start.generation is None:
            start.advance()
        runs.append(start.generation if isinstance(start, Prefilling) else start)
    for out in engine.run_together(runs):
        _check(out, kind, schema, regex)


def test_a_constrained_answer_cut_short_says_so(bundled):
    fmt = {"type": "json_schema", "json_schema": {"name": "P", "schema": PERSON}}
    out = bundled.chat(_messages(DOCS[0], QUESTIONS[0]), response_format=fmt, max_new_tokens=4)
    assert out.finish_reason == "length" and out.incomplete
    assert out.text.startswith("{") and not out.text.startswith('{"arguments"')  # the JSON so far, unwrapped
    with pytest.raises(json.JSONDecodeError):
        json.loads(out.text)
    out = bundled.chat(_messages(DOCS[0], QUESTIONS[0]), response_format=fmt, max_new_tokens=60, stop=['"city"'])
    assert out.finish_reason == "stop" and out.incomplete  # a stop string cut the object open
    assert not bundled.chat(_messages(DOCS[0], QUESTIONS[0]), max_new_tokens=2).incomplete  # nothing to complete


def _after_a_call(i: int) -> list[dict]:
    """A conversation whose assistant called a tool and was answered, then a new request: the bundled model,
    offered no tool now, begins another call (of ``tool_call``'s 30 with seed 9, numbers 10 and 18 do)."""
    examples = make("tool_call", 30, 9)
    answer = json.loads(examples[i].answers[0])
    call = {"id": "c1", "type": "function", "function": {"name": answer["name"], "arguments": answer["arguments"]}}
    return [
        *examples[i].messages,
        {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "done"},
        examples[(i + 1) % 30].messages[-1],
    ]


@pytest.mark.parametrize("which", ENGINES)
def test_no_tool_offered_no_call_in_forty_requests(which, request):
    """With no tool offered, the format's call syntax is out of reach: no call is parsed, and no call tag is
    written, in the four modes, streamed and not (the bundled model calls a tool it saw in training; random
    weights write any token, ``<tool_call>`` included)."""
    engine = request.getfixturevalue(which)
    sampling = {"max_new_tokens": 40} if which == "bundled" else {"max_new_tokens": 40, "temperature": 1.0}
    docs = [
        "Munkor Partners builds boats. Munkor Partners is in Rome.",
        "Bo Ek lives in Rome. Bo Ek works at Kilnor Systems.",
        "Fastos Taisbre works at Palvaith Foundry.",
    ]
    parts = [{"type": "text", "text": d, "hypic": {"kind": "document"}} for d in docs]
    asks = ["Who builds boats?", "What is the stock price of Munkor Partners?", "Where does Bo Ek live?"]
    tag = "<tool_call>" if which == "random_xml" else '{"arguments"'
    answers = 0
    for n in range(40):
        mode = ("full", "prefix", "pic", "hypic")[n % 4]
        messages = [{"role": "user", "content": [*parts, {"type": "text", "text": asks[n % 3]}]}]
        if which == "bundled" and n < 20:
            messages = _after_a_call(n + 5)
        streamed: list[str] = []
        on_token = (lambda _id, delta, into=streamed: into.append(delta or "")) if n % 2 else None
        out = engine.chat(messages, mode=mode, seed=n, on_token=on_token, **sampling)
        assert not out.tool_calls and tag not in (out.text or ""), (mode, out.text, out.tool_calls)
        assert tag not in "".join(streamed)
        answers += 1
    assert answers == 40
