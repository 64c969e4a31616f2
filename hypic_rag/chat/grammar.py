"""The grammar of a chat answer: what ``tool_choice``, the offered tools and ``response_format`` allow the model to
write, in the chat format's own text, as llguidance Lark (``hypic_rag.grammar``).

- ``required`` or a named function: one call (or, with ``parallel_tool_calls``, several) to an offered tool (the
  named one), its arguments valid under the tool's ``parameters`` schema, and nothing else.
- ``auto`` with tools: content, or calls to offered tools only; content cannot hold a call tag, so a call the
  parser would read is always one of these. In the Qwen formats a reasoning block may come first.
- ``response_format`` (no call forced): the content is the JSON (or regex, or choice) it asks for; with tools
  offered under ``auto``, that or calls.

The grammar describes the answer after any reasoning the engine closed itself and includes a forced call's
opening (``ChatFormat.call_opening``), which the engine writes and feeds to the grammar before decoding. Tags are
written as the added tokens that spell them where the tokenizer has them, the form the model was trained on.
XML-format string parameters (raw text, not JSON) are held to their ``enum``/``const``, lengths, ``pattern``
(searched, as JSON Schema reads it: anchored only where it says ``^``/``$``) and ``format`` (``STRING_FORMATS``,
written here as regexes because llguidance keeps its own inside its JSON compiler); another format is a
``ValueError``, not a constraint silently dropped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..grammar import COMPACT, SPACED, GrammarTokenizer, json_lark, lark_regex, lark_string, response_lark
from ..json_schema import check_schema, is_object_schema, wrapped
from .formats import BUNDLED, NONE, QWEN3_5_XML, QWEN3_JSON, ChatFormat
from .formats.qwen3_5_xml import FUNCTION_CLOSE, FUNCTION_OPEN, PARAMETER_CLOSE, _types
from .formats.tagged import TOOL_CLOSE, TOOL_OPEN
from .tool_calls import THINK_CLOSE, THINK_OPEN

ANY = "(.|\\n)*"
_BUNDLED_ARGUMENTS = '{"arguments":'  # how a bundled call begins (``bundled.format_call``: sorted keys)


def tool_signatures(tools: Sequence[Mapping[str, Any]] | None) -> list[tuple[str, dict[str, Any]]]:
    """``(name, parameters schema)`` of each offered function tool (bare or ``{"type": "function", ...}``)."""
    out = []
    for tool in tools or ():
        fn = tool.get("function", tool) if isinstance(tool, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            continue
        params = fn.get("parameters")
        schema = dict(params) if isinstance(params, Mapping) else {}
        schema.setdefault("type", "object")
        out.append((fn["name"], schema))
    return out


def check_tools(tools: Sequence[Mapping[str, Any]] | None) -> None:
    """A ``ValueError`` naming the tool whose ``parameters`` is not a JSON schema object (OpenAI's 400) or is too
    large to hold (``json_schema.check_schema``); time linear in the tools' size."""
    for i, tool in enumerate(tools or ()):
        fn = tool.get("function", tool) if isinstance(tool, Mapping) else None
        if isinstance(fn, Mapping) and fn.get("parameters") is not None:
            check_schema(fn["parameters"], f"tools.{i}.function.parameters")


def _literal(text: str) -> str:
    """``text`` as a regex matching itself, for inside a Lark ``/.../``."""
    return re.escape(text).replace("/", "\\/")


def _without(*texts: str) -> str:
    """A Lark token body: any text that holds none of ``texts``."""
    words = "|".join(_literal(t) for t in texts)
    return f"/{ANY}/ & ~/{ANY}({words}){ANY}/"


class _Rules:
    """Lark rules being written: ``add`` names a rule once, ``text`` is the grammar."""

    def __init__(self, tokenizer: GrammarTokenizer) -> None:
        self.tokenizer, self.lines = tokenizer, []  # type: list[str]
        self.count = 0

    def add(self, body: str, prefix: str = "r", lazy: bool = False) -> str:
        self.count += 1
        name = f"{prefix}{self.count}"
        self.lines.append(f"{name}{'[lazy]' if lazy else ''}: {body}")
        return name

    def token(self, body: str) -> str:
        self.count += 1
        name = f"T{self.count}"
        self.lines.append(f"{name}: {body}")
        return name

    def text(self, start: str) -> str:
        return "\n".join([f"start: {start}", *self.lines]) + "\n"

    def tag(self, text: str) -> str:
        return self.tokenizer.tag(text)

    def until(self, tag: str) -> str:
        """Any text up to and including ``tag``: lazy where the tag is text (a greedy lexeme would swallow it)."""
        if self.tokenizer.is_token(tag):
            return f"{self.token(_without(tag))} {self.tag(tag)}"
        return self.add(f"/{ANY}/ {lark_string(tag)}", "u", lazy=True)


# -- one call in each format ----------------------------------------------------------------------------------------


def _bundled_call(rules: _Rules, name: str, schema: dict[str, Any]) -> str:
    """``{"arguments":{...},"name":"NAME"}``: compact JSON, sorted keys, as ``bundled.format_call`` writes it."""
    head = lark_string(_BUNDLED_ARGUMENTS)
    tail = lark_string(',"name":' + json.dumps(name) + "}")
    return f"{head} {json_lark(schema, COMPACT, sort_keys=True)} {tail}"


def _qwen3_json_rest(rules: _Rules, name: str, schema: dict[str, Any]) -> str:
    """A Qwen3 call after its ``<tool_call>``, as the template writes one."""
    head = lark_string('\n{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments": ')
    return f"{head} {json_lark(schema, SPACED)} {lark_string('}' + chr(10))} {rules.tag(TOOL_CLOSE)}"


def _xml_value(rules: _Rules, schema: Any) -> str:
    """A parameter's value and its ``\\n</parameter>``: JSON for typed values (``convert_value`` reads them
    back), text for strings."""
    close = lark_string("\n" + PARAMETER_CLOSE)
    schema = schema if isinstance(schema, Mapping) else {}
    types = _types(schema)
    if types and types <= {"string"}:
        choices = schema.get("enum") if "enum" in schema else [schema["const"]] if "const" in schema else None
        if isinstance(choices, list) and choices and all(isinstance(c, str) for c in choices):
            return "(" + " | ".join(lark_string(c) for c in choices) + f") {close}"
        low, high = schema.get("minLength", 0), schema.get("maxLength")
        length = f"{{{int(low)},{int(high)}}}" if isinstance(high, int) else f"{{{int(low)},}}" if low else "*"
        ends = f"{_literal(PARAMETER_CLOSE)}|{_literal(FUNCTION_CLOSE)}\\s*{_literal(TOOL_CLOSE)}"
        held = [f"/(.|\\n){length}/"]
        if isinstance(schema.get("pattern"), str):
            held.append(lark_regex(searched(schema["pattern"])))
        if "format" in schema:
            held.append(lark_regex(_format_regex(schema["format"])))
        body = " & ".join([*held, f"~/{ANY}({ends}){ANY}/"])
        return rules.add(f"{rules.token(body)} {close}", "v", lazy=True)
    if not types and not schema:
        return rules.add(f"{rules.token(_without(PARAMETER_CLOSE))} {close}", "v", lazy=True)
    return f"{json_lark(dict(schema), SPACED)} {close}"


# each month's days; February to the 28th, as leap years are past a regex worth writing
_DATE = (
    r"[0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))"
)
_TIME = r"([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
# ASCII classes throughout: the regex engine's \d and \w are Unicode's.
STRING_FORMATS = {
    "date": _DATE,
    "time": _TIME,
    "date-time": f"{_DATE}[Tt]{_TIME}",
    "email": f"[A-Za-z0-9.!#$%&'*+=?^_`{{|}}~-]+@{_LABEL}(\\.{_LABEL})+",
    "hostname": f"{_LABEL}(\\.{_LABEL})*",
    "ipv4": f"({_OCTET}\\.){{3}}{_OCTET}",
    "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    "uri": r"[A-Za-z][A-Za-z0-9+.-]*:[!#-;=?-\[\]_a-z~]*",  # printable ASCII but space, "<>\^`{|}
}


def _format_regex(name: Any) -> str:
    if name not in STRING_FORMATS:
        held = ", ".join(STRING_FORMATS)
        raise ValueError(f"string format {name!r} cannot be held in the XML tool-call format (held: {held})")
    return STRING_FORMATS[name]


def _branches(pattern: str) -> list[str]:
    """``pattern`` split at its top-level ``|`` (outside groups, classes and escapes)."""
    out, depth, klass, at, i = [], 0, False, 0, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if klass:
            klass = c != "]"
        elif c == "[":
            klass = True
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            out.append(pattern[at:i])
            at = i + 1
        i += 1
    return [*out, pattern[at:]]


def searched(pattern: str) -> str:
    """A JSON Schema ``pattern`` (matched anywhere in the string) as a regex the whole text must match: each
    top-level branch free before it unless it begins with ``^``, after it unless it ends with an unescaped ``$``."""
    whole = []
    for branch in _branches(pattern):
        head = branch.startswith("^")
        core = branch[1:] if head else branch
        body = core[:-1]
        tail = core.endswith("$") and (len(body) - len(body.rstrip("\\"))) % 2 == 0  # an even run of \ before $
        core = body if tail else core
        whole.append(f"({'' if head else ANY}({core}){'' if tail else ANY})")
    return "|".join(whole)


def _qwen3_5_xml_rest(rules: _Rules, name: str, schema: dict[str, Any]) -> str:
    """A Qwen3.5 call after its ``<tool_call>``: ``<function=NAME>``, a ``<parameter=KEY>`` per property in the
    schema's order (the required ones always), ``</function>``."""
    props = schema.get("properties") if isinstance(schema.get("properties"), Mapping) else {}
    required = set(schema.get("required") or ())
    items = []
    for key, prop in props.items():
        param = f"{lark_string(f'<parameter={key}>' + chr(10))} {_xml_value(rules, prop)} {lark_string(chr(10))}"
        items.append(f"({param})" + ("" if key in required else "?"))
    head = lark_string("\n" + FUNCTION_OPEN + name + ">\n")
    return f"{head} {' '.join(items)} {lark_string('</function>' + chr(10))} {rules.tag(TOOL_CLOSE)}"


Rest = Callable[[_Rules, str, dict[str, Any]], str]
_TAGGED: dict[str, tuple[Rest, tuple[str, ...]]] = {
    QWEN3_JSON.name: (_qwen3_json_rest, (TOOL_OPEN,)),
    QWEN3_5_XML.name: (_qwen3_5_xml_rest, (TOOL_OPEN, FUNCTION_OPEN)),  # content may not hold a bare call either
}

CALL_FORMATS = (*_TAGGED, BUNDLED.name)  # the formats with a call syntax


# -- the answer -----------------------------------------------------------------------------------------------------


def no_call_bans(fmt: ChatFormat, tokenizer: GrammarTokenizer) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """With no tool offered, the tokens that keep an answer from the format's call syntax, as ``(always, first)``
    (``logits.Banned``): the bundled model's call is the whole answer, so its first token may not open it with a
    ``{``; a tagged format's call opens with its ``<tool_call>`` token. None where a ban cannot do it (a tag
    that is plain text: ``answer_grammar`` holds the answer then)."""
    if fmt.name == BUNDLED.name:
        return (), tokenizer.openers(b"{")
    if fmt.name in _TAGGED:
        return ((tokenizer.token_id(TOOL_OPEN),), ()) if tokenizer.is_token(TOOL_OPEN) else None
    return (), ()


def answer_grammar(
    fmt: ChatFormat,
    tokenizer: GrammarTokenizer,
    *,
    tools: Sequence[Mapping[str, Any]] | None,
    choice: str | None,
    parallel: bool = True,
    response_format: Mapping[str, Any] | None = None,
    thinking: bool = False,
) -> str | None:
    """The Lark grammar of the answer (see the module docstring), or None when nothing constrains it.

    ``choice`` is ``chosen_tool``'s; ``thinking``: the prompt opened a reasoning block the answer continues
    (the engine closes it itself before a forced call or a response format)."""
    signatures = tool_signatures(tools) if choice != "none" else []
    forced = choice not in (None, "auto", "none")
    if forced:
        signatures = [s for s in signatures if choice == "required" or s[0] == choice]
        if not signatures:
            raise ValueError(f"tool_choice {choice!r} names no offered function tool")
    if fmt is NONE or fmt.name not in CALL_FORMATS:
        signatures = []  # a template with no call format: content only
    if not signatures and response_format is None:
        if fmt.name in _TAGGED and no_call_bans(fmt, tokenizer) is None:  # no tools: content without a call tag
            rules = _Rules(tokenizer)
            return rules.text(f"{_reasoning(rules, thinking)}{rules.token(_without(*_TAGGED[fmt.name][1]))}")
        return None
    rules = _Rules(tokenizer)
    separators = COMPACT if fmt.name == BUNDLED.name else SPACED
    content = response_lark(response_format, separators) if response_format is not None else None
    if fmt.name == BUNDLED.name:
        return rules.text(_bundled(rules, signatures, forced, content))
    if not signatures:
        assert content is not None
        return rules.text(content)
    rest, tags = _TAGGED[fmt.name]
    rests = " | ".join(f"({rest(rules, name, schema)})" for name, schema in signatures)
    call_rest = rules.add(rests, "c")
    opening = rules.tag(TOOL_OPEN)
    more = f'("\\n" {opening} {call_rest})*' if parallel else ""
    if forced:
        return rules.text(f"{opening} {call_rest} {more}")
    if content is not None:  # the asked-for content, or calls
        return rules.text(f"{_reasoning(rules, thinking)}({content} | {opening} {call_rest} {more})")
    text = rules.token(_without(*tags))
    if tokenizer.is_token(TOOL_OPEN):
        calls = f"{text} {opening} {call_rest} {more}"
    else:  # the text before the tag, and the tag, as one lazy lexeme: it ends at the tag's first occurrence
        before = rules.token(_without(*tags[1:])) if len(tags) > 1 else f"/{ANY}/"
        calls = f"{rules.add(f'{before} {opening}', 'l', lazy=True)} {call_rest} {more}"
    return rules.text(f"{_reasoning(rules, thinking)}({text} | {calls})")


def _reasoning(rules: _Rules, thinking: bool) -> str:
    """The reasoning block an ``auto`` answer may begin with (must, when the prompt opened it), then a space."""
    if thinking:
        return f"{rules.until(THINK_CLOSE)} "
    if rules.tokenizer.is_token(THINK_OPEN):
        return f"({rules.tag(THINK_OPEN)} {rules.until(THINK_CLOSE)})? "
    return ""


def _bundled(rules: _Rules, signatures: list[tuple[str, dict[str, Any]]], forced: bool, content: str | None) -> str:
    """The bundled model's answer: a call is the whole answer, so content must not begin with ``{`` (it would
    read as one) unless it is the asked-for JSON."""
    calls = [f"({_bundled_call(rules, name, schema)})" for name, schema in signatures]
    if forced:
        return " | ".join(calls)
    if content is None:
        content = rules.token("/\\s*/ | /\\s*[^\\s{]" + ANY + "/")
    return " | ".join([content, *calls])


# -- a response schema as a call ------------------------------------------------------------------------------------

RESPONSE_TOOL = "json_answer"  # the response tool's name where the schema has none
VALUE_KEY = "value"  # the argument that holds a response whose root is not an object


@dataclass(frozen=True)
class AnswerShape:
    """What the model is asked for once a response schema is offered as a call (``schema_as_call``): the tools
    to render and constrain, the tool choice, the response format left to hold the content to, and the name of
    the call whose arguments are the content (None: no such call)."""

    tools: list[dict[str, Any]] | None
    choice: str | None
    response_format: Mapping[str, Any] | None
    response_tool: str | None = None
    value_key: str | None = None  # a root that is not an object stands as this one argument (``wrapped``)

    def unwrap(self, content: str, calls: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
        """The content and calls of an answer: a call to the response tool is the content, as JSON; a call cut
        before it closed (``max_new_tokens``) leaves the JSON written so far, without the call around it."""
        if self.response_tool is None:
            return content, calls
        answers = [c for c in calls if c["name"] == self.response_tool]
        if not answers:
            head = _BUNDLED_ARGUMENTS + ("{" + json.dumps(self.value_key) + ":" if self.value_key else "")
            return content.removeprefix(head), calls
        value = answers[0]["arguments"]
        if self.value_key is not None:
            value = value.get(self.value_key) if isinstance(value, dict) else value
        text = json.dumps(value, ensure_ascii=False)
        return text, [c for c in calls if c["name"] != self.response_tool]


def schema_as_call(
    fmt: ChatFormat,
    tools: Sequence[Mapping[str, Any]] | None,
    choice: str | None,
    response_format: Mapping[str, Any] | None,
) -> AnswerShape:
    """The bundled model was trained to write JSON only as a call's arguments, after reading the tool's schema,
    so it is given a JSON response format as a tool it must call (or call one of the offered tools, under
    ``auto``); other formats write the JSON as content. A forced call leaves no content to format."""
    listed = [dict(t) for t in tools] if tools and choice != "none" else None
    kind = (response_format or {}).get("type")
    if fmt.name != BUNDLED.name or kind not in ("json_object", "json_schema"):
        return AnswerShape(listed, choice, response_format)
    if choice not in (None, "auto", "none"):
        return AnswerShape(listed, choice, None)
    assert response_format is not None
    description = "the answer"
    if kind == "json_schema":
        spec = response_format["json_schema"]
        name, schema = spec.get("name") or RESPONSE_TOOL, dict(spec["schema"])
        description = spec.get("description") or description
    else:
        name, schema = RESPONSE_TOOL, {"type": "object"}
    key = None if is_object_schema(schema) else VALUE_KEY
    if key is not None:  # a call's arguments are an object: any other root is held as one argument
        schema = wrapped(schema, key)
    taken = {n for n, _ in tool_signatures(listed)}
    while name in taken:
        name += "_"
    tool = {"type": "function", "function": {"name": name, "description": description, "parameters": schema}}
    return AnswerShape([*(listed or []), tool], "required", None, name, key)
