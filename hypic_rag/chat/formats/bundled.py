"""The bundled model's own format, what its chat template does not say.

The prompt side's one home is the bundled checkpoint's chat template (``assets/default_model/chat_template.jinja``,
``bundled_template``): it wraps every piece in its kind's tag, newline-terminated, so a segment's tokens never
depend on its neighbours, and ends the prompt with the question and the answer tag ``ANSWER``. The model was
trained on normalised text (whitespace collapsed, compact JSON with sorted keys, ASCII-escaped), so
``prepare_messages`` writes a framework's messages that way.

The answer side: the model ends an answer with ``END`` (its EOS token) and writes a tool call as the whole
answer, as ``format_call`` does; ``parse_call`` reads one back; ``tool_step`` gives one tool-loop step as
messages in the form the model was trained on.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from ..segmentation import GLUE, QUESTION, flat_units
from .base import Calls, ChatFormat, format_tool_result, json_call_parts
from .partial import CallSoFar, json_call

if TYPE_CHECKING:
    from ..template import ChatTemplate

ANSWER = "<a>"
END = "</a>"
QUESTION_TAG = "<q>"


@lru_cache(maxsize=1)
def bundled_template() -> ChatTemplate:
    """The bundled model's chat template: the prompt format it was trained on."""
    from ...model.loading import default_model_path
    from ..template import ChatTemplate

    template = ChatTemplate.from_checkpoint(default_model_path())
    if template is None:
        raise RuntimeError(f"the bundled model at {default_model_path()} has lost its chat template")
    return template


def collapse_space(text: str) -> str:
    """Runs of whitespace as one space, none at the ends: how the bundled model's training text was written."""
    return " ".join(text.split())


def format_call(name: str, arguments: dict) -> str:
    """A tool call as the model writes it: compact JSON with sorted keys, every character as itself (a name in
    another script is copied into an argument, not escaped)."""
    return json.dumps({"name": name, "arguments": arguments}, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


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


def _arguments_text(arguments: Any) -> str:
    """A call's arguments as the model was trained to read them: compact JSON, sorted keys, ASCII-escaped."""
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments, separators=(",", ":"), sort_keys=True)


def tool_step(call_id: str, name: str, arguments: dict, result: Any) -> list[dict]:
    """One tool-loop step as OpenAI messages (the assistant's call, then the tool's result) in the form the
    bundled model was trained on: arguments as JSON with sorted keys, the result as
    ``format_tool_result(result, ensure_ascii=True)``. Its template renders the two as one ``turn``."""
    function = {"name": name, "arguments": _arguments_text(arguments)}
    return [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": call_id, "type": "function", "function": function}],
        },
        {"role": "tool", "tool_call_id": call_id, "content": format_tool_result(result, ensure_ascii=True)},
    ]


class Bundled(ChatFormat):
    name = "bundled"
    call_is_whole_answer = True

    def matches(self, template_source: str) -> bool:
        return QUESTION_TAG in template_source and ANSWER in template_source

    def split_calls(self, body: str, tools: Sequence[dict] | None) -> tuple[str, Calls]:
        """One compact JSON call and nothing else, or content."""
        body = body[: -len(END)].rstrip() if body.endswith(END) else body
        if body.startswith("{"):
            try:
                json.loads(body)  # the whole answer, not a call followed by prose
            except ValueError:
                return body, []
            call = parse_call(body)
            if call is not None:
                return "", [(call["name"], call["arguments"])]
        return body, []

    def cut_call(self, body: str) -> tuple[str, str | None, str] | None:
        body = body.lstrip()
        if not body.startswith('{"'):
            return None
        return ("", *json_call_parts(body))

    def calls_so_far(self, body: str, tools: Sequence[dict] | None) -> list[CallSoFar]:
        """The one call the answer is, once it opens as a call does (``{"arguments"``; ``{"name"`` too)."""
        body = body.lstrip()
        if not body.startswith(('{"arguments"', '{"name"')):
            return []
        call = json_call(body)
        return [call] if call is not None else []

    def call_opening(self, name: str | None) -> str:
        """The model writes ``arguments`` before ``name`` (sorted keys), so only a call is forced, not which; the
        opening stops where the model's own tokens of it stop (it writes ``":{"`` as one token)."""
        return '{"arguments'

    def may_become_call(self, text: str) -> bool:
        return text.startswith("{")

    def prepare_messages(
        self, messages: Sequence[Mapping[str, Any]], segmentation: str = "auto"
    ) -> list[dict[str, Any]]:
        """Messages in the form the model was trained on: plain text with its whitespace collapsed (an
        assistant's only right-stripped), each part of a kind stripped (an empty one dropped), the parts of a
        kind that follow a message's text moved after it as a message of their own (the template writes a
        message's parts before its text; the last user message's go before the question anyway), tool results
        and calls' arguments as compact ASCII-escaped JSON. A prompt without a question is a ``ValueError``.

        Under ``segmentation="auto"`` flat text is cut as the completions route cuts a flat prompt
        (``segmentation.flat_units``), since this template cuts only at parts: in the question's message (the
        last user message) every paragraph but the last becomes a ``document`` part, and in a system message
        every paragraph but the first (its instruction), when neither holds parts of a kind already. The text
        around them (headers such as ``Context:``, the question) stays in order as the question's or the
        instruction's text, so nothing is dropped and a document pasted into a prompt is one ``<doc>`` segment,
        found again in any order."""
        last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
        cut = segmentation == "auto"
        out: list[dict[str, Any]] = []
        for i, message in enumerate(messages):
            out.extend(_prepared(message, i == last_user, f"message {i}", cut))
        if not _has_question(out):
            raise ValueError("the prompt has no question: the last user message has no text outside its documents")
        return out


BUNDLED = Bundled()


def _parts(content: Any) -> list[tuple[str | None, str]]:
    """``(kind or None, text)`` of a message's content (a string, a list of text parts, or None)."""
    if content is None:
        return []
    if isinstance(content, str):
        return [(None, content)]
    return [((p.get("hypic") or {}).get("kind"), p.get("text") or "") for p in content]


def _message(base: Mapping[str, Any], parts: list[tuple[str | None, str]]) -> dict[str, Any]:
    """``base`` with ``parts`` as its content: a string unless some part carries a kind."""
    if any(kind for kind, _ in parts):
        content: Any = [{"type": "text", "text": t, **({"hypic": {"kind": k}} if k else {})} for k, t in parts]
    else:
        content = "".join(t for _, t in parts)
    return {**base, "content": content}


def _flat_parts(text: str, question: bool) -> list[tuple[str | None, str]]:
    """Flat text as ``document`` parts and the rest (``Bundled.prepare_messages``): the paragraphs but the
    question (``question``) or but the first (an instruction) are documents."""
    units = flat_units(text)
    pieces = [i for i, (kind, _) in enumerate(units) if kind != GLUE]
    keep = {i for i, (kind, _) in enumerate(units) if kind == QUESTION} if question else set(pieces[:1])
    documents = [("document", collapse_space(t)) for i, (kind, t) in enumerate(units) if kind != GLUE and i not in keep]
    rest = " ".join(t for i, (kind, t) in enumerate(units) if kind == GLUE or i in keep)
    return [*documents, (None, rest)] if documents else [(None, text)]


def _prepared(message: Mapping[str, Any], last_user: bool, where: str, cut: bool) -> list[dict[str, Any]]:
    role = message.get("role")
    if role == "tool":
        text = "".join(t for _, t in _parts(message.get("content")))
        return [{**message, "content": format_tool_result(text, ensure_ascii=True).strip()}]
    base = dict(message)
    if base.get("tool_calls"):
        base["tool_calls"] = [_call(call) for call in base["tool_calls"]]
    parts = _parts(message.get("content"))
    if message.get("content") is None:
        return [base]
    if cut and (role == "system" or (role == "user" and last_user)) and not any(k for k, _ in parts):
        parts = _flat_parts("\n".join(t for _, t in parts), question=role == "user")
    plain = [t for k, t in parts if k is None and t.strip()]
    text = "\n".join(plain).rstrip() if role == "assistant" else collapse_space(" ".join(plain))
    queries = [collapse_space(t) for k, t in parts if k == "query"]
    if len(queries) > 1:
        raise ValueError(f"{where}: a second 'query' part (a prompt has one question: one query part)")
    if queries and text:
        raise ValueError(f"{where}: a message with a 'query' part can hold no other question text (one query part)")
    first_text = next((j for j, (k, t) in enumerate(parts) if k is None and t.strip()), len(parts))
    kinded = [(j, k, t.strip()) for j, (k, t) in enumerate(parts) if k not in (None, "query") and t.strip()]
    before = [(k, t) for j, k, t in kinded if last_user or j < first_text]
    after = [(k, t) for j, k, t in kinded if not last_user and j > first_text]
    own = before + ([(None, text)] if text else []) + [("query", q) for q in queries]
    out = [_message(base, own)]
    if after:
        out.append(_message({"role": role}, after))
    return out


def _call(call: Mapping[str, Any]) -> dict[str, Any]:
    function = call.get("function")
    if not isinstance(function, Mapping) or "arguments" not in function:
        return dict(call)
    return {**call, "function": {**function, "arguments": _arguments_text(function["arguments"])}}


def _has_question(messages: list[dict[str, Any]]) -> bool:
    users = [m for m in messages if m.get("role") == "user"]
    if not users:
        return False
    return any(kind in (None, "query") and text.strip() for kind, text in _parts(users[-1].get("content")))
