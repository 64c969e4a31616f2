"""Messages → the template's text → segments: the text never changes, only where it is cut."""

from __future__ import annotations

import json

import pytest

from hypic_rag.chat.segmentation import content_pieces, plain_messages, segment_prompt
from hypic_rag.chat.template import ChatTemplate
from hypic_rag.model.loading import default_model_path
from hypic_rag.testing.synthetic import TEMPLATES as SYNTHETIC_TEMPLATES

TEMPLATES = SYNTHETIC_TEMPLATES
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def _doc(text: str) -> dict:
    return {"type": "text", "text": text, "hypic": {"kind": "document"}}


@pytest.fixture(scope="module")
def bundled() -> ChatTemplate:
    template = ChatTemplate.from_checkpoint(default_model_path())
    assert template is not None
    return template


@pytest.fixture(scope="module")
def chatml() -> ChatTemplate:
    return ChatTemplate((TEMPLATES / "chatml.jinja").read_text())


def _whole(rendered) -> str:
    return "".join(s.text for s in rendered.segments) + rendered.query.text


def test_content_pieces_cut_paragraphs_and_structural_lines():
    text = "Context information is below.\n-----\ndoc one\n\ndoc two\n-----\nGiven the context.\nQuery: q\nAnswer: "
    runs = content_pieces(text)
    assert "".join(r for _, r in runs) == text
    assert [r for is_piece, r in runs if is_piece] == [
        "Context information is below.",
        "doc one",
        "doc two",
        "Given the context.\nQuery: q",
    ]
    # A header line ending in ':' is glue; a long paragraph is cut at its lines.
    assert [r for p, r in content_pieces("Context:\nAna lives in Oslo.") if p] == ["Ana lives in Oslo."]
    long = "\n".join(["x" * 30] * 5)
    assert [r for p, r in content_pieces(long, max_chars=100) if p] == ["x" * 30] * 5
    assert content_pieces("") == [] and content_pieces("\n\n") == [(False, "\n\n")]


def test_the_bundled_template_gives_todays_segments(bundled):
    messages = [
        {"role": "system", "content": "Answer the question using only the documents."},
        {"role": "user", "content": "Tell me about a book."},
        {"role": "assistant", "content": "Here is a short note on a book."},
        {"role": "user", "content": [_doc("Ana Lee lives in Oslo."), {"type": "text", "text": "Where does Ana live?"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"forecast":"snow"}'},
    ]
    rendered = segment_prompt(bundled, messages, tools=[WEATHER])
    assert [s.kind for s in rendered.segments] == ["tool", "system", "turn", "turn", "document", "turn"]
    assert all(s.cache for s in rendered.segments)
    texts = [s.text for s in rendered.segments]
    assert texts[0] == f"<tool>{json.dumps(WEATHER, separators=(',', ':'))}</tool>\n"
    assert texts[1] == "<sys>Answer the question using only the documents.</sys>\n"
    assert texts[2] == "<turn>user: Tell me about a book.</turn>\n"
    assert texts[4] == "<doc>Ana Lee lives in Oslo.</doc>\n"
    call = '{"arguments":{"city":"Oslo"},"name":"get_weather"}'
    assert texts[5] == f'<turn>call: {call}\nresult: {{"forecast":"snow"}}</turn>\n'
    assert rendered.query.text == "<q>Where does Ana live?</q>\n<a>"
    assert _whole(rendered) == rendered.text


def test_a_recurring_document_is_the_same_segment_wherever_a_flat_prompt_puts_it(chatml):
    def ask(docs: list[str]) -> list[str]:
        context = "\n\n".join(docs)
        content = f"Answer the question based only on the following context:\n{context}\n\nQuestion: Who is in Rome?"
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": content}]
        rendered = segment_prompt(chatml, messages)
        assert _whole(rendered) == rendered.text
        assert rendered.query.text.startswith("Question: Who is in Rome?")
        return [s.text for s in rendered.segments if s.cache and s.kind == "document"]

    docs = ["Ana Lee lives in Oslo.", "Bo Ek lives in Rome.", "Cy Ru lives in Lima."]
    assert ask(docs) == docs
    assert ask(docs[::-1]) == docs[::-1]
    # Glue (role headers, separators, the header line) runs in context.
    rendered = segment_prompt(chatml, [{"role": "user", "content": "Context:\nAna Lee lives in Oslo.\n\nWhere?"}])
    glue = [s.text for s in rendered.segments if not s.cache]
    assert glue == ["<|im_start|>user\nContext:\n", "\n\n"]


def test_modes_explicit_and_none(chatml):
    messages = [{"role": "user", "content": [_doc("Ana Lee lives in Oslo."), {"type": "text", "text": "\n\nA?\n\nB?"}]}]
    explicit = segment_prompt(chatml, messages, segmentation="explicit")
    assert [s.text for s in explicit.segments if s.cache] == ["Ana Lee lives in Oslo."]
    assert explicit.query.text.startswith("\n\nA?\n\nB?")
    auto = segment_prompt(chatml, messages)
    assert [s.text for s in auto.segments if s.cache] == ["Ana Lee lives in Oslo.", "A?"]
    none = segment_prompt(chatml, messages, segmentation="none")
    assert none.segments == [] and none.query.text == none.text == auto.text == explicit.text


def test_a_template_that_rewrites_content_falls_back_to_one_query():
    shouting = ChatTemplate("{% for m in messages %}{{ m.role }}: {{ m.content | upper }}\n{% endfor %}")
    messages = [{"role": "user", "content": [_doc("ana lives in oslo."), {"type": "text", "text": "where?"}]}]
    rendered = segment_prompt(shouting, messages)
    assert rendered.text == "user: ANA LIVES IN OSLO.WHERE?\n"
    assert rendered.segments == [] and rendered.query.text == rendered.text


def test_a_trimming_template_still_cuts(chatml):
    trimming = ChatTemplate("{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}</{{ m.role }}>{% endfor %}")
    rendered = segment_prompt(trimming, [{"role": "user", "content": "  Ana Lee lives in Oslo.\n\nWhere?  "}])
    assert rendered.text == "<user>Ana Lee lives in Oslo.\n\nWhere?</user>"
    assert [s.text for s in rendered.segments if s.cache] == ["Ana Lee lives in Oslo."]
    assert rendered.query.text == "Where?</user>"


@pytest.mark.parametrize(
    "messages,message",
    [
        ([], "non-empty list"),
        ("hi", "non-empty list"),
        ([{"role": "robot", "content": "x"}], "role must be one of"),
        ([{"role": "user", "content": 3}], "content must be a string"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}], "only text parts"),
        ([{"role": "user", "content": [{"type": "text", "text": "x", "hypic": {"kind": "note"}}]}], "hypic kind"),
        ([{"role": "user", "content": None}], "needs content"),
    ],
)
def test_bad_messages(chatml, messages, message):
    with pytest.raises(ValueError, match=message):
        segment_prompt(chatml, messages)


def test_bad_options(chatml):
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(ValueError, match="segmentation must be one of"):
        segment_prompt(chatml, messages, segmentation="paragraphs")
    with pytest.raises(ValueError, match="may not set add_generation_prompt"):
        segment_prompt(chatml, messages, chat_template_kwargs={"add_generation_prompt": False})
    with pytest.raises(ValueError, match="tools must be a list"):
        segment_prompt(chatml, messages, tools=WEATHER)


def test_plain_messages_keep_kinds_beside_the_flattened_content():
    plain = plain_messages([{"role": "user", "content": [_doc("A."), {"type": "text", "text": "B?"}]}])
    assert plain[0]["content"] == "A.B?"
    assert plain[0]["hypic_parts"] == [{"text": "A.", "kind": "document"}, {"text": "B?", "kind": None}]
    assert "hypic_parts" not in plain_messages([{"role": "user", "content": [{"type": "text", "text": "B?"}]}])[0]
