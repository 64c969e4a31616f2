"""The bundled model's prompt format, what its chat template does not say.

The format's one home is the bundled checkpoint's chat template (``assets/default_model/chat_template.jinja``,
``bundled_template``): it wraps every piece in its kind's tag, newline-terminated, so a segment's tokens never
depend on its neighbours, and ends the prompt with the question and the answer tag. Prompts are built as
messages through it (``Engine.render`` / ``Engine.chat``, ``chat.segmentation.segment_prompt``).

What is left here is the answer side: the model ends an answer with ``END`` (its EOS token), writes a tool call
as ``format_call`` does, and ``parse_call`` reads one back; ``tool_step`` gives one tool-loop step as messages in
the form the model was trained on. ``ANSWER`` is the tag the template's generation prompt ends with.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .chat.template import ChatTemplate

ANSWER = "<a>"
END = "</a>"


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
