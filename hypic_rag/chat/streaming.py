"""An answer's text, as it grows, split into reasoning and content deltas that never need taking back.

``parse_output`` splits a finished answer; a stream must send pieces before the answer is finished, and a
piece once sent cannot be unsent. So ``AnswerStream`` sends only what the final split will keep: reasoning up
to ``</think>``, then content up to the first tool-call tag, holding back trailing whitespace (the final split
strips it) and any tail that could be the start of a tag. Tool calls are sent whole when the answer is done
(``finish``), as they are only known then. A forced call opening (``Generation.answer_prefix``) means the answer
is a call: nothing is streamed and ``finish`` sends it all.

One case cannot be streamed safely: an answer that closes a reasoning block its prompt never opened (a bare
``</think>``, which ``split_reasoning`` reads as the end of reasoning) has had its start sent as content. The
stream then sends no more content than it had; the finished output is still split correctly.

Written here because the split follows our own parser (``tool_calls``), which no streaming library knows.
"""

from __future__ import annotations

from ..decoding import partial_suffix
from .formats import ChatFormat, get_format
from .tool_calls import THINK_CLOSE, THINK_OPEN, ParsedOutput

REASONING, CONTENT = "reasoning", "content"
Delta = tuple[str, str]  # (REASONING or CONTENT, text)


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
    ) -> None:
        """``exact``: the answer is content a grammar wrote (``Generation.exact_content``), sent as it comes."""
        self.fmt, self.thinking_open, self.exact = get_format(fmt), thinking_open, exact
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
            return []
        if self.exact:
            return self._advance(CONTENT, self.text)
        reasoning, content = self._views()
        return self._advance(REASONING, reasoning) + self._advance(CONTENT, content)

    def finish(self, parsed: ParsedOutput) -> list[Delta]:
        """What is left to send of the final split (tool calls aside): the rest of each part, where what was
        sent begins it. Where it does not (the parser read the text otherwise), nothing more of that part."""
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
