"""Tool calls parsed out of a model's output in its chat template's own format (hypic_rag.chat.tool_calls, over
the formats of hypic_rag.chat.formats)."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from hypic_rag.chat.formats import detect_format, format_tool_result
from hypic_rag.chat.formats.bundled import bundled_template, format_call, tool_step
from hypic_rag.chat.tool_calls import (
    ParsedOutput,
    call_id,
    chosen_tool,
    forced_call_prefix,
    parse_output,
    split_reasoning,
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "metric": {"type": "boolean"},
                "zip": {"type": "string"},
                "ratio": {"type": "number"},
                "filters": {"type": "object"},
                "tags": {"type": "array"},
                "note": {"type": ["string", "null"]},
                "code": {"type": ["string", "integer"]},
                "level": {"enum": ["1", "2"]},
            },
        },
    },
}
WRITE = {"type": "function", "function": {"name": "write_file", "parameters": {"properties": {"content": {}}}}}
TOOLS = [WEATHER, WRITE]


def _json_call(name: str, arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def _xml_call(name: str, params: dict[str, str]) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def _calls(out: ParsedOutput) -> list[tuple[str, dict]]:
    return [(c["name"], c["arguments"]) for c in out.tool_calls]


# qwen3_json


def test_json_one_call_is_a_call_and_no_content():
    out = parse_output(_json_call("get_weather", {"city": "Paris"}), "qwen3_json")
    assert _calls(out) == [("get_weather", {"city": "Paris"})]
    assert out.content == "" and out.reasoning is None
    assert set(out.tool_calls[0]) == {"id", "name", "arguments"}


def test_json_two_calls_keep_their_order():
    text = _json_call("a", {"x": 1}) + "\n" + _json_call("b", {"y": [1, 2]})
    assert _calls(parse_output(text, "qwen3_json")) == [("a", {"x": 1}), ("b", {"y": [1, 2]})]


def test_json_text_around_calls_is_content():
    text = "Let me check.\n" + _json_call("a", {}) + "\nand then\n" + _json_call("b", {}) + "\nDone."
    out = parse_output(text, "qwen3_json")
    assert _calls(out) == [("a", {}), ("b", {})]
    assert out.content == "Let me check.\n\nand then\n\nDone."


def test_json_arguments_given_as_a_json_string_become_a_dict():
    text = _json_call("a", json.dumps({"q": "x", "n": 2}))
    assert _calls(parse_output(text, "qwen3_json")) == [("a", {"q": "x", "n": 2})]


def test_json_missing_or_null_arguments_are_an_empty_dict():
    for block in ('<tool_call>\n{"name": "now"}\n</tool_call>', '<tool_call>{"name": "now", "arguments": null}'):
        assert _calls(parse_output(block, "qwen3_json")) == [("now", {})]


@pytest.mark.parametrize(
    "bad",
    [
        '<tool_call>\n{"name": "a", "arguments": {"x": 1}\n</tool_call>',  # unbalanced braces
        '<tool_call>\n{"arguments": {}}\n</tool_call>',  # no name
        '<tool_call>\n{"name": "a", "arguments": [1]}\n</tool_call>',  # arguments not an object
        '<tool_call>\n{"name": "a", "arguments": "not json"}\n</tool_call>',
        '<tool_call>\n{"name": "a", "arguments": {}} trailing\n</tool_call>',
        "<tool_call>\n</tool_call>",
    ],
)
def test_a_malformed_json_block_stays_in_content_verbatim(bad):
    good = _json_call("b", {"k": "v"})
    out = parse_output(f"before\n{bad}\n{good}\nafter", "qwen3_json")
    assert _calls(out) == [("b", {"k": "v"})]
    assert out.content == f"before\n{bad}\n\nafter"


def test_an_unclosed_malformed_block_ends_at_the_next_block():
    out = parse_output('<tool_call>\n{"name": "a", \n' + _json_call("b", {}), "qwen3_json")
    assert _calls(out) == [("b", {})]
    assert out.content == '<tool_call>\n{"name": "a",'


def test_a_json_call_cut_off_before_its_close_tag_is_still_a_call():
    assert _calls(parse_output('<tool_call>\n{"name": "a", "arguments": {"x": 1}}', "qwen3_json")) == [("a", {"x": 1})]


def test_json_strings_may_hold_the_close_tag():
    args = {"text": "literal </tool_call> inside"}
    out = parse_output(_json_call("echo", args), "qwen3_json")
    assert _calls(out) == [("echo", args)] and out.content == ""


def test_json_calls_of_tools_not_offered_are_still_calls():
    out = parse_output(_json_call("made_up", {"a": 1}), "qwen3_json", TOOLS)
    assert _calls(out) == [("made_up", {"a": 1})]


# qwen3_5_xml


def test_xml_one_call_with_types_from_the_schema():
    params = {"city": "Paris", "days": "3", "metric": "true", "ratio": "0.5", "zip": "02139"}
    out = parse_output(_xml_call("get_weather", params), "qwen3_5_xml", TOOLS)
    assert _calls(out) == [("get_weather", {"city": "Paris", "days": 3, "metric": True, "ratio": 0.5, "zip": "02139"})]
    assert out.content == ""


def test_xml_a_number_like_string_stays_a_string_when_the_schema_says_string():
    out = parse_output(_xml_call("get_weather", {"zip": "12345", "city": "true"}), "qwen3_5_xml", TOOLS)
    assert _calls(out)[0][1] == {"zip": "12345", "city": "true"}


def test_xml_nested_object_and_array_from_the_schema():
    filters = {"a": {"b": [1, 2, {"c": None}]}, "d": "e"}
    params = {"filters": json.dumps(filters), "tags": '["x", "y"]'}
    out = parse_output(_xml_call("get_weather", params), "qwen3_5_xml", TOOLS)
    assert _calls(out)[0][1] == {"filters": filters, "tags": ["x", "y"]}


def test_xml_a_value_that_does_not_fit_its_schema_stays_the_raw_string():
    params = {"days": "three", "metric": "maybe", "filters": "{not json", "tags": '{"a": 1}', "ratio": "[1]"}
    out = parse_output(_xml_call("get_weather", params), "qwen3_5_xml", TOOLS)
    assert _calls(out)[0][1] == params


def test_xml_schema_edge_cases_integral_floats_capital_booleans_and_null():
    params = {"days": "4.0", "metric": "False", "note": "null", "zip": "null", "ratio": "2"}
    args = _calls(parse_output(_xml_call("get_weather", params), "qwen3_5_xml", TOOLS))[0][1]
    assert args == {"days": 4, "metric": False, "note": None, "zip": "null", "ratio": 2}
    assert isinstance(args["days"], int) and args["metric"] is False


def test_xml_union_and_enum_schemas():
    params = {"code": "5", "level": "2", "days": "2.5", "metric": "1", "note": "text"}
    args = _calls(parse_output(_xml_call("get_weather", params), "qwen3_5_xml", TOOLS))[0][1]
    assert args == {"code": 5, "level": "2", "days": "2.5", "metric": "1", "note": "text"}
    for raw in ("null", "[1]", "abc", "true"):  # the schema allows a string, so what is not an integer is that string
        out = parse_output(_xml_call("get_weather", {"code": raw}), "qwen3_5_xml", TOOLS)
        assert _calls(out)[0][1] == {"code": raw}


def test_xml_without_a_schema_reads_json_looking_values_and_keeps_the_rest():
    params = {
        "n": "42",
        "f": "-1.5e3",
        "b": "false",
        "z": "null",
        "o": '{"k": [1]}',
        "a": "[1, 2]",
        "s": "hello",
        "lead": "007",
        "quoted": '"hi"',
        "bad": "{oops",
    }
    out = parse_output(_xml_call("unknown_tool", params), "qwen3_5_xml")
    assert _calls(out)[0][1] == {
        "n": 42,
        "f": -1500.0,
        "b": False,
        "z": None,
        "o": {"k": [1]},
        "a": [1, 2],
        "s": "hello",
        "lead": "007",
        "quoted": '"hi"',
        "bad": "{oops",
    }


def test_xml_a_parameter_missing_from_the_schema_is_guessed():
    out = parse_output(_xml_call("get_weather", {"extra": "7", "city": "7"}), "qwen3_5_xml", TOOLS)
    assert _calls(out)[0][1] == {"extra": 7, "city": "7"}


def test_xml_multiline_values_lose_exactly_one_newline_at_each_end():
    code = "\n\ndef f():\n    return 1\n\n"
    out = parse_output(_xml_call("write_file", {"content": code}), "qwen3_5_xml", TOOLS)
    assert _calls(out)[0][1] == {"content": code}
    inline = "<tool_call>\n<function=write_file>\n<parameter=content>abc</parameter>\n</function>\n</tool_call>"
    assert _calls(parse_output(inline, "qwen3_5_xml"))[0][1] == {"content": "abc"}


def test_xml_values_may_hold_the_closing_tags_of_the_function_and_block():
    value = "x </function> y </tool_call> z <parameter=q> w"
    out = parse_output(_xml_call("write_file", {"content": value}), "qwen3_5_xml", TOOLS)
    assert _calls(out) == [("write_file", {"content": value})] and out.content == ""


def test_xml_two_calls_and_content_around_them():
    text = (
        "I will look both up.\n\n"
        + _xml_call("get_weather", {"city": "Paris"})
        + "\n"
        + _xml_call("get_weather", {"city": "Rome", "days": "2"})
    )
    out = parse_output(text, "qwen3_5_xml", TOOLS)
    assert _calls(out) == [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome", "days": 2})]
    assert out.content == "I will look both up."


def test_xml_a_parameter_cut_off_at_the_end_of_output_is_content():
    text = "<tool_call>\n<function=write_file>\n<parameter=content>\nhalf a fi"
    assert parse_output(text, "qwen3_5_xml", TOOLS) == ParsedOutput(text, None, [])


def test_xml_a_call_without_parameters():
    out = parse_output("<tool_call>\n<function=now>\n</function>\n</tool_call>", "qwen3_5_xml")
    assert _calls(out) == [("now", {})]


@pytest.mark.parametrize(
    "bad",
    [
        "<tool_call>\n<function=a>\n<parameter=x>\n1\n</function>\n</tool_call>",  # parameter never closed
        "<tool_call>\n<function=a>\n<parameter=x>\n1\n</parameter>\n</tool_call>",  # function never closed
        "<tool_call>\n<function=a>\nstray text\n</function>\n</tool_call>",
        "<tool_call>\n<function=>\n</function>\n</tool_call>",  # no name
        '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>',  # the other format's block
    ],
)
def test_a_malformed_xml_block_stays_in_content_verbatim(bad):
    good = _xml_call("b", {"k": "v"})
    out = parse_output(f"before\n{bad}\n{good}", "qwen3_5_xml")
    assert _calls(out) == [("b", {"k": "v"})]
    assert out.content == f"before\n{bad}"


def test_xml_a_bare_function_without_its_opener_is_recovered_with_its_orphan_close():
    text = "Fetching.\n\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>"
    out = parse_output(text, "qwen3_5_xml", TOOLS)
    assert _calls(out) == [("get_weather", {"city": "Oslo"})]
    assert out.content == "Fetching."


def test_xml_a_bare_function_of_a_tool_not_offered_is_content():
    text = "Use <function=rm_rf>\n</function> carefully."
    assert parse_output(text, "qwen3_5_xml", TOOLS) == ParsedOutput(text, None, [])
    prose = "Write <function=NAME> then parameters."
    assert parse_output(prose, "qwen3_5_xml") == ParsedOutput(prose, None, [])


def test_xml_calls_of_tools_not_offered_in_a_block_are_still_calls():
    out = parse_output(_xml_call("made_up", {"n": "1"}), "qwen3_5_xml", TOOLS)
    assert _calls(out) == [("made_up", {"n": 1})]


# bundled


def test_bundled_the_whole_answer_as_a_call():
    answer = format_call("search", {"q": "hypic", "k": 3})
    out = parse_output(answer, "bundled")
    assert _calls(out) == [("search", {"q": "hypic", "k": 3})] and out.content == ""
    assert _calls(parse_output(f" {answer}</a>", "bundled")) == [("search", {"q": "hypic", "k": 3})]


@pytest.mark.parametrize(
    "answer",
    [
        "Paris is the capital.",
        'Answer: {"name":"search","arguments":{}}',  # prose first
        '{"name":"search","arguments":{}} and more',  # prose after
        '{"name":"search","arguments":[]}',
        '{"title":"not a call"}',
        '{"name":"search"',
    ],
)
def test_bundled_anything_but_a_whole_call_is_content(answer):
    assert parse_output(answer, "bundled") == ParsedOutput(answer, None, [])


# none, errors


def test_format_none_parses_no_calls():
    text = _json_call("a", {})
    assert parse_output(f"  {text}  ", "none") == ParsedOutput(text, None, [])


def test_an_unknown_format_is_an_error():
    with pytest.raises(ValueError, match="format"):
        parse_output("x", "hermes")


def test_parsed_output_is_frozen():
    out = parse_output("x", "none")
    with pytest.raises(dataclasses.FrozenInstanceError):
        out.content = "y"  # type: ignore[misc]


# reasoning


def test_reasoning_is_split_off_before_calls_are_parsed():
    text = "<think>\nI should call a <tool_call> tool.\n</think>\n\nSure.\n" + _json_call("a", {"x": 1})
    out = parse_output(text, "qwen3_json")
    assert out.reasoning == "I should call a <tool_call> tool."
    assert out.content == "Sure." and _calls(out) == [("a", {"x": 1})]


def test_reasoning_when_the_prompt_opened_the_think_block():
    text = "Need weather.\n</think>\n\n" + _xml_call("get_weather", {"city": "Oslo"})
    out = parse_output(text, "qwen3_5_xml", TOOLS, thinking_open=True)
    assert out.reasoning == "Need weather." and out.content == ""
    assert _calls(out) == [("get_weather", {"city": "Oslo"})]


def test_thinking_open_cut_off_before_the_close_is_all_reasoning():
    text = "still thinking " + _json_call("a", {})
    out = parse_output(text, "qwen3_json", thinking_open=True)
    assert out == ParsedOutput("", text.strip(), [])
    assert split_reasoning("plain answer") == (None, "plain answer")
    assert split_reasoning("plain answer", thinking_open=True) == ("plain answer", "")


def test_a_close_tag_with_no_opener_is_read_as_thinking_open():
    assert split_reasoning("hmm\n</think>\nyes") == ("hmm", "yes")
    assert split_reasoning("<think>a</think>b</think>c") == ("a", "b</think>c")


def test_empty_reasoning_is_none_and_a_think_tag_mid_content_is_content():
    assert split_reasoning("<think>\n\n</think>\n\nHi") == (None, "Hi")
    assert split_reasoning("x <think>y</think> z") == (None, "x <think>y</think> z")
    assert split_reasoning("<think>\ncut off") == ("cut off", "")


# detect_format

QWEN3 = """{%- if tools %}You may call one or more functions... <tools>{{ tool | tojson }}</tools>
{"name": <function-name>, "arguments": <args-json-object>}{%- endif %}
{%- for tool_call in message.tool_calls %}{{- '<tool_call>\\n{"name": "' }}{{ tool_call.name }}{%- endfor %}"""
QWEN3_CODER = """{%- if tools %}<tools>...</tools>{%- endif %}
{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}
{{- '<parameter=' + args_name + '>\\n' }}{{- '\\n</parameter>\\n' }}{{- '</function>\\n</tool_call>' }}"""
BUNDLED = "{%- for m in messages %}<sys>{{ m.content }}</sys>\n<tool>{{ t }}</tool>\n<q>{{ q }}</q>\n<a>{%- endfor %}"


@pytest.mark.parametrize(
    ("source", "fmt"),
    [
        (QWEN3, "qwen3_json"),
        (QWEN3_CODER, "qwen3_5_xml"),
        (BUNDLED, "bundled"),
        ("<q>{{ q }}</q>\n<a>", "bundled"),
        ("{%- if tools %}{{ tools | tojson }}{%- endif %}{{ message.content }}", "qwen3_json"),
        ("{% for m in messages %}{{ m.content }}{% endfor %}", "none"),
        ("", "none"),
        (None, "none"),
        ('<function=f>{"a": 1}</function> {{ tools }}', "qwen3_json"),  # Llama-style JSON body, not Qwen XML
    ],
)
def test_detect_format(source, fmt):
    assert detect_format(source) == fmt


# ids


def test_ids_are_deterministic_and_tell_calls_apart():
    text = _json_call("a", {"x": 1}) + _json_call("a", {"x": 1}) + _json_call("a", {"x": 2})
    ids = [c["id"] for c in parse_output(text, "qwen3_json").tool_calls]
    assert ids == [c["id"] for c in parse_output(text, "qwen3_json").tool_calls]
    assert all(re.fullmatch(r"call_[0-9a-f]{12}", i) for i in ids)
    assert len(set(ids)) == 3  # same call at another position, or other arguments: another id
    assert ids[0] == call_id(0, "a", {"x": 1})
    assert call_id(0, "a", {"x": 1, "y": 2}) == call_id(0, "a", {"y": 2, "x": 1})  # key order does not matter
    assert call_id(0, "b", {"x": 1}) != ids[0]


def test_the_id_seed_changes_ids_per_turn_and_keeps_them_stable_within_one():
    text = _json_call("a", {"x": 1})
    first = parse_output(text, "qwen3_json", id_seed="turn-1").tool_calls[0]["id"]
    assert first == parse_output(text, "qwen3_json", id_seed="turn-1").tool_calls[0]["id"]
    assert first != parse_output(text, "qwen3_json", id_seed="turn-2").tool_calls[0]["id"]


def test_the_same_call_has_the_same_id_in_every_format():
    args = {"city": "Oslo"}
    outs = [
        parse_output(_json_call("get_weather", args), "qwen3_json"),
        parse_output(_xml_call("get_weather", args), "qwen3_5_xml", TOOLS),
        parse_output(format_call("get_weather", args), "bundled"),
    ]
    assert len({o.tool_calls[0]["id"] for o in outs}) == 1


# format_tool_result


def test_spaced_json_text_becomes_compact_with_sorted_keys():
    spaced = '{\n  "b": 1,\n  "a": {"d": [1, 2], "c": "é"}\n}'
    assert format_tool_result(spaced) == '{"a":{"c":"é","d":[1,2]},"b":1}'
    assert format_tool_result(' [ 1, {"y": 2, "x": 1} ] ') == '[1,{"x":1,"y":2}]'


def test_plain_text_and_json_scalars_are_kept_as_written():
    for text in ["It is 21 degrees in Oslo.", "1e5", '"quoted"', "[INFO] done", "{not json", "  padded  "]:
        assert format_tool_result(text) == text


def test_python_literals_are_read_as_the_json_they_stand_for():
    # what ``str()`` of a returned dict writes (LlamaIndex's FunctionTool), in process or over HTTP
    assert (
        format_tool_result("{'b': 2, 'a': [1, 'x'], 'c': None, 'd': True}") == '{"a":[1,"x"],"b":2,"c":null,"d":true}'
    )
    assert format_tool_result("[('x', 1)]") == '[["x",1]]'
    for text in ["{1, 2}", "{'a': foo()}", "['unclosed'", "{" + "'k': 1, " * 20000 + "}"]:  # a set, code, junk, long
        assert format_tool_result(text) == text


def test_dicts_lists_and_scalars_are_dumped_the_same_way():
    assert format_tool_result({"b": 2, "a": [1, "x"]}) == '{"a":[1,"x"],"b":2}'
    assert format_tool_result([{"z": 1, "y": None}]) == '[{"y":null,"z":1}]'
    assert format_tool_result(None) == "null" and format_tool_result(True) == "true"
    assert format_tool_result(3) == "3"


def test_other_objects_are_their_str():
    class Reading:
        def __str__(self) -> str:
            return "21C"

    assert format_tool_result(Reading()) == "21C"
    assert format_tool_result({"r": Reading()}) == '{"r":"21C"}'


def test_ascii_escaping_is_a_choice_matching_the_bundled_training_data():
    assert format_tool_result({"city": "Zürich"}) == '{"city":"Zürich"}'
    trained = json.dumps({"city": "Zürich"}, separators=(",", ":"), sort_keys=True)  # eval/data/workloads.py
    assert format_tool_result('{"city": "Zürich"}', ensure_ascii=True) == trained


def test_results_agree_with_the_bundled_models_turn_format():
    result = {"temp": 21, "city": "Oslo"}
    spaced = json.dumps(result, indent=2)

    def turn(content: str) -> str:
        step = tool_step("c1", "w", {}, "")
        step[-1]["content"] = content
        return bundled_template().render([{"role": "user", "content": "q"}, *step], add_generation_prompt=False)

    expected = turn('{"city":"Oslo","temp":21}')
    assert '<turn>call: {"arguments":{},"name":"w"}\nresult: {"city":"Oslo","temp":21}</turn>' in expected
    assert turn(format_tool_result(spaced)) == expected
    assert turn(format_tool_result(result)) == expected


@pytest.mark.parametrize(
    ("fmt", "completion"),
    [
        ("qwen3_json", '{"city": "Oslo"}}\n</tool_call>'),
        ("qwen3_5_xml", "<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>"),
    ],
)
def test_a_forced_opening_and_its_completion_parse_as_the_named_call(fmt, completion):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    prefix = forced_call_prefix(fmt, chosen_tool({"type": "function", "function": {"name": "get_weather"}}, tools))
    parsed = parse_output(prefix + completion, fmt, tools)
    assert [(c["name"], c["arguments"]) for c in parsed.tool_calls] == [("get_weather", {"city": "Oslo"})]
    assert parsed.content == ""
    assert forced_call_prefix(fmt, "required") in prefix
    assert forced_call_prefix(fmt, "auto") == forced_call_prefix(fmt, None) == ""


def test_a_forced_bundled_call_begins_with_its_sorted_first_key():
    prefix = forced_call_prefix("bundled", "required")
    parsed = parse_output(prefix + '":{"city":"Oslo"},"name":"get_weather"}</a>', "bundled")
    assert [c["name"] for c in parsed.tool_calls] == ["get_weather"]
    with pytest.raises(ValueError, match="no tool-call format"):
        forced_call_prefix("none", "required")


_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
]


def test_content_a_grammar_wrote_is_returned_as_written():
    for text in (" oslo", "   \n", "yes "):
        assert parse_output(text, "bundled", reasoning=False, calls=False, exact=True).content == text
        assert parse_output(text, "bundled", reasoning=False, calls=False).content == text.strip()


def test_the_space_before_a_stop_string_is_kept():
    assert parse_output("Bo lives in ", "qwen3_json", keep_end=True).content == "Bo lives in "
    assert parse_output("Bo lives in ", "qwen3_json").content == "Bo lives in"


@pytest.mark.parametrize(
    ("fmt", "text", "content", "name", "arguments"),
    [
        ("bundled", '{"arguments":{"city":"Os', "", None, '{"city":"Os'),
        ("bundled", '{"arguments":{"city":"Oslo"},"name":"get_w', "", "get_weather", '{"city": "Oslo"}'),
        ("qwen3_json", 'Sure.\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "U', "Sure.", "get_time", None),
        (
            "qwen3_5_xml",
            "Hi\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=unit>\nc",
            "Hi",
            "get_weather",
            '{"city": "Oslo"}',
        ),
    ],
)
def test_a_call_cut_by_max_tokens_is_never_content_and_comes_back_partial(fmt, text, content, name, arguments):
    out = parse_output(text, fmt, _TOOLS, cut=True)
    assert out.content == content and out.tool_calls == []
    if name is None:  # the name is not written yet, and two tools could be it
        assert out.partial_call is None
        named = parse_output(text, fmt, _TOOLS, cut=True, named="get_weather").partial_call
        assert named["name"] == "get_weather" and named["arguments"] == arguments
    else:
        assert out.partial_call["name"] == name and out.partial_call["id"].startswith("call_")
        if arguments is not None:
            assert out.partial_call["arguments"] == arguments
        else:
            assert out.partial_call["arguments"].startswith('{"zone": "U')
    uncut = parse_output(text, fmt, _TOOLS)
    assert uncut.partial_call is None


def test_a_bundled_call_writes_every_character_as_itself():
    """A name in another script goes into an argument as the question wrote it, so a model copies it."""
    text = format_call("lookup_customer", {"name": "你好 Δήμητρα"})
    assert "你好 Δήμητρα" in text and "\\u" not in text
    assert parse_output(text, "bundled") == parse_output(json.dumps(json.loads(text)), "bundled")
