"""The chat formats (hypic_rag.chat.formats), one module each: detection, the call a forced opening begins, and
the bundled model's normalised messages, written once for every integration."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from hypic_rag.chat.formats import BUNDLED, FORMATS, NONE, QWEN3_5_XML, QWEN3_JSON, ChatFormat, detect, get_format
from hypic_rag.chat.formats.bundled import bundled_template, collapse_space
from hypic_rag.chat.segmentation import plain_messages
from hypic_rag.chat.tool_calls import parse_output

INTEGRATIONS = Path(__file__).resolve().parents[2] / "integrations"


QUESTION = {"type": "text", "text": "  Who\nis she? "}


def _doc(text: str, kind: str = "document") -> dict:
    return {"type": "text", "text": text, "hypic": {"kind": kind}}


def test_formats_by_name_and_detection():
    assert list(FORMATS) == ["qwen3_json", "qwen3_5_xml", "bundled", "none"]
    assert all(get_format(name) is fmt and get_format(fmt) is fmt for name, fmt in FORMATS.items())
    with pytest.raises(ValueError, match="unknown tool-call format 'hermes'"):
        get_format("hermes")
    with pytest.raises(ValueError, match="unknown tool-call format"):
        get_format(["qwen3_json"])
    assert detect(bundled_template().templates["default"]) is BUNDLED
    assert detect("{{ '<tool_call>' }}<function=x><parameter=y>") is QWEN3_5_XML  # holds <tool_call> too
    assert detect("{% if tools %}{% endif %}") is QWEN3_JSON and detect(None) is NONE


@pytest.mark.parametrize("fmt", [QWEN3_JSON, QWEN3_5_XML, BUNDLED])
def test_a_forced_opening_completed_by_the_model_parses_as_its_call(fmt: ChatFormat):
    rest = {
        "qwen3_json": ' {"city": "Oslo"}}\n</tool_call>',
        "qwen3_5_xml": "<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>",
        "bundled": '":{"city":"Oslo"},"name":"get_weather"}</a>',
    }[fmt.name]
    parsed = parse_output(fmt.call_opening("get_weather") + rest, fmt)
    assert [(c["name"], c["arguments"]) for c in parsed.tool_calls] == [("get_weather", {"city": "Oslo"})]
    assert parsed.content == ""
    with pytest.raises(ValueError, match="no tool-call format"):
        NONE.call_opening(None)


def test_what_a_stream_must_hold_back_is_the_formats_to_say():
    assert QWEN3_JSON.call_tags == ("<tool_call>",) and "<function=" in QWEN3_5_XML.call_tags
    assert BUNDLED.call_is_whole_answer and BUNDLED.may_become_call('{"arg') and not BUNDLED.may_become_call("Oslo")
    assert not any(f.may_become_call("{") for f in (QWEN3_JSON, QWEN3_5_XML, NONE))


def test_other_formats_take_messages_as_they_are():
    messages = [{"role": "user", "content": [_doc("  A  doc. "), {"type": "text", "text": "Where\n  now?"}]}]
    for fmt in (QWEN3_JSON, QWEN3_5_XML, NONE):
        assert fmt.prepare_messages(messages) == messages


def test_bundled_messages_are_written_as_the_model_was_trained():
    messages = [
        {"role": "system", "content": [{"type": "text", "text": "  Be   brief.\n\n"}, _doc(" Bob is 40. ")]},
        {"role": "user", "content": "Tell me\n about  a book."},
        {"role": "assistant", "content": "A note.  \n", "reasoning_content": "r"},
        {"role": "user", "content": [{"type": "text", "text": "Context: "}, _doc(" Zoë lives in Oslo. "), QUESTION]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"b": "é", "a": 1}}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"city": "Zürich"} '},
    ]
    assert BUNDLED.prepare_messages(messages) == [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": [_doc("Bob is 40.")]},  # after the text it was found after
        {"role": "user", "content": "Tell me about a book."},
        {"role": "assistant", "content": "A note.", "reasoning_content": "r"},
        {"role": "user", "content": [_doc("Zoë lives in Oslo."), {"type": "text", "text": "Context: Who is she?"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a":1,"b":"\\u00e9"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"city":"Z\\u00fcrich"}'},
    ]
    rendered = bundled_template().render(plain_messages(BUNDLED.prepare_messages(messages)), add_generation_prompt=True)
    assert rendered.index("<sys>Be brief.</sys>") < rendered.index("<doc>Bob is 40.</doc>")
    assert rendered.endswith("<q>Context: Who is she?</q>\n<a>")
    assert collapse_space("  a \n\t b  ") == "a b"


def test_bundled_flat_text_is_cut_as_a_flat_prompt_is():
    """``segmentation="auto"``: the question's paragraphs but the last, and a system prompt's but the first, are
    documents (``segmentation.flat_units``, the completions route's rule); the rest stays, in order."""
    flat = "Context:\n\nAna  lives in Oslo.\n\nBo is a\nbaker.\n\nQuestion: where does Ana live?\nAnswer:"
    system = "Be brief.\n\nCy is 40.\n\nDee is 50."
    messages = [{"role": "system", "content": system}, {"role": "user", "content": flat}]
    assert BUNDLED.prepare_messages(messages) == [
        {"role": "system", "content": [_doc("Cy is 40."), _doc("Dee is 50."), {"type": "text", "text": "Be brief."}]},
        {
            "role": "user",
            "content": [
                _doc("Ana lives in Oslo."),
                _doc("Bo is a baker."),
                {"type": "text", "text": "Context: Question: where does Ana live? Answer:"},
            ],
        },
    ]
    for segmentation in ("explicit", "none"):  # written whole, as before
        prepared = BUNDLED.prepare_messages(messages, segmentation)
        assert [m["content"] for m in prepared] == [collapse_space(system), collapse_space(flat)]
    # one paragraph, an earlier user turn, a message that has parts already: nothing to cut
    one = [{"role": "user", "content": "Ana lives in Oslo.\n\nWhat?"}, {"role": "assistant", "content": "Hm."}]
    single = [*one, {"role": "user", "content": "Where does Ana live?"}]
    expected = ["Ana lives in Oslo. What?", "Hm.", "Where does Ana live?"]
    assert [m["content"] for m in BUNDLED.prepare_messages(single)] == expected
    parts = [{"role": "user", "content": [_doc("Ana lives in Oslo."), {"type": "text", "text": "A.\n\nB?"}]}]
    assert BUNDLED.prepare_messages(parts)[0]["content"][1] == {"type": "text", "text": "A. B?"}


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ([{"role": "system", "content": "Be brief."}], "no question"),
        ([{"role": "user", "content": [_doc("Ana lives in Oslo.")]}], "no question"),
        ([{"role": "user", "content": [_doc("Where?", "query"), {"type": "text", "text": "and?"}]}], "'query' part"),
    ],
)
def test_a_bundled_prompt_without_one_question_is_refused(messages, message):
    with pytest.raises(ValueError, match=message):
        BUNDLED.prepare_messages(messages)


def test_no_integration_branches_on_a_format():
    """The integrations ask the engine's format (``Engine.chat_format``); none names one."""
    names = set(FORMATS) - {"none"}
    for source in sorted(INTEGRATIONS.glob("*.py")):
        strings = {n.value for n in ast.walk(ast.parse(source.read_text())) if isinstance(n, ast.Constant)}
        assert not names & strings, f"{source.name} names a chat format"
        assert "BUNDLED" not in source.read_text() and "bundled_format" not in source.read_text(), source.name


def test_results_and_arguments_are_compact_sorted_json():
    step = BUNDLED.prepare_messages(
        [
            {"role": "user", "content": "q"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "x", "function": {"name": "f", "arguments": "{}"}}],
            },
            {"role": "tool", "tool_call_id": "x", "content": "[ 1, 2 ]"},
        ]
    )
    assert step[1]["tool_calls"][0]["function"]["arguments"] == "{}"  # already a string: as written
    assert json.loads(step[2]["content"]) == [1, 2] and step[2]["content"] == "[1,2]"
