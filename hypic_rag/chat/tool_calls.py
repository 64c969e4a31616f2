"""A model's output as content, reasoning and tool calls, in the format of the checkpoint's chat template.

The reasoning block (``<think>``) is split off first, the same for every format; the calls are then read in the
template's own format (``formats``: one module each). Calls of tools that were not offered are still calls (as in
the OpenAI API); the caller decides what to do. Also here: OpenAI's ``tool_choice`` checked against the offered
tools, the opening a forced call begins with, and call ids.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .formats import ChatFormat, get_format

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


@dataclass(frozen=True)
class ParsedOutput:
    """What the model wrote, split: ``tool_calls`` items are ``{"id", "name", "arguments": dict}``."""

    content: str
    reasoning: str | None
    tool_calls: list[dict]
    # a call the answer began and ``max_new_tokens`` cut: ``{"id", "name", "arguments": str}``, the arguments' text
    # as far as it was written (OpenAI's API returns such a call as it is)
    partial_call: dict | None = None


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
    fmt: str | ChatFormat,
    tools: Sequence[dict] | None = None,
    *,
    thinking_open: bool = False,
    id_seed: str = "",
    reasoning: bool = True,
    calls: bool = True,
    exact: bool = False,
    cut: bool = False,
    keep_end: bool = False,
    named: str | None = None,
) -> ParsedOutput:
    """Split a model's output into content, reasoning and tool calls in format ``fmt`` (a ``formats.ChatFormat``
    or its name).

    ``tools`` (OpenAI function schemas) type the XML format's parameter values and vet its bare ``<function=``
    calls. Call ids are ``call_`` and 12 hex digits of a hash of (position, name, arguments, ``id_seed``): stable
    for tests and caches; pass something that differs per turn (e.g. a hash of the prompt) as ``id_seed`` when a
    conversation may repeat the same call and its ids must stay unique. ``reasoning=False``: the answer holds no
    reasoning block (an output grammar left no room for one), so a ``</think>`` in it is text. ``calls=False``:
    no tool was offered, so nothing in the answer is read as a call. ``exact``: the answer is content a grammar
    made (a regex, a choice, a schema), returned as written, whitespace included. ``cut``: ``max_new_tokens``
    ended it, so a call it began and did not close is never content: the content is what came before it, and the
    call comes back partial when its name is known (written, or the one tool it can be). ``keep_end``: a stop
    string ended it, and the content keeps the whitespace before it. ``named``: the tool ``tool_choice`` named,
    the one a cut call can be.
    """
    fmt = get_format(fmt)
    if reasoning:
        thought, body = split_reasoning(text, thinking_open=thinking_open)
    else:
        thought, body = None, text if exact and not calls else text.strip()
    content, found = fmt.split_calls(body, tools) if calls else (body, [])
    tool_calls = [
        {"id": call_id(i, name, args, id_seed), "name": name, "arguments": args} for i, (name, args) in enumerate(found)
    ]
    partial = None
    begun = fmt.cut_call(body) if cut and calls and not found else None
    if begun is not None:
        content, written, arguments = begun
        name = _sole_tool(written, [t for t in tools or () if named in (None, t.get("function", {}).get("name"))])
        if name is not None:
            partial = {"id": call_id(0, name, arguments, id_seed), "name": name, "arguments": arguments}
    if keep_end and not found and begun is None and content and text.rstrip().endswith(content):
        content += text[len(text.rstrip()) :]
    return ParsedOutput(content=content, reasoning=thought, tool_calls=tool_calls, partial_call=partial)


def _sole_tool(written: str | None, tools: Sequence[dict] | None) -> str | None:
    """The one offered tool whose name begins with what the call wrote of its name (all of them, before it)."""
    names = [t.get("function", {}).get("name") for t in tools or ()]
    fits = [n for n in names if isinstance(n, str) and n.startswith(written or "")]
    exact = [n for n in fits if n == written]
    return exact[0] if exact else fits[0] if len(fits) == 1 else None


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


def forced_call_prefix(fmt: str | ChatFormat, choice: str | None) -> str:
    """The text the answer is made to begin with so that it calls a tool (``choice`` ``"required"``) or the
    named one: the call's opening in the template's own format (``ChatFormat.call_opening``). Empty for
    ``None``/``"auto"``/``"none"``."""
    if choice in (None, "auto", "none"):
        return ""
    return get_format(fmt).call_opening(None if choice == "required" else choice)


def call_id(position: int, name: str, arguments: dict, seed: str = "") -> str:
    """A call's id, the same for the same call at the same place: tests and replays see stable ids."""
    key = json.dumps([position, name, arguments, seed], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "call_" + hashlib.sha1(key.encode()).hexdigest()[:12]
