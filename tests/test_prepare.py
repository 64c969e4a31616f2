"""A request is prepared without the model: the checkpoint's files give the same prompt, stop ids and grammar the
engine starts from, and bad input is a ``ValueError`` before any model runs."""

from __future__ import annotations

import pytest

from hypic_rag import Engine, Segment
from hypic_rag.hub import resolve_checkpoint
from hypic_rag.options import RequestOptions
from hypic_rag.prepare import Preparer

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city today.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
MESSAGES = [{"role": "user", "content": "Ana Lee lives in Oslo. What is the weather where Ana Lee lives?"}]


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine.from_pretrained()


@pytest.fixture(scope="module")
def preparer() -> Preparer:
    return Preparer.from_checkpoint(resolve_checkpoint(None))


@pytest.mark.parametrize("choice", [None, "required", "none"])
def test_the_checkpoints_files_prepare_what_the_engine_prepares(engine, preparer, choice):
    ours = preparer.chat(MESSAGES, tools=[WEATHER], tool_choice=choice)
    engines = engine.prepare_chat(MESSAGES, tools=[WEATHER], tool_choice=choice)
    assert ours.prompt == engines.prompt and ours.rendered.text == engines.rendered.text
    assert (ours.ends, ours.grammar, list(ours.opening_ids)) == (
        engines.ends,
        engines.grammar,
        list(engines.opening_ids),
    )
    assert ours.options == engines.options  # the checkpoint's generation defaults filled alike
    assert (preparer.vocab_size, preparer.context) == (engine.config.vocab_size, engine.config.max_position_embeddings)


def test_a_prepared_request_answers_as_the_engine_starts_it(engine, preparer):
    prepared = preparer.chat(MESSAGES, tools=[WEATHER], tool_choice="required")
    assert (
        engine.run_together([engine.begin(prepared)])[0].tool_calls
        == engine.chat(MESSAGES, tools=[WEATHER], tool_choice="required").tool_calls
    )


def test_bad_input_is_refused_when_prepared(preparer):
    with pytest.raises(ValueError, match="past the model's context"):
        preparer.segments([Segment("word " * (preparer.context + 10))], "question?")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        preparer.segments([Segment(token_ids=[preparer.vocab_size])], "question?")
    with pytest.raises(ValueError, match="apply to chat requests"):
        preparer.segments([Segment("a document")], "q?", RequestOptions(segmentation="none"))
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(a|"}}}
    with pytest.raises(ValueError, match="^response_format"):
        preparer.chat(MESSAGES, RequestOptions(response_format=bad))
