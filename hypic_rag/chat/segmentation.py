"""Messages → the checkpoint's own prompt text → segments.

The prompt text is exactly what the chat template renders (``render``); the segments only say where
that text is cut. To find the cuts the template is rendered a second time with every piece of
content that could become a segment replaced by a private-use marker; the literal text between the
markers is the template's glue (role headers, the tools preamble, separators). The real rendering
must equal the marked one with each marker put back (allowing for a template that trims content);
where it does not, the prompt falls back to fewer cuts, then to none, so the text never changes.

Which content becomes a piece:

- ``explicit``: text parts that carry ``"hypic": {"kind": ...}``.
- ``auto`` (the default) also: each tool schema (found as the template's JSON of it), earlier turns
  (user, assistant and tool messages other than the final question), and plain content cut at
  content-defined boundaries (``content_pieces``): so a document that recurs is one piece wherever
  it appears, even after a header line such as ``Context:``.
- ``none``: no cuts; the whole prompt is the query.

A template may mark where its own units begin with the variable ``hypic_boundary`` (empty outside
hypic-rag, so transformers renders the same text); the bundled model's does, so that each unit
(``<doc>...</doc>\\n``) is one segment, tags included, as the model was trained. Without it, glue stands
alone and runs in context. Everything from the final question (or, without one, after the last
cacheable piece) to the end is the query.

Written here because no library cuts rendered chat prompts into reusable pieces.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..inputs import as_list
from ..segments import KINDS, Segment

SEGMENTATIONS = ("explicit", "auto", "none")
ROLES = ("system", "user", "assistant", "tool")
QUESTION = "question"  # a piece kind of its own: where the query begins
GLUE = "glue"
BOUNDARY = "\ue000|\ue001"
_MARK = re.compile("\ue000(\\d+)\ue001|\ue000\\|\ue001")
_STRUCTURAL = re.compile(r"^[^\w]{3,}$|^.{0,80}:$")  # a rule of punctuation, or a header ending in ':'
MAX_PARAGRAPH_CHARS = 2000  # a paragraph longer than this is cut at its lines
RESERVED_TEMPLATE_VARIABLES = ("messages", "tools", "add_generation_prompt", "hypic_boundary")  # set by the rendering


@dataclass(frozen=True)
class RenderedPrompt:
    """The template's text, cut into segments (cached pieces and in-context glue) and the query."""

    text: str
    segments: list[Segment]
    query: Segment
    messages: list[dict[str, Any]]  # what the template was given (``plain_messages``)
    token_ids: list[int] | None = None  # the prompt's ids: each segment's, then the query's (``Engine.render``)
    answer_prefix: str = ""  # text past the template's, that the answer is made to begin with (a forced call)


# -- messages ------------------------------------------------------------------------------------


def _part_kind(part: Mapping[str, Any], where: str) -> str | None:
    meta = part.get("hypic")
    if meta is None:
        return None
    kind = meta.get("kind") if isinstance(meta, Mapping) else None
    if kind not in KINDS:
        raise ValueError(f"{where}: hypic kind must be one of {', '.join(KINDS)}, got {kind!r}")
    return kind


def plain_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """What the template is given: each list content becomes the concatenation of its text parts, as
    API.md's ``plain``; where parts carry a kind they are kept beside it as ``hypic_parts``
    (``{"text", "kind"}``), which templates that know hypic-rag read and others ignore. A prompt has one
    question: a second ``query`` part would replace the first, so it is a ValueError."""
    listed = not isinstance(messages, (str, bytes, Mapping)) and isinstance(messages, Iterable)
    if not listed or not (messages := list(messages)):  # read once: a generator too
        raise ValueError("messages must be a non-empty list of {'role', 'content'} dicts")
    out = []
    question: str | None = None  # where the query part is
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ValueError(f"message {i} must be a dict with 'role' and 'content', got {type(message).__name__}")
        role = message.get("role")
        if role not in ROLES:
            raise ValueError(f"message {i}: role must be one of {', '.join(ROLES)}, got {role!r}")
        content = message.get("content")
        plain = dict(message)
        if isinstance(content, list):
            parts = []
            for j, part in enumerate(content):
                where = f"message {i} part {j}"
                if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise ValueError(f"{where}: only text parts {{'type': 'text', 'text': str}} can be rendered")
                parts.append({"text": part["text"], "kind": _part_kind(part, where)})
                if parts[-1]["kind"] == "query":
                    if question is not None:
                        raise ValueError(f"{where}: a second query part ({question} is one); a prompt has one question")
                    question = where
            plain["content"] = "".join(p["text"] for p in parts)
            if any(p["kind"] for p in parts):
                plain["hypic_parts"] = parts
        elif content is not None and not isinstance(content, str):
            raise ValueError(f"message {i}: content must be a string, a list of text parts or None")
        elif content is None and role != "assistant":
            raise ValueError(f"message {i}: a {role} message needs content")
        out.append(plain)
    return out


def content_pieces(text: str, max_chars: int = MAX_PARAGRAPH_CHARS) -> list[tuple[bool, str]]:
    """``(is_piece, run)`` runs whose concatenation is ``text``: paragraphs (runs of non-blank lines)
    are pieces; blank lines, the whitespace around paragraphs and structural lines (a header ending in
    ':', a rule of punctuation) are glue; a paragraph over ``max_chars`` is cut at its lines."""
    runs: list[tuple[bool, str]] = []
    paragraph: list[str] = []

    def glue(s: str) -> None:
        if not s:
            return
        if runs and not runs[-1][0]:
            runs[-1] = (False, runs[-1][1] + s)
        else:
            runs.append((False, s))

    def piece(s: str) -> None:
        core = s.strip()
        if not core:
            glue(s)
            return
        start = s.index(core)
        glue(s[:start])
        runs.append((True, core))
        glue(s[start + len(core) :])

    def flush() -> None:
        body = "".join(paragraph)
        paragraph.clear()
        if len(body) > max_chars:
            for line in body.splitlines(keepends=True):
                piece(line)
        elif body:
            piece(body)

    for line in text.splitlines(keepends=True):
        stripped = line.strip()
        if not stripped or _STRUCTURAL.match(stripped):
            flush()
            glue(line)
        else:
            paragraph.append(line)
    flush()
    return runs


def flat_units(text: str) -> list[tuple[str, str]]:
    """A flat prompt's ``(kind, text)`` units, for ``segment_units`` (the completions route) or a format that
    writes documents as parts (the bundled model's): ``content_pieces``' paragraphs are documents, its glue is
    glue, and the last paragraph (with what follows it) is the question."""
    units = [("document" if piece else GLUE, run) for piece, run in content_pieces(text)]
    last = max((i for i, (kind, _) in enumerate(units) if kind != GLUE), default=None)
    if last is not None:
        units[last] = (QUESTION, units[last][1])
    return units


# -- marking -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Piece:
    kind: str  # a segment kind, QUESTION, or "tool"
    text: str


def _mark(text: str, kind: str, pieces: list[_Piece], cut: bool) -> str:
    """``text`` with its pieces replaced by markers; ``cut`` splits it at content-defined boundaries."""
    if not text.strip():
        return text
    if not cut:
        pieces.append(_Piece(kind, text))
        return f"\ue000{len(pieces) - 1}\ue001"
    out = []
    for is_piece, run in content_pieces(text):
        if is_piece:
            pieces.append(_Piece(kind, run))
            run = f"\ue000{len(pieces) - 1}\ue001"
        out.append(run)
    return "".join(out)


def _marked_messages(plain: list[dict[str, Any]], mode: str) -> tuple[list[dict[str, Any]], list[_Piece]]:
    """The messages with their candidate pieces replaced by markers, and the pieces in order."""
    pieces: list[_Piece] = []
    last = len(plain) - 1
    marked = []
    for i, message in enumerate(plain):
        role = message["role"]
        parts = message.get("hypic_parts") or [{"text": message.get("content") or "", "kind": None}]
        is_question = role == "user" and i == last
        untagged = [j for j, p in enumerate(parts) if not p["kind"]]
        new_parts = []
        for j, part in enumerate(parts):
            text, kind = part["text"], part["kind"]
            if kind:
                text = _mark(text, QUESTION if kind == "query" else kind, pieces, cut=False)
            elif mode == "auto":
                if is_question or role == "system":
                    before = len(pieces)
                    text = _mark(text, "document", pieces, cut=True)
                    if is_question and untagged and j == untagged[-1] and len(pieces) > before:
                        pieces[-1] = _Piece(QUESTION, pieces[-1].text)
                    elif role == "system" and len(pieces) == before + 1:
                        pieces[-1] = _Piece("system", pieces[-1].text)
                else:
                    text = _mark(text, "turn", pieces, cut=len(text) > MAX_PARAGRAPH_CHARS)
            new_parts.append({"text": text, "kind": kind})
        copy = dict(message)
        if message.get("content") is not None:
            copy["content"] = "".join(p["text"] for p in new_parts)
        if "hypic_parts" in message:
            copy["hypic_parts"] = new_parts
        marked.append(copy)
    return marked, pieces


def _reconstruct(marked: str, text: str, pieces: list[_Piece]) -> list[tuple[str, str | int]] | None:
    """The marked rendering's items with each piece's text as it appears in ``text``: ``("lit", s)``,
    ``("piece", index)`` with the piece's rendered text, ``("bound", "")``; None if they disagree."""
    items: list[tuple[str, Any]] = []
    pos = 0
    at = 0
    matches = list(_MARK.finditer(marked))
    for n, m in enumerate(matches):
        lit = marked[at : m.start()]
        if text[pos : pos + len(lit)] != lit:
            return None
        if lit:
            items.append(("lit", lit))
        pos += len(lit)
        at = m.end()
        if m.group(1) is None:
            items.append(("bound", ""))
            continue
        piece = pieces[int(m.group(1))]
        following = marked[at : matches[n + 1].start()] if n + 1 < len(matches) else marked[at:]
        for candidate in dict.fromkeys((piece.text, piece.text.strip(), piece.text.rstrip(), piece.text.lstrip())):
            end = pos + len(candidate)
            if text[pos:end] == candidate and text[end : end + len(following)] == following:
                items.append(("piece", (int(m.group(1)), candidate)))
                pos = end
                break
        else:
            return None
    if text[pos:] != marked[at:]:
        return None
    if marked[at:]:
        items.append(("lit", marked[at:]))
    return items


def _tool_texts(tools: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """The ways a template may have written each tool schema (transformers' ``tojson`` variants)."""
    out = []
    for tool in tools:
        forms = [json.dumps(tool, ensure_ascii=False, indent=indent) for indent in (None, 2, 4)]
        forms += [json.dumps(tool, ensure_ascii=False, separators=(",", ":")), json.dumps(tool)]
        out.append(list(dict.fromkeys(forms)))
    return out


def _split_tools(text: str, tool_forms: list[list[str]]) -> list[tuple[str, str]]:
    """Glue text cut around the tool schemas it holds: ``("tool", json)`` and ``(GLUE, rest)`` runs."""
    runs = [(GLUE, text)]
    for forms in tool_forms:
        for form in forms:
            done = False
            for k, (kind, run) in enumerate(runs):
                if kind == GLUE and form in run:
                    a = run.index(form)
                    new = [(GLUE, run[:a]), ("tool", form), (GLUE, run[a + len(form) :])]
                    runs[k : k + 1] = [r for r in new if r[1]]
                    done = True
                    break
            if done:
                break
    return runs


def _units(items: list[tuple[str, Any]], pieces: list[_Piece], tool_forms: list[list[str]]) -> list[tuple[str, str]]:
    """``(kind, text)`` units: at the template's boundaries where it marks them, else at piece edges."""
    units: list[tuple[str, str]] = []
    if any(kind == "bound" for kind, _ in items):
        current: list[tuple[str, Any]] = []
        for item in [*items, ("bound", "")]:
            if item[0] != "bound":
                current.append(item)
                continue
            text = "".join(v if k == "lit" else v[1] for k, v in current)
            kinds = [pieces[v[0]].kind for k, v in current if k == "piece"]
            if kinds:
                units.append((kinds[0], text))
            elif text:
                tools = [r for r in _split_tools(text, tool_forms) if r[0] == "tool"]
                units.append(("tool" if tools else GLUE, text))
            current = []
        return units
    for kind, value in items:
        if kind == "piece":
            units.append((pieces[value[0]].kind, value[1]))
        elif kind == "lit":
            units.extend(_split_tools(value, tool_forms))
    return units


def segment_units(units: list[tuple[str, str]]) -> tuple[list[Segment], Segment]:
    """Units → segments and the query: glue runs in context and is merged with its glue neighbours; the
    query is everything from the question on (or after the last cacheable unit)."""
    start = next((i for i, (kind, _) in enumerate(units) if kind == QUESTION), None)
    if start is None:
        start = len(units)
        while start > 0 and units[start - 1][0] == GLUE:
            start -= 1
        if start == len(units):  # nothing follows the last piece: it becomes the query
            start -= 1
    query = Segment("".join(text for _, text in units[start:]), kind="query", cache=False)
    segments: list[Segment] = []
    for kind, text in units[:start]:
        if kind == GLUE:
            if segments and not segments[-1].cache:
                segments[-1] = Segment(segments[-1].text + text, kind="system", cache=False)
            else:
                segments.append(Segment(text, kind="system", cache=False))
        else:
            segments.append(Segment(text, kind="document" if kind == QUESTION else kind))
    return segments, query


def flat_prompt(text: str) -> tuple[list[Segment], Segment]:
    """A flat prompt (no chat template: the completions route's) as segments and its query."""
    return segment_units(flat_units(text))


def check_segmentation(segmentation: Any) -> None:
    if segmentation not in SEGMENTATIONS:
        raise ValueError(f"segmentation must be one of {', '.join(SEGMENTATIONS)}, got {segmentation!r}")


def check_template_kwargs(chat_template_kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """Extra template variables as a dict; the ones the rendering sets itself are refused."""
    if chat_template_kwargs is not None and (
        not isinstance(chat_template_kwargs, Mapping) or not all(isinstance(k, str) for k in chat_template_kwargs)
    ):
        raise ValueError(f"chat_template_kwargs must be a dict of names to values, got {chat_template_kwargs!r:.80}")
    kwargs = dict(chat_template_kwargs or {})
    reserved = set(RESERVED_TEMPLATE_VARIABLES) & kwargs.keys()
    if reserved:
        raise ValueError(f"chat_template_kwargs may not set {', '.join(sorted(reserved))}")
    return kwargs


def segment_prompt(
    template: Any,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    segmentation: str = "auto",
) -> RenderedPrompt:
    """Render ``messages`` with ``template`` (a ``ChatTemplate``) and cut the text into segments."""
    check_segmentation(segmentation)
    tools = as_list(tools, "tools", "OpenAI function schemas (dicts)") if tools is not None else None
    if tools is not None and not all(isinstance(t, Mapping) for t in tools):
        raise ValueError("tools must be a list of OpenAI function schemas (dicts)")
    kwargs = check_template_kwargs(chat_template_kwargs)
    plain = plain_messages(messages)
    text = template.render(plain, tools=tools or None, add_generation_prompt=True, **kwargs)
    if not text:
        raise ValueError("the chat template rendered an empty prompt")
    for mode in dict.fromkeys((segmentation, "explicit", "none")):
        if mode == "none":
            return RenderedPrompt(text, [], Segment(text, kind="query", cache=False), plain)
        marked_messages, pieces = _marked_messages(plain, mode)
        marked = template.render(
            marked_messages, tools=tools or None, add_generation_prompt=True, hypic_boundary=BOUNDARY, **kwargs
        )
        items = _reconstruct(marked, text, pieces)
        if items is not None:
            forms = _tool_texts(tools or []) if mode == "auto" else []
            segments, query = segment_units(_units(items, pieces, forms))
            return RenderedPrompt(text, segments, query, plain)
    raise AssertionError("unreachable: 'none' always returns")
