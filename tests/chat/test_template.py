"""ChatTemplate renders exactly what transformers' apply_chat_template renders, for the same checkpoint files."""

from __future__ import annotations

import copy
import dataclasses
import enum
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import numpy as np
import pytest

from hypic_rag.chat import ChatTemplate
from hypic_rag.chat import template as template_module

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Das Wetter in einer Stadt <heute> & 'morgen' — °C",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "Name der Stadt, z. B. Zürich"},
                "days": {"type": "integer", "enum": [1, 2, 3]},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
    },
}
TOOLS = [WEATHER_TOOL, SEARCH_TOOL]
SYSTEM = {"role": "system", "content": "You are a concise assistant."}
QUESTION = {"role": "user", "content": "What's the weather in Zürich?"}


def _tool_call(arguments: Any, call_id: str = "call_1", name: str = "get_weather") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


DICT_ARGS = {"city": "Zürich", "days": 2, "options": {"units": "metric", "fields": ["temp", "wind"]}}
# OpenAI clients send "content": null beside tool calls; the None must disappear before rendering.
TOOL_TURNS_DICT_ARGS = [
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [_tool_call(DICT_ARGS), _tool_call({"query": "föhn"}, "c2", "search")],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21, "sky": "sunny"}'},
    {"role": "tool", "tool_call_id": "c2", "content": "Föhn: a warm dry wind."},
]
TOOL_TURNS_STRING_ARGS = [
    {"role": "assistant", "content": "", "tool_calls": [_tool_call(json.dumps({"city": "Zürich", "days": 2}))]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21, "sky": "sunny"}'},
]
HISTORY = [
    SYSTEM,
    {"role": "user", "content": "Hi!"},
    {"role": "assistant", "content": "Hello! How can I help?", "reasoning_content": "A greeting."},
    {"role": "user", "content": "Summarise: the sky is blue."},
    {"role": "assistant", "content": "<think>\nShort task.\n</think>\n\nThe sky is blue."},
    {"role": "user", "content": "And the sea?"},
]

# name -> (messages, tools, template kwargs, add_generation_prompt, templates it applies to)
SCENARIOS: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]] | None, dict[str, Any], bool, set[str]]] = {
    "user": ([{"role": "user", "content": "Hello, world"}], None, {}, True, {"qwen3", "qwen3_5", "chatml"}),
    "system": ([SYSTEM, QUESTION], None, {}, True, {"qwen3", "qwen3_5", "chatml"}),
    "tools": ([SYSTEM, QUESTION], TOOLS, {}, True, {"qwen3", "qwen3_5", "chatml"}),
    "tools_no_system": ([QUESTION], TOOLS, {}, True, {"qwen3", "qwen3_5"}),
    "tool_history_dict_args": ([SYSTEM, QUESTION, *TOOL_TURNS_DICT_ARGS], TOOLS, {}, True, {"qwen3", "qwen3_5"}),
    "tool_history_string_args": ([SYSTEM, QUESTION, *TOOL_TURNS_STRING_ARGS], TOOLS, {}, True, {"qwen3", "chatml"}),
    "thinking_on": (HISTORY, None, {"enable_thinking": True}, True, {"qwen3", "qwen3_5", "chatml"}),
    "thinking_off": (HISTORY, None, {"enable_thinking": False}, True, {"qwen3", "qwen3_5", "chatml"}),
    "thinking_off_after_tools": (
        [QUESTION, *TOOL_TURNS_DICT_ARGS],
        TOOLS,
        {"enable_thinking": False},
        True,
        {"qwen3", "qwen3_5"},
    ),
    "reasoning_after_last_query": (
        [
            QUESTION,
            {
                "role": "assistant",
                "content": "Let me check.",
                "reasoning": "Need the weather tool.",  # an older name, aliased to reasoning_content
                "tool_calls": [_tool_call({"city": "Zürich"})],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ],
        TOOLS,
        {},
        True,
        {"qwen3", "qwen3_5"},
    ),
    "list_content": (
        [
            {"role": "system", "content": [{"type": "text", "text": "  Answer from the document.\n"}]},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Document: Zürich lies on Lake Zürich.\n\n"},
                    {"type": "text", "text": "Question: which lake?  "},
                ],
            },
        ],
        None,
        {},
        True,
        {"qwen3_5"},
    ),
    "no_generation_prompt": (
        [QUESTION, {"role": "assistant", "content": "Sunny, 21 °C."}],
        None,
        {},
        False,
        {"qwen3", "qwen3_5", "chatml"},
    ),
}
# Text each template must contain for a scenario, so that a fixture mistake (tools or kwargs not reaching the
# template) cannot make both sides equal by rendering less.
EXPECTED = {
    ("qwen3", "tools"): ['{"type": "function", "function": {"name": "get_weather", "description": "Das Wetter'],
    ("qwen3_5", "tools"): ["<tools>\n{", "'morgen' — °C"],
    ("qwen3", "tool_history_dict_args"): ['"arguments": {"city": "Zürich", "days": 2', "<tool_response>\nFöhn"],
    ("qwen3", "tool_history_string_args"): ['"arguments": {"city": "Z\\u00fcrich", "days": 2}}'],
    ("qwen3_5", "tool_history_dict_args"): ['<parameter=options>\n{"units": "metric"', "<function=search>"],
    ("qwen3", "thinking_off"): ["<|im_start|>assistant\n<think>\n\n</think>\n\n"],
    ("qwen3_5", "thinking_on"): ["<|im_start|>assistant\n<think>\n"],
    ("qwen3_5", "thinking_off"): ["<|im_start|>assistant\n<think>\n\n</think>\n\n"],
    ("qwen3", "reasoning_after_last_query"): ["<think>\nNeed the weather tool.\n</think>"],
    ("qwen3_5", "list_content"): ["Document: Zürich lies on Lake Zürich.\n\nQuestion: which lake?<|im_end|>"],
    ("chatml", "tools"): ["<|im_start|>user\nWhat's the weather in Zürich?<|im_end|>"],
}
CASES = [(template, scenario) for scenario, spec in SCENARIOS.items() for template in sorted(spec[4])]


def _both(path: Path, reference_tokenizer, messages, *, tools=None, add_generation_prompt=True, **kwargs):
    """(ours, transformers') rendering of the same call; the caller's messages are left as they were."""
    before = copy.deepcopy(messages)
    ours = ChatTemplate.from_checkpoint(path).render(
        messages, tools=tools, add_generation_prompt=add_generation_prompt, **kwargs
    )
    assert messages == before
    theirs = reference_tokenizer(path).apply_chat_template(
        messages, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=False, **kwargs
    )
    return ours, theirs


@pytest.mark.parametrize(("name", "scenario"), CASES, ids=[f"{t}-{s}" for t, s in CASES])
def test_render_matches_transformers(
    name: str, scenario: str, make_checkpoint, reference_tokenizer, template_source
) -> None:
    messages, tools, kwargs, add_generation_prompt, _ = SCENARIOS[scenario]
    path = make_checkpoint(template_source(name))
    ours, theirs = _both(
        path, reference_tokenizer, messages, tools=tools, add_generation_prompt=add_generation_prompt, **kwargs
    )
    assert ours == theirs
    for fragment in EXPECTED.get((name, scenario), []):
        assert fragment in ours
    if add_generation_prompt:
        prompt = ours.rsplit("<|im_start|>", 1)[1]
        assert prompt in {"assistant\n", "assistant\n<think>\n", "assistant\n<think>\n\n</think>\n\n"}
    else:
        assert ours.endswith("<|im_end|>\n")


def test_qwen3_5_string_arguments_raise_the_templates_error(
    make_checkpoint, reference_tokenizer, template_source
) -> None:
    """The template refuses JSON-string arguments with raise_exception; we raise ValueError with its message."""
    path = make_checkpoint(template_source("qwen3_5"))
    messages = [QUESTION, *TOOL_TURNS_STRING_ARGS]
    with pytest.raises(jinja2.TemplateError) as theirs:
        reference_tokenizer(path).apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    with pytest.raises(ValueError) as ours:
        ChatTemplate.from_checkpoint(path).render(messages, tools=TOOLS)
    assert (
        str(ours.value)
        == str(theirs.value)
        == ("Tool call arguments must be a JSON object, not a string; parse them first.")
    )


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ([QUESTION, {"role": "critic", "content": "No."}], "Unexpected message role: critic"),
        ([QUESTION, SYSTEM], "System message must be at the beginning."),
    ],
)
def test_raise_exception_becomes_value_error(
    messages, message: str, make_checkpoint, reference_tokenizer, template_source
) -> None:
    path = make_checkpoint(template_source("qwen3"))
    with pytest.raises(jinja2.TemplateError, match=message):
        reference_tokenizer(path).apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    with pytest.raises(ValueError) as raised:
        ChatTemplate.from_checkpoint(path).render(messages)
    assert str(raised.value) == message


# --- finding the template in a checkpoint ---------------------------------------------------------------------------

ECHO = "{% for m in messages %}{{ m.role }}:{{ m.content }}\n{% endfor %}"


def test_chat_template_jinja_wins_over_tokenizer_config(make_checkpoint, reference_tokenizer) -> None:
    path = make_checkpoint("CONFIG {{ messages[0].content }}", jinja="JINJA {{ messages[0].content }}")
    ours, theirs = _both(path, reference_tokenizer, [QUESTION])
    assert ours == theirs == "JINJA What's the weather in Zürich?"


def test_tokenizer_config_template_is_used_without_jinja_file(make_checkpoint, reference_tokenizer) -> None:
    path = make_checkpoint("CONFIG {{ messages[0].content }}")
    ours, theirs = _both(path, reference_tokenizer, [QUESTION])
    assert ours == theirs == "CONFIG What's the weather in Zürich?"


NAMED = [
    {"name": "default", "template": "default:" + ECHO},
    {"name": "tool_use", "template": "tool_use[{{ tools|length }}]:" + ECHO},
]


@pytest.mark.parametrize(
    ("tools", "prefix"),
    [(None, "default:"), ([], "tool_use[0]:"), (TOOLS, "tool_use[2]:")],
    ids=["none", "empty", "two"],
)
def test_named_templates_pick_tool_use_when_tools_are_given(
    tools, prefix: str, make_checkpoint, reference_tokenizer
) -> None:
    """An empty tool list still selects "tool_use": transformers tests ``tools is not None``."""
    path = make_checkpoint(NAMED)
    ours, theirs = _both(path, reference_tokenizer, [QUESTION], tools=tools)
    assert ours == theirs
    assert ours.startswith(prefix)
    template = ChatTemplate.from_checkpoint(path)
    assert template.source_for(tools) == template.templates["default" if tools is None else "tool_use"]


def test_named_templates_without_default_need_tools(make_checkpoint, reference_tokenizer) -> None:
    path = make_checkpoint([{"name": "tool_use", "template": ECHO}])
    with pytest.raises(ValueError, match="no default"):
        reference_tokenizer(path).apply_chat_template([QUESTION], tokenize=False)
    template = ChatTemplate.from_checkpoint(path)
    with pytest.raises(ValueError, match="no 'default'.*tool_use"):
        template.render([QUESTION])
    assert template.render([QUESTION], tools=TOOLS) == "user:What's the weather in Zürich?\n"


def test_additional_chat_templates_directory(make_checkpoint, reference_tokenizer) -> None:
    path = make_checkpoint(
        "CONFIG",
        jinja="default:" + ECHO,
        files={"additional_chat_templates/tool_use.jinja": "tool_use:{{ tools[0].function.name }}"},
    )
    template = ChatTemplate.from_checkpoint(path)
    assert sorted(template.templates) == ["default", "tool_use"]
    for tools in (None, TOOLS):
        ours, theirs = _both(path, reference_tokenizer, [QUESTION], tools=tools)
        assert ours == theirs
    assert ours == "tool_use:get_weather"


def test_no_template_gives_none(make_checkpoint, tmp_path: Path) -> None:
    assert ChatTemplate.from_checkpoint(make_checkpoint()) is None
    assert ChatTemplate.from_checkpoint(tmp_path) is None  # no tokenizer_config.json at all


def test_jinja_file_without_tokenizer_config(tmp_path: Path) -> None:
    source = "{{ messages[0].content }}|{{ eos_token is defined }}|{{ tools is none }}|{{ documents is none }}"
    (tmp_path / "chat_template.jinja").write_text(source)
    template = ChatTemplate.from_checkpoint(tmp_path)
    assert template.special_tokens == {}
    assert template.render([QUESTION]) == "What's the weather in Zürich?|False|True|True"


def test_unreadable_tokenizer_config_names_the_file(make_checkpoint) -> None:
    path = make_checkpoint()
    (path / "tokenizer_config.json").write_text('{"chat_template": "x",', encoding="utf-8")
    with pytest.raises(ValueError, match=r"tokenizer_config\.json: not readable JSON"):
        ChatTemplate.from_checkpoint(path)


def test_syntax_error_names_the_file_and_line(make_checkpoint) -> None:
    path = make_checkpoint(jinja="{% for m in messages %}\n{{ m.content }}\n{% endif %}\n")
    with pytest.raises(ValueError) as raised:
        ChatTemplate.from_checkpoint(path)
    assert str(path / "chat_template.jinja") in str(raised.value)
    assert "line 3" in str(raised.value)
    assert isinstance(raised.value.__cause__, jinja2.TemplateSyntaxError)


def test_syntax_error_in_tokenizer_config_template(make_checkpoint) -> None:
    path = make_checkpoint([{"name": "default", "template": ECHO}, {"name": "tool_use", "template": "{{ tools |"}])
    with pytest.raises(ValueError, match=r"tokenizer_config\.json \(chat_template 'tool_use'\).*line 1"):
        ChatTemplate.from_checkpoint(path)
    with pytest.raises(ValueError, match="does not compile"):
        ChatTemplate("{% if %}")


# --- special tokens -----------------------------------------------------------------------------------------------

SHOW_TOKENS = (
    "{{ bos_token }}|{{ eos_token }}|{{ pad_token }}|{{ unk_token }}|{{ image_token }}|{{ audio_token }}"
    "|{{ mask_token is defined }}"
)


def _added_token(content: str) -> dict[str, Any]:
    return {
        "__type": "AddedToken",
        "content": content,
        "lstrip": False,
        "normalized": False,
        "rstrip": False,
        "single_word": False,
        "special": True,
    }


def test_special_tokens_as_transformers_passes_them(make_checkpoint, reference_tokenizer) -> None:
    path = make_checkpoint(
        SHOW_TOKENS,
        config={
            "bos_token": "<|endoftext|>",
            "eos_token": _added_token("<|im_end|>"),
            "image_token": "<|image_pad|>",
            "extra_special_tokens": {"audio_token": "<|audio_pad|>"},
            "add_bos_token": False,
        },
    )
    template = ChatTemplate.from_checkpoint(path)
    assert template.special_tokens == reference_tokenizer(path).special_tokens_map
    ours, theirs = _both(path, reference_tokenizer, [QUESTION])
    assert ours == theirs == "<|endoftext|>|<|im_end|>|<|endoftext|>|<unk>|<|image_pad|>|<|audio_pad|>|False"


@pytest.mark.parametrize("with_decoder", [False, True], ids=["legacy", "added_tokens_decoder"])
def test_special_tokens_map_json_overrides_old_configs(
    with_decoder: bool, make_checkpoint, reference_tokenizer
) -> None:
    """Only a config without ``added_tokens_decoder`` is old enough for special_tokens_map.json to count."""
    decoder = {"3": {key: value for key, value in _added_token("<|im_end|>").items() if key != "__type"}}
    path = make_checkpoint(
        SHOW_TOKENS,
        config={"added_tokens_decoder": decoder} if with_decoder else {},
        files={"special_tokens_map.json": json.dumps({"eos_token": {"content": "<|endoftext|>"}, "bos_token": "<s>"})},
    )
    template = ChatTemplate.from_checkpoint(path)
    assert template.special_tokens == reference_tokenizer(path).special_tokens_map
    assert template.special_tokens["eos_token"] == ("<|im_end|>" if with_decoder else "<|endoftext|>")
    ours, theirs = _both(path, reference_tokenizer, [QUESTION])
    assert ours == theirs


def test_kwargs_override_special_tokens(make_checkpoint, reference_tokenizer) -> None:
    path = make_checkpoint("{{ eos_token }}|{{ custom }}")
    ours, theirs = _both(path, reference_tokenizer, [QUESTION], eos_token="</s>", custom=[1, "zwei"])
    assert ours == theirs == "</s>|[1, 'zwei']"


# --- the environment ------------------------------------------------------------------------------------------------


def test_tojson_is_plain_json_dumps_with_its_options(make_checkpoint, reference_tokenizer) -> None:
    source = (
        "{{ tools[0] | tojson(indent=2, sort_keys=True) }}\n{{ tools | tojson(separators=(',', ':')) }}\n"
        "{{ messages[0].content | tojson }}|{{ messages[0].content | tojson(ensure_ascii=True) }}"
    )
    path = make_checkpoint(source)
    ours, theirs = _both(path, reference_tokenizer, [{"role": "user", "content": "é <b>&'"}], tools=TOOLS)
    assert ours == theirs
    assert '"é <b>&\'"|"\\u00e9 <b>&\'"' in ours  # jinja's own tojson would escape <, >, & and '


def test_strftime_now_dict_and_namespace(make_checkpoint, reference_tokenizer) -> None:
    source = (
        "{{ strftime_now('%Y-%m-%d') }}|{{ dict(a=1, b=[2]) | tojson }}|{{ dict.fromkeys(['x', 'y'], 0) | tojson }}"
        "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}|{{ ns.n }}"
    )
    path = make_checkpoint(source)
    ours, theirs = _both(path, reference_tokenizer, [QUESTION, QUESTION])
    assert ours == theirs
    assert ours.endswith('|{"a": 1, "b": [2]}|{"x": 0, "y": 0}|2')
    assert ours.startswith(datetime.now().strftime("%Y-%m-%d")) or ours.startswith("20")


@pytest.mark.parametrize(
    "source", ["{% set ns = namespace(_hidden=1) %}", "{% set ns = namespace() %}{% set ns._hidden = 1 %}"]
)
def test_namespace_refuses_underscore_names(source: str, make_checkpoint, reference_tokenizer) -> None:
    path = make_checkpoint(source)
    with pytest.raises(jinja2.exceptions.SecurityError):
        reference_tokenizer(path).apply_chat_template([QUESTION], tokenize=False)
    with pytest.raises(ValueError, match="underscore"):
        ChatTemplate(source).render([QUESTION])


def test_generation_block_and_loop_controls(make_checkpoint, reference_tokenizer) -> None:
    """Also checks trim_blocks and lstrip_blocks: the block tags' indentation and newlines never reach the text."""
    source = """{% for m in messages %}
    {% if m.role == 'system' %}
        {% continue %}
    {% endif %}
    {% if m.role == 'tool' %}
        {% break %}
    {% endif %}
    {% generation %}
  [{{ m.role }}]
    {% endgeneration %}
{% endfor %}
"""
    path = make_checkpoint(source)
    ours, theirs = _both(path, reference_tokenizer, [SYSTEM, QUESTION, *TOOL_TURNS_DICT_ARGS, QUESTION])
    assert ours == theirs == "  [user]\n  [assistant]\n"


def test_documents_are_passed(make_checkpoint, reference_tokenizer) -> None:
    path = make_checkpoint("{% for d in documents %}<doc title={{ d.title | tojson }}>{{ d.text }}</doc>{% endfor %}")
    documents = [{"title": "Zürich", "text": "A city."}, {"title": "Bern", "text": "The capital."}]
    ours = ChatTemplate.from_checkpoint(path).render([QUESTION], documents=documents)
    theirs = reference_tokenizer(path).apply_chat_template([QUESTION], documents=documents, tokenize=False)
    assert ours == theirs == '<doc title="Zürich">A city.</doc><doc title="Bern">The capital.</doc>'
    with pytest.raises(TypeError, match="documents"):
        ChatTemplate("no documents used").render([QUESTION], documents=["just text"])


class Colour(str, enum.Enum):  # noqa: UP042 -- str() gives "Colour.RED", so rendering shows it was made plain
    RED = "red"


class Opaque:
    """An object the sandbox must never see."""


@dataclasses.dataclass
class Message:
    role: str
    content: str | None
    name: str | None = None


def test_inputs_are_plain_data_without_none_and_with_reasoning_aliases(make_checkpoint, reference_tokenizer) -> None:
    """What the template sees: None fields dropped, reasoning copied under both names in transformers' key order,
    dataclasses as dicts, str subclasses and numpy scalars as plain values, other objects as "<TypeName>"."""
    path = make_checkpoint(
        "{{ messages | tojson }}|{{ colour }}|{{ count | tojson }}|{{ thing }}|{% if flag %}yes{% else %}no{% endif %}"
    )
    messages = [
        Message("user", "hi"),
        {"role": "assistant", "content": "x", "name": None, "reasoning": "r"},
        {"role": "assistant", "content": "y", "thinking": "t", "reasoning_content": "rc"},
    ]
    kwargs = {"colour": Colour.RED, "count": np.int64(3), "thing": Opaque(), "flag": np.bool_(False)}
    ours, theirs = _both(path, reference_tokenizer, messages, **kwargs)
    assert ours == theirs
    rendered_messages = json.loads(ours.split("|")[0])
    assert rendered_messages[0] == {"role": "user", "content": "hi"}
    assert list(rendered_messages[1]) == ["thinking", "role", "content", "reasoning", "reasoning_content"]
    assert rendered_messages[2] == {"role": "assistant", "content": "y", "thinking": "t", "reasoning_content": "rc"}
    assert ours.endswith("|red|3|<Opaque>|no")


# --- refusals and caching -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tools", [[len], ["get_weather"], [("get_weather",)]], ids=["callable", "string", "tuple"])
def test_non_dict_tools_are_refused(tools, make_checkpoint, reference_tokenizer, template_source) -> None:
    path = make_checkpoint(template_source("qwen3"))
    with pytest.raises(ValueError, match="JSON schema"):
        ChatTemplate.from_checkpoint(path).render([QUESTION], tools=tools)
    with pytest.raises(ValueError):  # a builtin is no Python function, so transformers refuses it too
        reference_tokenizer(path).apply_chat_template([QUESTION], tools=tools, tokenize=False)


def test_empty_and_malformed_conversations_are_refused() -> None:
    template = ChatTemplate(ECHO)
    with pytest.raises(ValueError, match="empty conversation"):
        template.render([])
    with pytest.raises(TypeError, match="dicts"):
        template.render(["hello"])
    with pytest.raises(ValueError, match="continue_final_message"):
        template.render([QUESTION], continue_final_message=True)


def test_undefined_errors_become_value_errors() -> None:
    with pytest.raises(ValueError, match="rendering failed"):
        ChatTemplate("{{ messages[0].content + messages[0].missing.deeper }}").render([QUESTION])


def test_templates_compile_once_per_source() -> None:
    source = "{{ messages | length }} " + str(id(object()))  # a source no other test compiles
    before = template_module._compile.cache_info()
    first, second = ChatTemplate(source), ChatTemplate(source)
    after = template_module._compile.cache_info()
    assert after.misses == before.misses + 1
    assert after.hits >= before.hits + 1
    assert first.render([QUESTION]) == second.render([QUESTION]) == source.replace("{{ messages | length }}", "1")
    assert template_module._compile(source) is template_module._compile(source)


def test_constructor_with_special_tokens_and_mapping() -> None:
    template = ChatTemplate({"default": "{{ bos_token }}d", "tool_use": "{{ bos_token }}t"}, {"bos_token": "<s>"})
    assert template.render([QUESTION]) == "<s>d"
    assert template.render([QUESTION], tools=[WEATHER_TOOL]) == "<s>t"
    with pytest.raises(ValueError, match="string or a non-empty mapping"):
        ChatTemplate({})


BUNDLED_SCENARIOS = {
    "plain": ([QUESTION], None, {}),
    "system_and_tools": ([{"role": "system", "content": "Use the tools."}, QUESTION], TOOLS, {}),
    "earlier_turns": (
        [
            {"role": "user", "content": "Tell me about a book."},
            {"role": "assistant", "content": "Here is a short note on a book."},
            QUESTION,
        ],
        None,
        {"enable_thinking": False},
    ),
    "tool_history_dict_args": ([QUESTION, *TOOL_TURNS_DICT_ARGS], TOOLS, {}),
    "tool_history_string_args": ([QUESTION, *TOOL_TURNS_STRING_ARGS], TOOLS, {}),
}


@pytest.mark.parametrize("scenario", list(BUNDLED_SCENARIOS))
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_the_bundled_template_matches_transformers(
    scenario: str, add_generation_prompt: bool, make_checkpoint, reference_tokenizer
) -> None:
    from hypic_rag.model.loading import default_model_path

    messages, tools, kwargs = BUNDLED_SCENARIOS[scenario]
    path = make_checkpoint(jinja=(default_model_path() / "chat_template.jinja").read_text())
    ours, theirs = _both(
        path, reference_tokenizer, messages, tools=tools, add_generation_prompt=add_generation_prompt, **kwargs
    )
    assert ours == theirs
    assert ours.endswith("<a>") == add_generation_prompt


def test_the_bundled_template_renders_kind_tagged_parts_as_transformers_does(make_checkpoint, reference_tokenizer):
    """Parts with a kind reach the template beside the flattened content (``plain_messages``); transformers,
    given the same dicts, renders the same text: the bundled format with a segment per part."""
    from hypic_rag.chat.segmentation import plain_messages
    from hypic_rag.model.loading import default_model_path

    path = make_checkpoint(jinja=(default_model_path() / "chat_template.jinja").read_text())
    parts = [
        {"type": "text", "text": "Ana Lee lives in Oslo.", "hypic": {"kind": "document"}},
        {"type": "text", "text": "The user's dog is called Rex.", "hypic": {"kind": "memory"}},
        {"type": "text", "text": "Where does Ana live?"},
    ]
    plain = plain_messages([{"role": "system", "content": "Be brief."}, {"role": "user", "content": parts}])
    ours, theirs = _both(path, reference_tokenizer, plain)
    assert (
        ours
        == theirs
        == (
            "<sys>Be brief.</sys>\n<doc>Ana Lee lives in Oslo.</doc>\n<mem>The user's dog is called Rex.</mem>\n"
            "<q>Where does Ana live?</q>\n<a>"
        )
    )
