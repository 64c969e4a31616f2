"""An answer's text, as it grows, split into reasoning and content deltas that never need taking back.

``parse_output`` splits a finished answer; a stream must send pieces before the answer is finished, and a
piece once sent cannot be unsent. So ``AnswerStream`` sends only what the final split will keep: reasoning up
to ``</think>``, then content up to the first tool-call tag, holding back trailing whitespace (the final split
strips it) and any tail that could be the start of a tag. A forced call opening (``Generation.answer_prefix``)
means the answer is a call: no content is streamed, and ``finish`` sends what there is.

Tool calls stream as they are written, in OpenAI's delta shape: a call's first delta carries its index, id and
name, the next ones fragments of its ``arguments``, each fragment a piece of the canonical text the parsed call's
arguments will have (``formats.partial``), so the fragments join to the final call. A call is announced once its
name is known: the bundled model writes the name after the arguments, so its calls stream from the first token
where one tool can be called (``CallStreaming.sole``), from the first key that only one tool's arguments may
hold otherwise (``CallStreaming.name_of``), and with their name where no key tells. ``finish_calls``
sends what the stream has not: the rest of each call, and the calls it never began.

One case cannot be streamed safely: an answer that closes a reasoning block its prompt never opened (a bare
``</think>``, which ``split_reasoning`` reads as the end of reasoning) has had its start sent as content. The
stream then sends no more content than it had; the finished output is still split correctly.

Written here because the split follows our own parser (``tool_calls``), which no streaming library knows.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..json_schema import allowed_keys
from ..tags import partial_suffix
from .formats import ChatFormat, get_format
from .grammar import tool_signatures
from .tool_calls import THINK_CLOSE, THINK_OPEN, ParsedOutput, split_reasoning

REASONING, CONTENT, CALL = "reasoning", "content", "call"
Delta = tuple[str, Any]  # (REASONING or CONTENT, text), or (CALL, one call's delta in OpenAI's shape)


@dataclass(frozen=True)
class CallStreaming:
    """What a stream needs to send an answer's calls as they are written: the offered tools (their schemas type
    an XML call's values), the one tool a call can be, where there is one (named by ``tool_choice``, or the only
    one offered), and the keys each tool's arguments may hold (``json_schema.allowed_keys``; None: any), which
    name a call whose name comes last once its keys fit one tool only (the grammar closes each tool's object to
    its keys)."""

    tools: tuple[Mapping[str, Any], ...] = ()
    sole: str | None = None
    keys: tuple[tuple[str, frozenset[str] | None], ...] = ()

    @classmethod
    def of(cls, tools: Sequence[Mapping[str, Any]] | None, named: str | None) -> CallStreaming:
        signatures = tool_signatures(tools)
        names = [name for name, _ in signatures]
        sole = named if named is not None else names[0] if len(names) == 1 else None
        return cls(tuple(tools or ()), sole, tuple((name, allowed_keys(schema)) for name, schema in signatures))

    def name_of(self, keys: Sequence[str]) -> str | None:
        """The one tool whose arguments may hold ``keys``, or None while several (or none) may."""
        if self.sole is not None or not keys:
            return self.sole
        fits = [name for name, allowed in self.keys if allowed is None or allowed.issuperset(keys)]
        return fits[0] if len(fits) == 1 else None


@dataclass
class _SentCall:
    id: str
    arguments: str = ""
    stale: bool = False  # the answer was read otherwise after a fragment went out


class AnswerStream:
    """Reasoning and content deltas of one answer in tool-call format ``fmt`` (a ``formats.ChatFormat`` or its
    name)."""

    def __init__(
        self,
        fmt: str | ChatFormat,
        *,
        thinking_open: bool = False,
        tools: bool = False,
        answer_prefix: str = "",
        exact: bool = False,
        calls: CallStreaming | None = None,
    ) -> None:
        """``exact``: the answer is content a grammar wrote (``Generation.exact_content``), sent as it comes.
        ``calls``: its calls stream as they are written (``Generation.call_streaming``); None, they come whole
        from ``finish_calls``."""
        self.fmt, self.thinking_open, self.exact = get_format(fmt), thinking_open, exact
        self.answer_prefix, self.calls = answer_prefix, calls
        self.sent_calls: list[_SentCall] = []
        # Where a call is the whole answer, nothing can be sent while tools are offered. A forced opening makes
        # the answer a call.
        self.hold_all = bool(answer_prefix) or (self.fmt.call_is_whole_answer and tools)
        self.text = ""
        self.sent = {REASONING: "", CONTENT: ""}
        self.frozen = {REASONING: False, CONTENT: False}
        self.tags = self.fmt.call_tags

    def feed(self, delta: str) -> list[Delta]:
        """The deltas that ``delta``, appended to the answer so far, makes safe to send."""
        self.text += delta
        if self.hold_all:
            return self._call_deltas()
        if self.exact:
            return self._advance(CONTENT, self.text)
        reasoning, content = self._views()
        return self._advance(REASONING, reasoning) + self._advance(CONTENT, content) + self._call_deltas()

    def finish_calls(self, calls: Sequence[Mapping[str, Any]]) -> list[Delta]:
        """The final ``calls`` (``protocol.wire_tool_calls(..., streamed=True)``) less what was sent of them: the
        rest of each begun call's arguments, where what was sent begins them, and each call not begun, whole."""
        out: list[Delta] = []
        for call in calls:
            index = call["index"]
            if index >= len(self.sent_calls):
                out.append((CALL, dict(call)))
                continue
            sent, final = self.sent_calls[index].arguments, call["function"]["arguments"]
            if final.startswith(sent) and len(final) > len(sent):
                out.append((CALL, {"index": index, "function": {"arguments": final[len(sent) :]}}))
        return out

    def _call_deltas(self) -> list[Delta]:
        """The calls' deltas that the text so far makes certain (see the module's docstring)."""
        if self.calls is None:
            return []
        _, body = split_reasoning(self.answer_prefix + self.text, thinking_open=self.thinking_open)
        out: list[Delta] = []
        for index, call in enumerate(self.fmt.calls_so_far(body, self.calls.tools)):
            if index == len(self.sent_calls):
                name = call.name or self.calls.name_of(call.keys)
                if name is None:
                    break  # announced in order, each once its name is known
                sent = _SentCall("call_" + uuid.uuid4().hex[:24], call.arguments)
                self.sent_calls.append(sent)
                function = {"name": name, "arguments": call.arguments}
                out.append((CALL, {"index": index, "id": sent.id, "type": "function", "function": function}))
                continue
            sent = self.sent_calls[index]
            if sent.stale or len(call.arguments) <= len(sent.arguments):
                continue
            if not call.arguments.startswith(sent.arguments):
                sent.stale = True  # read otherwise after all; finish_calls sends what still fits
                continue
            out.append((CALL, {"index": index, "function": {"arguments": call.arguments[len(sent.arguments) :]}}))
            sent.arguments = call.arguments
        return out

    def finish(self, parsed: ParsedOutput) -> list[Delta]:
        """What is left to send of the final split (tool calls aside: ``finish_calls``): the rest of each part,
        where what was sent begins it. Where it does not (the parser read the text otherwise), nothing more of it."""
        out = []
        for kind, final in ((REASONING, parsed.reasoning or ""), (CONTENT, parsed.content)):
            sent = self.sent[kind]
            if final.startswith(sent) and len(final) > len(sent):
                out.append((kind, final[len(sent) :]))
                self.sent[kind] = final
        return out

    def _views(self) -> tuple[str, str]:
        """The reasoning and the content that are safe to have sent, given the text so far."""
        text = self.text
        body = text.lstrip()
        opened = self.thinking_open
        if body.startswith(THINK_OPEN):
            body, opened = body[len(THINK_OPEN) :], True
        elif THINK_OPEN.startswith(body):
            return "", ""  # may yet be a ``<think>`` tag, which the final split strips
        if opened:
            reasoning, sep, rest = body.partition(THINK_CLOSE)
            if not sep:
                reasoning = reasoning[: len(reasoning) - partial_suffix(reasoning, (THINK_CLOSE,))]
                return reasoning.strip(), ""
            return reasoning.strip(), self._content(rest)
        if THINK_CLOSE in text:  # a block the template opened unannounced (as ``split_reasoning`` reads it)
            return "", ""
        return "", self._content(text)

    def _content(self, body: str) -> str:
        body = body.lstrip()
        cut = min((at for tag in self.tags if (at := body.find(tag)) >= 0), default=len(body))
        body = body[:cut]
        body = body[: len(body) - partial_suffix(body, (*self.tags, THINK_CLOSE))]
        return body.rstrip()

    def _advance(self, kind: str, view: str) -> list[Delta]:
        sent = self.sent[kind]
        if self.frozen[kind] or len(view) <= len(sent):
            return []
        if not view.startswith(sent):
            self.frozen[kind] = True  # the text was read otherwise after all; finish() decides
            return []
        self.sent[kind] = view
        return [(kind, view[len(sent) :])]
