"""Arguments given as any iterable are read once: a generator of segments, messages or tools is not consumed by
a check and then found empty; an argument of the wrong type is a ValueError that names it, not a TypeError."""

from __future__ import annotations

import pytest

from hypic_rag import Segment

from .conftest import DOCS, QUESTION, engine, same, segments

TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}


@pytest.fixture(scope="module")
def bundled():
    return engine()


def test_an_iterator_of_segments_loses_no_document(bundled, oracle):
    out = bundled.generate(iter(segments()), QUESTION, max_new_tokens=1)
    assert out.stats["prompt_tokens"] == bundled.generate(segments(), QUESTION, max_new_tokens=1).stats["prompt_tokens"]
    assert same(out.prompt_logits, oracle())
    assert same(bundled.prompt_logits((s for s in segments()), QUESTION), oracle())


def test_a_generator_of_segments_is_cached(bundled):
    fresh = engine()
    assert fresh.cache_segments(Segment(d) for d in DOCS) == 3
    assert fresh.generate(segments(), QUESTION, max_new_tokens=1).stats["hit_segments"] == 3


def test_iterators_of_messages_and_tools(bundled):
    messages = [{"role": "user", "content": QUESTION}]
    assert bundled.render(iter(messages)).text == bundled.render(messages).text
    with_tools = bundled.render(messages, tools=[TOOL]).text
    assert bundled.render(messages, tools=iter([TOOL])).text == with_tools
    once = bundled.chat(iter(messages), tools=iter([TOOL]), tool_choice="required", max_new_tokens=4)
    listed = bundled.chat(messages, tools=[TOOL], tool_choice="required", max_new_tokens=4)
    assert once.stats["prompt_tokens"] == listed.stats["prompt_tokens"] and once.text == listed.text


@pytest.mark.parametrize("bad", [None, 5, 2.5, "some text", b"bytes", {"text": "a"}, Segment("one")])
def test_segments_of_the_wrong_type_are_a_value_error_naming_them(bundled, bad):
    with pytest.raises(ValueError, match="segments"):
        bundled.generate(bad, QUESTION, max_new_tokens=1)
    with pytest.raises(ValueError, match="segments"):
        bundled.cache_segments(bad)


@pytest.mark.parametrize("bad", [None, 5, 2.5, "hi", {"role": "user", "content": "hi"}])
def test_messages_of_the_wrong_type_are_a_value_error_naming_them(bundled, bad):
    with pytest.raises(ValueError, match="messages"):
        bundled.chat(bad, max_new_tokens=1)
    with pytest.raises(ValueError, match="messages"):
        bundled.render(bad)


@pytest.mark.parametrize("bad", [5, "lookup", TOOL])
def test_tools_of_the_wrong_type_are_a_value_error_naming_them(bundled, bad):
    with pytest.raises(ValueError, match="tools"):
        bundled.chat([{"role": "user", "content": QUESTION}], tools=bad, max_new_tokens=1)
