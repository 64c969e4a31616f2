"""A model's output as content, reasoning and tool calls, in the format of the checkpoint's chat template.

We parse these formats ourselves: no maintained standalone library parses Qwen's tool-call formats (vLLM's and
SGLang's parsers live inside those servers and take their request objects), and the bundled model has its own.

Formats (``detect_format`` picks one from the template source):

- ``qwen3_json``: Qwen3 / Hermes, ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` blocks.
- ``qwen3_5_xml``: Qwen3.5 / Qwen3-Coder, ``<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>
  \\n</function>\\n</tool_call>``; values are text, typed from the tool's JSON schema.
- ``bundled``: the bundled model's compact JSON call (``hypic_rag.prompt_format``), the whole answer or nothing.
- ``none``: no tool calls; everything after the reasoning is content.

A block that does not parse stays in the content verbatim: a caller sees what the model wrote instead of losing it.
Calls of tools that were not offered are still calls (as in the OpenAI API); the caller decides what to do.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hypic_rag.prompt_format import ANSWER, END, parse_call

FORMATS = ("qwen3_json", "qwen3_5_xml", "bundled", "none")

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
FUNCTION_OPEN, FUNCTION_CLOSE = "<function=", "</function>"
PARAMETER_OPEN, PARAMETER_CLOSE = "<parameter=", "</parameter>"

# What a value written without a schema must look like before we read it as JSON: a JSON number, literal,
# object or array. Anything else ("007", "hello", a quoted word) stays the string the model wrote.
_JSON_LIKE = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null|\{.*\}|\[.*\]", re.DOTALL)
# The end of a function and its block, in a parameter's value: the parameter was never closed. Values may hold
# either tag alone (code that writes these formats), not the two in a row.
_BLOCK_END = re.compile(r"</function>\s*</tool_call>")
# Type names some hand-written schemas use, mapped onto JSON Schema's (as vLLM's Qwen3-Coder parser accepts).
_TYPE_ALIASES = {
    "int": "integer",
    "float": "number",
    "double": "number",
    "bool": "boolean",
    "dict": "object",
    "list": "array",
    "str": "string",
    "text": "string",
}


@dataclass(frozen=True)
class ParsedOutput:
    """What the model wrote, split: ``tool_calls`` items are ``{"id", "name", "arguments": dict}``."""

    content: str
    reasoning: str | None
    tool_calls: list[dict]


def detect_format(template_source: str | None) -> str:
    """Which parser a chat template's output needs, from the tags the template itself renders."""
    src = template_source or ""
    if "<q>" in src and ANSWER in src:
        return "bundled"
    if FUNCTION_OPEN in src and PARAMETER_OPEN in src:
        return "qwen3_5_xml"
    if TOOL_OPEN in src:
        return "qwen3_json"
    if "tools" in src or "tool_calls" in src:
        return "qwen3_json"  # the commonest format among templates that take tools
    return "none"


def split_reasoning(text: str, *, thinking_open: bool = False) -> tuple[str | None, str]:
    """``(reasoning, rest)``: the ``<think>`` block split off the start of the output.

    ``thinking_open`` says the generation prompt already opened ``<think>``, so the output starts inside the
    reasoning and holds only ``</think>``. A ``</think>`` with no ``<think>`` before it is read the same way, as a
    template may open the block without the caller knowing. Output cut off before ``</think>`` is all reasoning.
    Empty reasoning is None, as when there is no block.
    """
    body = text.lstrip()
    if body.startswith(THINK_OPEN):
        body, thinking_open = body[len(THINK_OPEN) :], True
    elif not thinking_open:
        head, sep, _ = text.partition(THINK_CLOSE)
        thinking_open = bool(sep) and THINK_OPEN not in head
    if not thinking_open:
        return None, text.strip()
    reasoning, sep, rest = body.partition(THINK_CLOSE)
    return reasoning.strip() or None, rest.strip() if sep else ""


def parse_output(
    text: str,
    fmt: str,
    tools: Sequence[dict] | None = None,
    *,
    thinking_open: bool = False,
    id_seed: str = "",
) -> ParsedOutput:
    """Split a model's output into content, reasoning and tool calls in format ``fmt`` (see ``FORMATS``).

    ``tools`` (OpenAI function schemas) type the XML format's parameter values and vet its bare ``<function=``
    calls. Call ids are ``call_`` and 12 hex digits of a hash of (position, name, arguments, ``id_seed``): stable
    for tests and caches; pass something that differs per turn (e.g. a hash of the prompt) as ``id_seed`` when a
    conversation may repeat the same call and its ids must stay unique.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown tool-call format {fmt!r}; expected one of {', '.join(FORMATS)}")
    reasoning, body = split_reasoning(text, thinking_open=thinking_open)
    if fmt == "qwen3_json":
        content, calls = _scan(body, _json_block, None)
    elif fmt == "qwen3_5_xml":
        content, calls = _scan(body, lambda s, i: _xml_block(s, i, tools), lambda s, i: _bare_function(s, i, tools))
    elif fmt == "bundled":
        content, calls = _bundled(body)
    else:
        content, calls = body, []
    tool_calls = [
        {"id": call_id(i, name, args, id_seed), "name": name, "arguments": args} for i, (name, args) in enumerate(calls)
    ]
    return ParsedOutput(content=content, reasoning=reasoning, tool_calls=tool_calls)


TOOL_CHOICES = ("auto", "none", "required")


def chosen_tool(tool_choice: Any, tools: Sequence[dict] | None) -> str | None:
    """OpenAI's ``tool_choice`` checked against the offered ``tools``: ``None``, ``"auto"``, ``"none"``,
    ``"required"``, or the name of the one tool the answer must call (given as
    ``{"type": "function", "function": {"name": ...}}``)."""
    if tool_choice is None or tool_choice in TOOL_CHOICES:
        if tool_choice == "required" and not tools:
            raise ValueError("tool_choice 'required' needs tools")
        return tool_choice
    name = None
    if isinstance(tool_choice, dict) and tool_choice.get("type", "function") == "function":
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise ValueError(
            "tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'function': {'name': ...}}, "
            f"got {tool_choice!r}"
        )
    offered = [t.get("function", {}).get("name") for t in tools or ()]
    if name not in offered:
        raise ValueError(f"tool_choice names {name!r}, which is not among the tools ({', '.join(offered) or 'none'})")
    return name


def forced_call_prefix(fmt: str, choice: str | None) -> str:
    """The text the answer is made to begin with so that it calls a tool (``choice`` ``"required"``) or the
    named one: the call's opening in the template's own format, written for the model. Empty for
    ``None``/``"auto"``/``"none"``. The bundled format writes ``arguments`` before ``name`` (sorted keys), so
    there only a call is forced, not which. Each opening stops where the model's own tokens of it stop
    (the bundled model writes ``":{"`` as one token, so its opening ends before it)."""
    if choice in (None, "auto", "none"):
        return ""
    name = None if choice == "required" else choice
    if fmt == "qwen3_json":
        return "<tool_call>\n" + ("" if name is None else '{"name": ' + json.dumps(name) + ', "arguments":')
    if fmt == "qwen3_5_xml":
        return "<tool_call>\n<function=" + ("" if name is None else name + ">\n")
    if fmt == "bundled":
        return '{"arguments'
    raise ValueError("this chat template has no tool-call format, so tool_choice cannot require a call")


def call_id(position: int, name: str, arguments: dict, seed: str = "") -> str:
    """A call's id, the same for the same call at the same place: tests and replays see stable ids."""
    key = json.dumps([position, name, arguments, seed], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "call_" + hashlib.sha1(key.encode()).hexdigest()[:12]


def format_tool_result(result: Any, *, ensure_ascii: bool = False) -> str:
    """A tool result as one canonical text, whatever JSON spacing the framework used.

    JSON objects and arrays (given as such or as JSON text) become compact JSON with sorted keys, the form the
    bundled model was trained on (``prompt_format.format_call`` and ``tool_step``), so the same
    result is the same tokens and its cache entry is found again. Other text is kept as written: a JSON scalar
    has no spacing to normalise and re-dumping would rewrite numbers such as ``1e5``. None, booleans and numbers
    are written as JSON; other objects via ``str()``. Pass ``ensure_ascii=True`` to
    escape non-ASCII as the bundled model's training data did; real checkpoints read the characters themselves.
    """
    if isinstance(result, str):
        stripped = result.strip()
        if not stripped.startswith(("{", "[")):
            return result
        try:
            value = json.loads(stripped)
        except ValueError:
            return result
        return _dump(value, ensure_ascii)
    if result is None or isinstance(result, dict | list | tuple | bool | int | float):
        return _dump(result, ensure_ascii)
    return str(result)


def _dump(value: Any, ensure_ascii: bool) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=ensure_ascii, default=str)


# A block parser reads from just after its opening tag and returns the (name, arguments) calls and its end, or None.
_Calls = list[tuple[str, dict]]
_Parser = Callable[[str, int], "tuple[_Calls, int] | None"]


def _scan(text: str, block: _Parser, bare: _Parser | None) -> tuple[str, _Calls]:
    """Calls out of ``<tool_call>`` blocks (and bare ``<function=`` ones where ``bare`` is given); the rest is content.

    A block that does not parse is kept verbatim up to its ``</tool_call>`` or the next ``<tool_call>``.
    """
    pieces: list[str] = []
    calls: _Calls = []
    pos = 0
    while True:
        start = text.find(TOOL_OPEN, pos)
        bare_start = text.find(FUNCTION_OPEN, pos) if bare is not None else -1
        if bare_start >= 0 and (start < 0 or bare_start < start):
            found = bare(text, bare_start)
            if found is None:  # prose that mentions the tag: content, and look on after it
                pieces.append(text[pos : bare_start + len(FUNCTION_OPEN)])
                pos = bare_start + len(FUNCTION_OPEN)
                continue
            pieces.append(text[pos:bare_start])
            calls.extend(found[0])
            pos = found[1]
            continue
        if start < 0:
            pieces.append(text[pos:])
            break
        pieces.append(text[pos:start])
        found = block(text, start + len(TOOL_OPEN))
        if found is None:
            end = _malformed_end(text, start)
            pieces.append(text[start:end])
            pos = end
            continue
        calls.extend(found[0])
        pos = found[1]
    return "".join(pieces).strip(), calls


def _malformed_end(text: str, start: int) -> int:
    """Where a block that did not parse ends: after its ``</tool_call>``, at the next ``<tool_call>``, or the end."""
    ends = [len(text)]
    close = text.find(TOOL_CLOSE, start)
    if close >= 0:
        ends.append(close + len(TOOL_CLOSE))
    reopen = text.find(TOOL_OPEN, start + len(TOOL_OPEN))
    if reopen >= 0:
        ends.append(reopen)
    return min(ends)


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def _block_close(text: str, i: int) -> int | None:
    """The end of a block whose body ended at ``i``: after ``</tool_call>``, or the end of output cut off there."""
    i = _skip_space(text, i)
    if text.startswith(TOOL_CLOSE, i):
        return i + len(TOOL_CLOSE)
    return i if i == len(text) else None


def _json_block(text: str, i: int) -> tuple[_Calls, int] | None:
    """One ``{"name", "arguments"}`` object then ``</tool_call>``; decoded in place so strings may hold the tags."""
    i = _skip_space(text, i)
    try:
        obj, i = json.JSONDecoder().raw_decode(text, i)
    except ValueError:
        return None
    end = _block_close(text, i)
    if end is None or not isinstance(obj, dict):
        return None
    name, args = obj.get("name"), obj.get("arguments")
    if not isinstance(name, str) or not name:
        return None
    if isinstance(args, str):  # some frameworks' histories teach the model OpenAI's string form
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            return None
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return None
    return [(name, args)], end


def _xml_block(text: str, i: int, tools: Sequence[dict] | None) -> tuple[_Calls, int] | None:
    """One or more ``<function=...>`` elements then ``</tool_call>`` (or the end of output)."""
    calls: _Calls = []
    i = _skip_space(text, i)
    while text.startswith(FUNCTION_OPEN, i):
        found = _xml_function(text, i, tools)
        if found is None:
            return None
        calls.append(found[0])
        i = _skip_space(text, found[1])
    end = _block_close(text, i)
    return (calls, end) if calls and end is not None else None


def _bare_function(text: str, i: int, tools: Sequence[dict] | None) -> tuple[_Calls, int] | None:
    """A ``<function=...>`` the model wrote without its ``<tool_call>`` opener, a known Qwen3-Coder slip.

    Taken as a call only when it parses whole and names an offered tool (any name when no tools are given); an
    orphan ``</tool_call>`` after it is part of the call.
    """
    found = _xml_function(text, i, tools)
    if found is None:
        return None
    (name, args), end = found
    if tools is not None and _schema(tools, name) is None:
        return None
    after = _skip_space(text, end)
    if text.startswith(TOOL_CLOSE, after):
        end = after + len(TOOL_CLOSE)
    return [(name, args)], end


def _tag_name(text: str, i: int, prefix: str) -> tuple[str, int] | None:
    """The NAME of ``<prefix NAME>`` at ``i`` and the index after ``>``; one line, not empty."""
    gt = text.find(">", i)
    if gt < 0:
        return None
    name = text[i + len(prefix) : gt].strip()
    if not name or "\n" in name or "<" in name:
        return None
    return name, gt + 1


def _xml_function(text: str, i: int, tools: Sequence[dict] | None) -> tuple[tuple[str, dict], int] | None:
    """``<function=NAME>`` with its ``<parameter=KEY>`` children, read in order so values may hold any tag."""
    head = _tag_name(text, i, FUNCTION_OPEN)
    if head is None:
        return None
    name, i = head
    properties = _properties(_schema(tools, name)) if tools is not None else None
    args: dict[str, Any] = {}
    while True:
        i = _skip_space(text, i)
        if text.startswith(FUNCTION_CLOSE, i):
            return (name, args), i + len(FUNCTION_CLOSE)
        if not text.startswith(PARAMETER_OPEN, i):
            return None
        param = _tag_name(text, i, PARAMETER_OPEN)
        if param is None:
            return None
        key, i = param
        close = text.find(PARAMETER_CLOSE, i)
        if close < 0:
            return None
        value = text[i:close]
        if _BLOCK_END.search(value):  # never closed: it ran into its block's end and on into the next block
            return None
        value = value[1:] if value.startswith("\n") else value
        value = value[:-1] if value.endswith("\n") else value
        schema = properties.get(key) if properties is not None else None
        args[key] = convert_value(value, schema)
        i = close + len(PARAMETER_CLOSE)


def _schema(tools: Sequence[dict] | None, name: str) -> dict | None:
    """The function schema named ``name`` among OpenAI tools (``{"type": "function", "function": {...}}`` or bare)."""
    for tool in tools or ():
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(fn, dict) and fn.get("name") == name:
            return fn
    return None


def _properties(fn: dict | None) -> dict | None:
    params = fn.get("parameters") if fn else None
    props = params.get("properties") if isinstance(params, dict) else None
    return props if isinstance(props, dict) else None


def convert_value(raw: str, schema: dict | None) -> Any:
    """An XML parameter's text as the value its JSON schema asks for; the text itself when it does not fit.

    Without a schema (unknown tool or parameter) only text that looks like a JSON number, literal, object or
    array is read as JSON, so a Qwen template's ``tojson`` of a dict round-trips and prose stays prose.
    """
    types = _types(schema)
    if not types:
        if isinstance(schema, dict) and raw in (schema.get("enum") or ()):
            return raw
        return _guess(raw)
    if types <= {"string"}:
        return raw
    stripped = raw.strip()
    if "boolean" in types and stripped.lower() in ("true", "false"):
        return stripped.lower() == "true"
    try:
        value = json.loads(stripped)
    except ValueError:
        return raw
    if value is None:
        return None if "null" in types or "string" not in types else raw
    if isinstance(value, bool):
        return value if "boolean" in types else raw
    if isinstance(value, int | float):
        if "integer" in types and (isinstance(value, int) or value.is_integer()):
            return int(value)
        return value if "number" in types else raw
    if isinstance(value, dict):
        return value if "object" in types else raw
    if isinstance(value, list):
        return value if "array" in types else raw
    return raw  # a JSON string: the schema did not ask for text, so the text is what we have


def _types(schema: dict | None) -> set[str]:
    if not isinstance(schema, dict):
        return set()
    declared = schema.get("type")
    names = [declared] if isinstance(declared, str) else declared if isinstance(declared, list) else []
    return {_TYPE_ALIASES.get(str(t).strip().lower(), str(t).strip().lower()) for t in names}


def _guess(raw: str) -> Any:
    stripped = raw.strip()
    if not _JSON_LIKE.fullmatch(stripped):
        return raw
    try:
        return json.loads(stripped)
    except ValueError:
        return raw


def _bundled(text: str) -> tuple[str, _Calls]:
    """The bundled model's answer: one compact JSON call and nothing else, or content."""
    body = text[: -len(END)].rstrip() if text.endswith(END) else text
    if body.startswith("{"):
        try:
            json.loads(body)  # the whole answer, not a call followed by prose
        except ValueError:
            return body, []
        call = parse_call(body)
        if call is not None:
            return "", [(call["name"], call["arguments"])]
    return body, []
