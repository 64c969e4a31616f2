"""The bundled model's prompt format, what its chat template does not say.

The format's one home is the bundled checkpoint's chat template (``assets/default_model/chat_template.jinja``,
``bundled_template``): it wraps every piece in its kind's tag, newline-terminated, so a segment's tokens never
depend on its neighbours, and ends the prompt with the question and the answer tag. Prompts are built as
messages through it (``Engine.render`` / ``Engine.chat``, ``chat.segmentation.segment_prompt``).

What is left here is the answer side: the model ends an answer with ``END`` (its EOS token), writes a tool call
as ``format_call`` does, and ``parse_call`` reads one back; ``tool_step`` gives one tool-loop step as messages in
the form the model was trained on. ``ANSWER`` is the tag the template's generation prompt ends with.

``wrap``, ``tool_schema_text`` and ``tool_turn`` remain for code that still assembles segments by hand (the
LangChain and LlamaIndex integrations); they render through the template, so they hold no copy of the format.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .chat.template import ChatTemplate

ANSWER = "<a>"
END = "</a>"
_MARK = "\ue000"  # private use: stands for a piece's body, to find the wrapper the template puts around it


@lru_cache(maxsize=1)
def bundled_template() -> ChatTemplate:
    """The bundled model's chat template: the prompt format it was trained on."""
    from .chat.template import ChatTemplate
    from .model.loading import default_model_path

    template = ChatTemplate.from_checkpoint(default_model_path())
    if template is None:
        raise RuntimeError(f"the bundled model at {default_model_path()} has lost its chat template")
    return template


def format_call(name: str, arguments: dict) -> str:
    """A tool call as the model writes it: compact JSON with sorted keys."""
    return json.dumps({"name": name, "arguments": arguments}, separators=(",", ":"), sort_keys=True)


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


def tool_step(call_id: str, name: str, arguments: dict, result: Any) -> list[dict]:
    """One tool-loop step as OpenAI messages (the assistant's call, then the tool's result) in the form the
    bundled model was trained on: arguments as JSON with sorted keys, the result as
    ``format_tool_result(result, ensure_ascii=True)``. Its template renders the two as one ``turn``."""
    from .chat.tool_calls import format_tool_result

    function = {"name": name, "arguments": json.dumps(arguments, separators=(",", ":"), sort_keys=True)}
    return [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": call_id, "type": "function", "function": function}],
        },
        {"role": "tool", "tool_call_id": call_id, "content": format_tool_result(result, ensure_ascii=True)},
    ]


# -- for code that still builds segments by hand -----------------------------------------------------------------


def wrap(kind: str, text: str) -> str:
    """A segment's full text as the bundled template renders a piece of ``kind``: ``<doc>...</doc>`` and so on,
    newline-terminated; a ``query`` is the question and the answer tag."""
    from .chat.segmentation import plain_messages
    from .segments import KINDS

    if kind not in KINDS:
        raise ValueError(f"unknown segment kind {kind!r}; expected one of {', '.join(KINDS)}")
    if kind == "query":
        return bundled_template().render([{"role": "user", "content": text}])
    part = {"type": "text", "text": text, "hypic": {"kind": kind}}
    return bundled_template().render(plain_messages([{"role": "user", "content": [part]}]), add_generation_prompt=False)


def _body(kind: str, rendered: str) -> str:
    """``rendered`` (a piece of ``kind``) without the wrapper the template puts around that kind."""
    head, tail = wrap(kind, _MARK).split(_MARK)
    if not (rendered.startswith(head) and rendered.endswith(tail)):
        raise AssertionError(f"the bundled template rendered a {kind} piece outside its wrapper: {rendered!r}")
    return rendered[len(head) : len(rendered) - len(tail)]


def tool_schema_text(schema: dict) -> str:
    """An OpenAI-format function schema as the bundled template writes it inside a ``tool`` segment."""
    return _body(
        "tool", bundled_template().render([{"role": "user", "content": ""}], tools=[schema]).removesuffix(ANSWER)
    )


def tool_turn(call: str, result: str) -> str:
    """One agent step as the bundled template writes it inside a ``turn`` segment: the call the model made
    (``format_call``'s text) and what the tool returned."""
    parsed = parse_call(call)
    if parsed is None:
        raise ValueError(f"not a tool call: {call!r:.200}")
    messages = [{"role": "user", "content": ""}, *tool_step("call", parsed["name"], parsed["arguments"], "")]
    messages[-1]["content"] = result
    return _body("turn", bundled_template().render(messages, add_generation_prompt=False))
