"""The chat answer's grammar (hypic_rag/chat/grammar.py), driven by a uniformly random walk over what its mask
allows: whatever the grammar lets through must parse (``parse_output``) as calls to offered tools with valid
arguments, or as content that holds no call."""

from __future__ import annotations

import random
import zlib
from pathlib import Path

import jsonschema
import pytest
from tokenizers import Tokenizer

from hypic_rag.chat.formats import BUNDLED, NONE, QWEN3_5_XML, QWEN3_JSON
from hypic_rag.chat.grammar import answer_grammar, schema_as_call, tool_signatures
from hypic_rag.chat.tool_calls import parse_output
from hypic_rag.grammar import GrammarMask, GrammarTokenizer
from hypic_rag.model.loading import default_model_path
from hypic_rag.testing.synthetic import add_chat_files

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 6},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup",
        "parameters": {
            "type": "object",
            "properties": {"unit": {"type": "string", "enum": ["c", "f"]}, "ok": {"type": "boolean"}},
            "required": ["unit", "ok"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, LOOKUP]
SCHEMAS = dict(tool_signatures(TOOLS))


@pytest.fixture(scope="module")
def qwen_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> tuple[Tokenizer, GrammarTokenizer]:
    """The Qwen-style test vocabulary: the call and reasoning tags are added tokens, as in Qwen's own."""
    path = add_chat_files(Path(tmp_path_factory.mktemp("qwen-tok")), "{{ messages }}")
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    return tok, GrammarTokenizer(tok, tok.get_vocab_size(), [tok.token_to_id("<|im_end|>")])


@pytest.fixture(scope="module")
def bundled_tokenizer() -> tuple[Tokenizer, GrammarTokenizer]:
    """The bundled vocabulary, where Qwen's tags are text to be spelled out."""
    tok = Tokenizer.from_file(str(default_model_path() / "tokenizer.json"))
    return tok, GrammarTokenizer(tok, tok.get_vocab_size(), [tok.token_to_id("</a>")])


def _walk(gtok: GrammarTokenizer, lark: str, rng: random.Random, limit: int = 300) -> list[int] | None:
    mask = GrammarMask(gtok, lark)
    out: list[int] = []
    for _ in range(limit):
        allowed = mask.allowed().nonzero().flatten().tolist()
        ends = [t for t in allowed if t in gtok.stop_ids]
        if ends and (len(ends) == len(allowed) or rng.random() < 0.3):
            return out
        token = rng.choice([t for t in allowed if t not in gtok.stop_ids])
        mask.advance(token)
        out.append(token)
    return None


def _check_answers(tok, gtok, fmt, choice, parallel, trials=30):
    lark = answer_grammar(fmt, gtok, tools=TOOLS, choice=choice, parallel=parallel)
    rng = random.Random(zlib.crc32(f"{fmt.name} {choice} {parallel}".encode()))
    calls = finished = 0
    for _ in range(trials):
        ids = _walk(gtok, lark, rng)
        if ids is None:
            continue
        finished += 1
        parsed = parse_output(tok.decode(ids, skip_special_tokens=True), fmt, TOOLS, reasoning=choice == "auto")
        if choice != "auto":
            assert parsed.tool_calls and not parsed.content, tok.decode(ids)
        if not parallel:
            assert len(parsed.tool_calls) <= 1
        for call in parsed.tool_calls:
            calls += 1
            assert call["name"] in SCHEMAS and choice in ("auto", "required", call["name"])
            jsonschema.validate(call["arguments"], SCHEMAS[call["name"]])
        if not parsed.tool_calls:
            assert "<tool_call>" not in parsed.content and "<function=" not in parsed.content
    assert finished >= trials // 2
    return calls


@pytest.mark.parametrize("fmt", [QWEN3_JSON, QWEN3_5_XML, BUNDLED], ids=lambda f: f.name)
@pytest.mark.parametrize("choice", ["required", "lookup", "auto"])
def test_every_answer_the_grammar_allows_parses_as_offered_calls_or_content(fmt, choice, qwen_tokenizer):
    tok, gtok = qwen_tokenizer
    for parallel in (False, True):
        _check_answers(tok, gtok, fmt, choice, parallel)


@pytest.mark.parametrize("fmt", [QWEN3_JSON, QWEN3_5_XML], ids=lambda f: f.name)
def test_tags_that_are_not_tokens_are_spelled_out(fmt, bundled_tokenizer):
    tok, gtok = bundled_tokenizer
    assert not gtok.is_token("<tool_call>")
    for choice in ("required", "lookup"):
        assert _check_answers(tok, gtok, fmt, choice, False, trials=12) >= 8


def _accepted(gtok: GrammarTokenizer, lark: str, text: str, ids: list[int]) -> bool:
    mask = GrammarMask(gtok, lark)
    return mask.matcher.try_consume_tokens(ids) == len(ids) and mask.complete


@pytest.mark.parametrize(
    ("fmt", "offered", "unoffered"),
    [
        (
            QWEN3_JSON,
            'Sure.<tool_call>\n{"name": "lookup", "arguments": {"unit": "c", "ok": true}}\n</tool_call>',
            'Sure.<tool_call>\n{"name": "get_stock", "arguments": {}}\n</tool_call>',
        ),
        (
            QWEN3_5_XML,
            "<tool_call>\n<function=lookup>\n<parameter=unit>\nc\n</parameter>\n<parameter=ok>\ntrue\n</parameter>\n"
            "</function>\n</tool_call>",
            "<tool_call>\n<function=get_stock>\n</function>\n</tool_call>",
        ),
    ],
    ids=["qwen3_json", "qwen3_5_xml"],
)
def test_auto_admits_offered_calls_and_refuses_others(fmt, offered, unoffered, qwen_tokenizer, bundled_tokenizer):
    for tok, gtok in (qwen_tokenizer, bundled_tokenizer):
        lark = answer_grammar(fmt, gtok, tools=TOOLS, choice="auto")
        spelled = gtok.llg.greedy_tokenize  # tags as text, where the vocabulary has no token for them
        encode = tok.encode if gtok.is_token("<tool_call>") else None

        def ids(text: str, encode=encode, spelled=spelled) -> list[int]:
            return encode(text).ids if encode is not None else spelled(text)

        assert _accepted(gtok, lark, offered, ids(offered))
        assert _accepted(gtok, lark, "The weather is fine.", ids("The weather is fine."))
        assert not _accepted(gtok, lark, unoffered, ids(unoffered))
        assert not _accepted(gtok, lark, unoffered, spelled(unoffered))  # nor spelled out as text
        bare = "<function=get_stock>\n</function>"
        if fmt is QWEN3_5_XML:
            assert not _accepted(gtok, lark, bare, spelled(bare))


def test_bundled_auto_content_may_not_open_a_call(bundled_tokenizer):
    tok, gtok = bundled_tokenizer
    lark = answer_grammar(BUNDLED, gtok, tools=TOOLS, choice="auto")
    assert _accepted(gtok, lark, "", tok.encode('{"arguments":{"ok":true,"unit":"f"},"name":"lookup"}').ids)
    assert not _accepted(gtok, lark, "", tok.encode('{"arguments":{},"name":"get_stock"}').ids)
    assert not _accepted(gtok, lark, "", tok.encode(' {"x": 1}').ids)
    assert _accepted(gtok, lark, "", tok.encode("Talgodale").ids)


def test_parallel_calls_follow_parallel_tool_calls(qwen_tokenizer):
    tok, gtok = qwen_tokenizer
    one = '<tool_call>\n{"name": "lookup", "arguments": {"unit": "c", "ok": true}}\n</tool_call>'
    for parallel in (True, False):
        lark = answer_grammar(QWEN3_JSON, gtok, tools=TOOLS, choice="required", parallel=parallel)
        assert _accepted(gtok, lark, one, tok.encode(one).ids)
        assert _accepted(gtok, lark, one, tok.encode(one + "\n" + one).ids) is parallel


def test_nothing_to_constrain_and_errors(qwen_tokenizer):
    _, gtok = qwen_tokenizer
    assert answer_grammar(QWEN3_JSON, gtok, tools=None, choice=None) is None
    assert answer_grammar(QWEN3_JSON, gtok, tools=TOOLS, choice="none") is None
    assert answer_grammar(NONE, gtok, tools=TOOLS, choice="auto") is None  # a template that cannot call
    assert answer_grammar(NONE, gtok, tools=None, choice=None, response_format={"type": "json_object"})
    with pytest.raises(ValueError, match="names no offered"):
        answer_grammar(QWEN3_JSON, gtok, tools=TOOLS, choice="get_stock")


def test_the_bundled_model_gets_a_response_schema_as_a_call():
    fmt = {"type": "json_schema", "json_schema": {"name": "lookup", "schema": {"type": "object"}, "strict": True}}
    shape = schema_as_call(BUNDLED, [WEATHER, LOOKUP], "auto", fmt)
    assert shape.choice == "required" and shape.response_format is None and shape.response_tool == "lookup_"
    assert [n for n, _ in tool_signatures(shape.tools)] == ["get_weather", "lookup", "lookup_"]
    calls = [{"id": "1", "name": "lookup_", "arguments": {"b": 1, "a": "é"}}]
    assert shape.unwrap("", calls) == ('{"b": 1, "a": "é"}', [])
    assert schema_as_call(QWEN3_JSON, TOOLS, "auto", fmt).response_format == fmt  # written as content there
    assert schema_as_call(BUNDLED, TOOLS, "lookup", fmt).response_format is None  # a forced call has no content
    answer = {"name": "lookup", "description": "the answer", "parameters": {"type": "object"}}
    assert schema_as_call(BUNDLED, TOOLS, "none", fmt).tools == [{"type": "function", "function": answer}]


XML_STRINGS = {
    "type": "object",
    "properties": {
        "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{2}$"},
        "tag": {"type": "string", "pattern": "ok|fine", "maxLength": 9},
        "day": {"type": "string", "format": "date"},
        "mail": {"type": "string", "format": "email", "maxLength": 12},
        "id": {"type": "string", "format": "uuid"},
        "note": {"type": "string", "maxLength": 5},
    },
    "required": ["code", "tag", "day", "mail", "id", "note"],
}


def test_xml_string_parameters_are_held_to_pattern_format_and_length(qwen_tokenizer):
    tok, gtok = qwen_tokenizer
    tools = [{"type": "function", "function": {"name": "file", "parameters": XML_STRINGS}}]
    lark = answer_grammar(QWEN3_5_XML, gtok, tools=tools, choice="required", parallel=False)
    rng, checked = random.Random(5), 0
    for _ in range(20):
        ids = _walk(gtok, lark, rng, limit=600)
        if ids is None:
            continue
        calls = parse_output(tok.decode(ids, skip_special_tokens=True), QWEN3_5_XML, tools, reasoning=False).tool_calls
        assert len(calls) == 1, tok.decode(ids)
        jsonschema.validate(calls[0]["arguments"], XML_STRINGS, format_checker=jsonschema.FormatChecker())
        checked += 1
    assert checked >= 10
    mask = GrammarMask(gtok, lark)  # a value the pattern refuses is refused token by token
    opening = "<tool_call>\n<function=file>\n<parameter=code>\nab-12\n</parameter>"
    assert not all(mask.matcher.consume_token(i) for i in tok.encode(opening).ids)


def test_an_xml_string_format_that_cannot_be_held_is_refused(qwen_tokenizer):
    _, gtok = qwen_tokenizer
    schema = {"type": "object", "properties": {"ip": {"type": "string", "format": "ipv6"}}}
    tools = [{"type": "function", "function": {"name": "ping", "parameters": schema}}]
    with pytest.raises(ValueError, match="format 'ipv6' cannot be held"):
        answer_grammar(QWEN3_5_XML, gtok, tools=tools, choice="required")
