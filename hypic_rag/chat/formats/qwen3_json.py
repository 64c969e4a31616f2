"""Qwen3's (and Hermes') tool calls: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` blocks.

Also the format assumed for a template that takes tools but writes none of the known tags: it is the
commonest among them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from .base import Calls, ChatFormat, json_call_parts
from .partial import CallSoFar, json_call, skip_space
from .tagged import TOOL_OPEN, block_close, scan


class Qwen3Json(ChatFormat):
    name = "qwen3_json"
    call_tags = (TOOL_OPEN,)

    def matches(self, template_source: str) -> bool:
        return TOOL_OPEN in template_source

    def split_calls(self, body: str, tools: Sequence[dict] | None) -> tuple[str, Calls]:
        return scan(body, _json_block)

    def cut_call(self, body: str) -> tuple[str, str | None, str] | None:
        at = body.find(TOOL_OPEN)
        if at < 0:
            return None
        return (body[:at].rstrip(), *json_call_parts(body[at + len(TOOL_OPEN) :]))

    def calls_so_far(self, body: str, tools: Sequence[dict] | None) -> list[CallSoFar]:
        """Block after block, each read from where the one before ended (a tag inside a string is text)."""
        calls = []
        at = body.find(TOOL_OPEN)
        while at >= 0:
            call = json_call(body, at + len(TOOL_OPEN))
            if call is None:
                break
            calls.append(call)
            if call.end is None:
                break
            at = body.find(TOOL_OPEN, call.end)
        return calls

    def call_opening(self, name: str | None) -> str:
        return TOOL_OPEN + "\n" + ("" if name is None else '{"name": ' + json.dumps(name) + ', "arguments":')


def _json_block(text: str, i: int) -> tuple[Calls, int] | None:
    """One ``{"name", "arguments"}`` object then ``</tool_call>``; decoded in place so strings may hold the tags."""
    i = skip_space(text, i)
    try:
        obj, i = json.JSONDecoder().raw_decode(text, i)
    except ValueError:
        return None
    end = block_close(text, i)
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


QWEN3_JSON = Qwen3Json()
