"""Streamed answers split as the finished answer is (hypic_rag.chat.streaming): whatever the chunking, what is
sent of each part begins the final split's part, and ``finish`` completes it."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hypic_rag.chat.streaming import CALL, CONTENT, REASONING, AnswerStream, CallStreaming
from hypic_rag.chat.tool_calls import parse_output

ANSWERS = [
    ("qwen3_json", True, "I should look.\n</think>\n\nIt is sunny in Oslo.  "),
    ("qwen3_json", False, "Sure. <tool_call>\n" + '{"name": "f", "arguments": {"x": 1}}' + "\n</tool_call>"),
    ("qwen3_json", False, "<think>hmm</think>Plain answer with a < sign and <tool_ca and more."),
    (
        "qwen3_5_xml",
        False,
        "Calling.\n<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>",
    ),
    ("qwen3_5_xml", True, "short thought</think>\n\n<function=f>\n</function>"),
    ("none", False, "  Just text.\n\nTwo paragraphs.  "),
    ("bundled", False, "Oslo"),
]
PIECES = ["<", "think", ">", "</", "tool_call>", "\n", " ", "a", "Oslo", "</think>", "<tool_call>"]


def _stream(fmt: str, thinking: bool, chunks: list[str], tools: bool = False) -> tuple[dict[str, str], dict[str, str]]:
    stream = AnswerStream(fmt, thinking_open=thinking, tools=tools)
    sent = {REASONING: "", CONTENT: ""}
    for chunk in chunks:
        for kind, delta in stream.feed(chunk):
            sent[kind] += delta
    parsed = parse_output("".join(chunks), fmt, thinking_open=thinking)
    before = dict(sent)
    for kind, delta in stream.finish(parsed):
        sent[kind] += delta
    return before, sent | {"final_content": parsed.content, "final_reasoning": parsed.reasoning or ""}


def _chunked(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in zip(points, points[1:], strict=False)]


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(ANSWERS), st.lists(st.integers(0, 120), max_size=30))
def test_any_chunking_streams_a_prefix_of_the_final_split_and_finish_completes_it(answer, cuts):
    fmt, thinking, text = answer
    before, after = _stream(fmt, thinking, _chunked(text, cuts))
    assert after["final_content"].startswith(before[CONTENT])
    assert after["final_reasoning"].startswith(before[REASONING])
    assert after[CONTENT] == after["final_content"] and after[REASONING] == after["final_reasoning"]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=25), st.sampled_from(["qwen3_json", "qwen3_5_xml", "none"]))
def test_what_is_sent_is_never_taken_back_on_arbitrary_text(pieces, fmt):
    for thinking in (False, True):
        text = "".join(pieces).lstrip()
        if not thinking and not text.startswith("<think>") and "</think>" in text:
            continue  # a block the prompt never opened: its start went out as content (the module says so)
        before, after = _stream(fmt, thinking, pieces)
        assert after["final_content"].startswith(before[CONTENT])
        assert after["final_reasoning"].startswith(before[REASONING])


def test_content_streams_before_the_answer_ends_and_calls_are_held():
    stream = AnswerStream("qwen3_json")
    assert stream.feed("It is sunny") == [(CONTENT, "It is sunny")]
    assert stream.feed(" in Oslo. <tool") == [(CONTENT, " in Oslo.")]
    assert stream.feed('_call>\n{"name"') == []
    thinking = AnswerStream("qwen3_json", thinking_open=True)
    assert thinking.feed("Let me see</th") == [(REASONING, "Let me see")]
    assert thinking.feed("ink>\n\nYes.") == [(CONTENT, "Yes.")]


def test_a_forced_call_or_a_bundled_answer_with_tools_is_held_whole():
    assert AnswerStream("qwen3_json", answer_prefix="<tool_call>\n").feed("anything") == []
    assert AnswerStream("bundled", tools=True).feed('{"arguments":') == []
    assert AnswerStream("bundled").feed("Oslo") == [(CONTENT, "Oslo")]


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}},
    },
}
OTHER = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
CALLS = [  # (format, tools, text, forced opening)
    (
        "qwen3_json",
        [WEATHER, OTHER],
        'Sure. <tool_call>\n{"name": "get_weather", "arguments": {"city": "S\\u00e3o \\"P\\"", "days": 3}}\n'
        '</tool_call>\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
        "",
    ),
    (
        "qwen3_5_xml",
        [WEATHER, OTHER],
        '<tool_call>\n<function=get_weather>\n<parameter=city>\nSão "P"\n</parameter>\n<parameter=days>\n3\n'
        "</parameter>\n</function>\n<function=f>\n</function>\n</tool_call>",
        "",
    ),
    ("bundled", [WEATHER], '"city":"S\\u00e3o \\"P\\"","days":3},"name":"get_weather"}', '{"arguments":{'),
    (
        "qwen3_json",
        [WEATHER],
        ' {"city": "Oslo", "days": 10}}\n</tool_call>',
        '<tool_call>\n{"name": "get_weather", "arguments":',
    ),
]


def _streamed_calls(fmt, tools, text, prefix, chunks, calls=True):
    stream = AnswerStream(fmt, tools=True, answer_prefix=prefix, calls=CallStreaming.of(tools, None) if calls else None)
    deltas = [payload for chunk in chunks for kind, payload in stream.feed(chunk) if kind == CALL]
    parsed = parse_output(prefix + text, fmt, tools)
    wire = [
        {
            "index": i,
            "id": c["id"],
            "type": "function",
            "function": {"name": c["name"], "arguments": json.dumps(c["arguments"], ensure_ascii=False)},
        }
        for i, c in enumerate(parsed.tool_calls)
    ]
    before = len(deltas)
    deltas += [payload for _, payload in stream.finish_calls(wire)]
    return deltas, before, wire


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(CALLS), st.lists(st.integers(0, 200), max_size=40))
def test_streamed_calls_arrive_in_order_and_their_fragments_join_to_the_parsed_calls(case, cuts):
    fmt, tools, text, prefix = case
    deltas, _, wire = _streamed_calls(fmt, tools, text, prefix, _chunked(text, cuts))
    assert wire, "the case parses to calls"
    joined: dict[int, dict] = {}
    for delta in deltas:
        index = delta["index"]
        if index not in joined:  # the first delta of a call names it and gives its id
            assert index == len(joined) and delta["id"].startswith("call_") and delta["type"] == "function"
            joined[index] = {"name": delta["function"]["name"], "arguments": ""}
        else:
            assert set(delta) == {"index", "function"} and set(delta["function"]) == {"arguments"}
        joined[index]["arguments"] += delta["function"]["arguments"]
    assert [joined[i] for i in sorted(joined)] == [
        {"name": w["function"]["name"], "arguments": w["function"]["arguments"]} for w in wire
    ]


def test_arguments_stream_token_by_token_where_the_name_comes_first_or_is_known():
    for fmt, tools, text, prefix in CALLS:
        deltas, before, _ = _streamed_calls(fmt, tools, text, prefix, list(text))
        fragments = [d for d in deltas[:before] if d["index"] == 0]
        assert len(fragments) >= 5, (fmt, fragments)  # sent as they were written, not at the end
    # the bundled model names the call after its arguments: among two tools, the first key only one of them may
    # hold names it; where both may hold every key, the call comes with its name
    text = '{"arguments":{"city":"Oslo","days":3},"name":"get_weather"}'
    deltas, before, _ = _streamed_calls("bundled", [WEATHER, OTHER], text, "", list(text))
    assert deltas[0]["function"] == {"name": "get_weather", "arguments": '{"city"'} and before >= 5
    twin = {"type": "function", "function": {**WEATHER["function"], "name": "get_forecast"}}
    deltas, before, _ = _streamed_calls("bundled", [WEATHER, twin], text, "", list(text))
    assert before == 1 and deltas[0]["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo", "days": 3}'}
    deltas, before, _ = _streamed_calls("qwen3_json", [WEATHER], CALLS[0][2], "", list(CALLS[0][2]), calls=False)
    assert before == 0 and len(deltas) == 2  # without streaming: each call whole, at the end


def test_a_call_tag_inside_an_argument_is_text_not_another_call():
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "see <tool_call>{ here"}}\n</tool_call>'
    deltas, _, wire = _streamed_calls("qwen3_json", [WEATHER], text, "", list(text))
    assert {d["index"] for d in deltas} == {0} and len(wire) == 1
    assert "".join(d["function"]["arguments"] for d in deltas) == wire[0]["function"]["arguments"]
