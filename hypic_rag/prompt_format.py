"""The prompt format the bundled model is trained on.

Each segment carries its own wrapper (kind tag and delimiters) inside its text, so a segment's
tokens never depend on its neighbours and it can be cached wherever it appears. The query segment
ends with the answer tag, after which the model writes its answer and then the end tag.
"""

from __future__ import annotations

import json

TAGS = {"system": "sys", "document": "doc", "tool": "tool", "memory": "mem", "turn": "turn", "query": "q"}
ANSWER = "<a>"
END = "</a>"


def wrap(kind: str, text: str) -> str:
    """A segment's full text: ``<doc>...</doc>`` and so on, newline-terminated."""
    if kind not in TAGS:
        raise ValueError(f"unknown segment kind {kind!r}; expected one of {', '.join(TAGS)}")
    tag = TAGS[kind]
    if kind == "query":
        return f"<{tag}>{text}</{tag}>\n{ANSWER}"
    return f"<{tag}>{text}</{tag}>\n"


def answer_text(answer: str) -> str:
    """What follows the query segment in training: the answer and the end tag."""
    return f"{answer}{END}"


def tool_schema_text(schema: dict) -> str:
    """An OpenAI-format function schema as a ``tool`` segment's body (compact JSON)."""
    return json.dumps(schema, separators=(",", ":"))


def format_call(name: str, arguments: dict) -> str:
    """A tool call as the model writes it: compact JSON with sorted keys."""
    return json.dumps({"name": name, "arguments": arguments}, separators=(",", ":"), sort_keys=True)


def tool_turn(call: str, result: str) -> str:
    """One agent step as a ``turn`` segment's body: the call the model made and what the tool returned."""
    return f"call: {call}\nresult: {result}"


def parse_call(text: str) -> dict | None:
    """The first JSON object in ``text`` as ``{"name": str, "arguments": dict}``, or None."""
    start = text.find("{")
    if start < 0:
        return None
    try:
        call, _ = json.JSONDecoder().raw_decode(text[start:])
    except json.JSONDecodeError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    if not isinstance(call.get("arguments"), dict):
        return None
    return {"name": call["name"], "arguments": call["arguments"]}
