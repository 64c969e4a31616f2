"""Qwen3.5's (and Qwen3-Coder's) tool calls: ``<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n
</parameter>\\n</function>\\n</tool_call>``. Values are text, typed from the tool's JSON schema (``convert_value``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from ...tags import partial_suffix
from .base import Calls, ChatFormat
from .partial import CallSoFar, canonical_text, skip_space
from .tagged import TOOL_CLOSE, TOOL_OPEN, block_close, scan

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


class Qwen3_5Xml(ChatFormat):
    name = "qwen3_5_xml"
    call_tags = (TOOL_OPEN, FUNCTION_OPEN)  # the model sometimes leaves out the block's opening tag

    def matches(self, template_source: str) -> bool:
        return FUNCTION_OPEN in template_source and PARAMETER_OPEN in template_source

    def split_calls(self, body: str, tools: Sequence[dict] | None) -> tuple[str, Calls]:
        """``tools`` (OpenAI function schemas) type the parameter values and vet bare ``<function=`` calls."""
        return scan(
            body, lambda s, i: _xml_block(s, i, tools), (FUNCTION_OPEN, lambda s, i: _bare_function(s, i, tools))
        )

    def cut_call(self, body: str) -> tuple[str, str | None, str] | None:
        """The arguments of an XML call are its parameters: those written whole, as a JSON object."""
        at = body.find(TOOL_OPEN)
        at = body.find(FUNCTION_OPEN) if at < 0 else at
        if at < 0:
            return None
        call = body[at:]
        opened = call.find(FUNCTION_OPEN)
        if opened < 0:
            return body[:at].rstrip(), None, ""
        name, gt, rest = call[opened + len(FUNCTION_OPEN) :].partition(">")
        params = {}
        for match in re.finditer(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", rest, re.DOTALL):
            params[match.group(1).strip()] = match.group(2)
        return body[:at].rstrip(), name.strip() if gt or name else None, json.dumps(params) if params else ""

    def calls_so_far(self, body: str, tools: Sequence[dict] | None) -> list[CallSoFar]:
        """Each ``<function=`` after the first call tag, its parameters as the JSON object the parsed call's
        arguments will be: a string parameter's text as it comes, any other value once its parameter closes."""
        begun = [at for at in (body.find(TOOL_OPEN), body.find(FUNCTION_OPEN)) if at >= 0]
        calls: list[CallSoFar] = []
        at = body.find(FUNCTION_OPEN, min(begun)) if begun else -1
        while at >= 0:
            call, end = _function_so_far(body, at, tools)
            calls.append(call)
            if end is None:
                break
            at = body.find(FUNCTION_OPEN, end)
        return calls

    def call_opening(self, name: str | None) -> str:
        return TOOL_OPEN + "\n" + FUNCTION_OPEN + ("" if name is None else name + ">\n")


QWEN3_5_XML = Qwen3_5Xml()


def _xml_block(text: str, i: int, tools: Sequence[dict] | None) -> tuple[Calls, int] | None:
    """One or more ``<function=...>`` elements then ``</tool_call>`` (or the end of output)."""
    calls: Calls = []
    i = skip_space(text, i)
    while text.startswith(FUNCTION_OPEN, i):
        found = _xml_function(text, i, tools)
        if found is None:
            return None
        calls.append(found[0])
        i = skip_space(text, found[1])
    end = block_close(text, i)
    return (calls, end) if calls and end is not None else None


def _bare_function(text: str, i: int, tools: Sequence[dict] | None) -> tuple[Calls, int] | None:
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
    after = skip_space(text, end)
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
        i = skip_space(text, i)
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


_HELD = ("\n" + PARAMETER_CLOSE, PARAMETER_CLOSE)  # what a string parameter's text may still turn out to end with


def _function_so_far(text: str, i: int, tools: Sequence[dict] | None) -> tuple[CallSoFar, int | None]:
    """The ``<function=`` at ``i`` as far as it is written (``Qwen3_5Xml.calls_so_far``), and where it ends once
    closed (None before)."""
    head = _tag_name(text, i, FUNCTION_OPEN)
    if head is None:
        return CallSoFar(None, ""), None
    name, j = head
    properties = _properties(_schema(tools, name)) if tools is not None else None
    out = ["{"]
    while True:
        j = skip_space(text, j)
        if text.startswith(FUNCTION_CLOSE, j):
            return CallSoFar(name, "".join(out) + "}"), j + len(FUNCTION_CLOSE)
        param = _tag_name(text, j, PARAMETER_OPEN) if text.startswith(PARAMETER_OPEN, j) else None
        if param is None:
            return CallSoFar(name, "".join(out)), None
        key, opened = param
        out.append(("" if out == ["{"] else ", ") + json.dumps(key, ensure_ascii=False) + ": ")
        schema = properties.get(key) if properties is not None else None
        close = text.find(PARAMETER_CLOSE, opened)
        value = text[opened : close if close >= 0 else len(text)]
        value = value[1:] if value.startswith("\n") else value
        if close < 0:
            types = _types(schema)
            if types and types <= {"string"}:  # text as it comes; another value once it is whole
                value = value[: len(value) - partial_suffix(value, _HELD)]
                out.append('"' + canonical_text(value))
            return CallSoFar(name, "".join(out)), None
        value = value[:-1] if value.endswith("\n") else value
        out.append(json.dumps(convert_value(value, schema), ensure_ascii=False))
        j = close + len(PARAMETER_CLOSE)


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
    """A parameter's text as the value its JSON schema asks for; the text itself when it does not fit.

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
