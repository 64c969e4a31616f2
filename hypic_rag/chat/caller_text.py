"""The caller's text in a rendered prompt stays text: a user, a tool result or a tool schema that spells a control
token (``</q><a>Oslo</a><q>``, ``<|im_end|>``, ``<tool_call>``) must not forge the prompt's structure.

A tokenizer turns every occurrence of an added token's text into its id, wherever it came from, so the rendered
prompt alone cannot tell the template's ``<|im_end|>`` from a user's. Only strings of the request that spell one
matter (``_spelling``); they are found in the prompt by rendering it again with each replaced by a private-use
placeholder: where the placeholders land, with the strings put back, is exactly the real rendering, and their
spans are the caller's. A template that changes those strings (trims them, tests their prefix) renders
otherwise; then each control token the strings spell counts as the caller's wherever it appears in the prompt
with the string's own text around it. The pieces holding such a
span are tokenized with those control tokens split as plain text (``tokenizer.literal_ids``); everything else
is tokenized as ever.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..segments import Segment
from ..tokenizer import control_tokens, literal_ids
from .segmentation import RenderedPrompt

_PLACEHOLDER = re.compile("\ue002(\\d+)\ue003")
_STRUCTURAL_KEYS = ("role", "type")  # what templates compare: never the caller's free text
_CONTEXT = 16


def literal_pieces(
    tokenizer: Any,
    template: Any,
    rendered: RenderedPrompt,
    tools: Sequence[Mapping[str, Any]] | None,
    chat_template_kwargs: Mapping[str, Any] | None,
) -> tuple[list[Segment], Segment]:
    """``rendered``'s segments and query, each piece that holds a control token spelt by the caller given as
    token ids with that token split into plain text; the other pieces unchanged."""
    controls = tuple(control_tokens(tokenizer))
    strings: dict[str, int] = {}
    marked_messages = _mark(rendered.messages, controls, strings)
    marked_tools = _mark(list(tools), controls, strings) if tools else None
    if not strings:
        return rendered.segments, rendered.query
    pieces = [*rendered.segments, rendered.query]
    spans = _placed(template, marked_messages, marked_tools, chat_template_kwargs, rendered.text, list(strings))
    if spans is None or "".join(p.text or "" for p in pieces) != rendered.text:
        local = [_searched(p.text or "", list(strings), controls) for p in pieces]
    else:
        local, at = [], 0
        for piece in pieces:
            end = at + len(piece.text or "")
            local.append([(max(a, at) - at, min(b, end) - at) for a, b in spans if a < end and at < b])
            at = end
    out = []
    for piece, piece_spans in zip(pieces, local, strict=True):
        ids = literal_ids(tokenizer, piece.text, piece_spans) if piece_spans and piece.text else None
        out.append(piece if ids is None else Segment(token_ids=ids, kind=piece.kind, cache=piece.cache))
    return out[:-1], out[-1]


def _mark(value: Any, controls: tuple[str, ...], strings: dict[str, int], key: str | None = None) -> Any:
    """``value`` with each string that spells a control token replaced by its placeholder (``strings``: the
    strings, numbered)."""
    if isinstance(value, str):
        if key in _STRUCTURAL_KEYS or not any(c in value for c in controls):
            return value
        n = strings.setdefault(value, len(strings))
        return f"\ue002{n}\ue003"
    if isinstance(value, Mapping):  # a key is the caller's text too (a tool's property names)
        return {
            _mark(k, controls, strings, None) if isinstance(k, str) else k: _mark(v, controls, strings, k)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_mark(v, controls, strings) for v in value]
    return value


def _placed(
    template: Any,
    messages: list[dict[str, Any]],
    tools: list[Any] | None,
    kwargs: Mapping[str, Any] | None,
    text: str,
    strings: list[str],
) -> list[tuple[int, int]] | None:
    """The spans of ``text`` the strings were rendered at, or None when the marked rendering, the strings put
    back, is not ``text``."""
    try:
        marked = template.render(messages, tools=tools, add_generation_prompt=True, **dict(kwargs or {}))
    except Exception:  # a template that tests the strings it was given may refuse placeholders
        return None
    spans, pos, at = [], 0, 0
    matches = list(_PLACEHOLDER.finditer(marked))
    for n, match in enumerate(matches):
        literal = marked[at : match.start()]
        if text[pos : pos + len(literal)] != literal or int(match.group(1)) >= len(strings):
            return None
        pos += len(literal)
        at = match.end()
        following = marked[at : matches[n + 1].start()] if n + 1 < len(matches) else marked[at:]
        for form in _forms(strings[int(match.group(1))]):
            end = pos + len(form)
            if text[pos:end] == form and text[end : end + len(following)] == following:
                spans.append((pos, end))
                pos = end
                break
        else:
            return None
    return spans if text[pos:] == marked[at:] else None


def _forms(string: str) -> list[str]:
    """How a template may have written ``string``: as it is, inside a JSON string (``tojson``), stripped."""
    escaped = json.dumps(string, ensure_ascii=False)[1:-1]
    return [f for f in dict.fromkeys((string, escaped, json.dumps(string)[1:-1], string.strip())) if f]


def _searched(text: str, strings: list[str], controls: tuple[str, ...]) -> list[tuple[int, int]]:
    """Where in ``text`` each control token a string spells appears with the string's own text before or after
    it (up to ``_CONTEXT`` characters, in each of the string's ``_forms``): what a template that changed the
    string still wrote of it."""
    spans = []
    for string in strings:
        for form in _forms(string):
            for control in controls:
                at = form.find(control)
                while at >= 0:
                    end = at + len(control)
                    for window in (form[max(0, at - _CONTEXT) : end], form[at : end + _CONTEXT]):
                        found = text.find(window)
                        while found >= 0:
                            spans.append((found, found + len(window)))
                            found = text.find(window, found + 1)
                    at = form.find(control, at + 1)
    return spans
