"""What a checkpoint's chat template implies for generation: where a turn ends, which tool-call format
its answers use, and whether its generation prompt opened a reasoning block."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .formats import ChatFormat, detect
from .template import ChatTemplate

_PROBE = "\ue000answer\ue001"


def end_of_turn_text(template: ChatTemplate) -> str:
    """The text the template writes right after an assistant answer, e.g. ``<|im_end|>\\n``."""
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _PROBE}]
    try:
        text = template.render(messages, add_generation_prompt=False)
    except ValueError:
        return ""
    at = text.rfind(_PROBE)
    return text[at + len(_PROBE) :] if at >= 0 else ""


def generation_prompt_text(template: ChatTemplate, **kwargs: Any) -> str:
    """The text the template writes for the answer to begin (``add_generation_prompt``), e.g.
    ``<|im_start|>assistant\n``; empty when it cannot tell."""
    messages = [{"role": "user", "content": "hi"}]
    try:
        before = template.render(messages, add_generation_prompt=False, **kwargs)
        after = template.render(messages, add_generation_prompt=True, **kwargs)
    except ValueError:
        return ""
    return after[len(before) :] if after.startswith(before) else ""


def special_ids(tokenizer: Any) -> set[int]:
    """Ids of the tokenizer's special added tokens."""
    return {i for i, token in tokenizer.get_added_tokens_decoder().items() if token.special}


@dataclass(frozen=True)
class ChatSetup:
    """A checkpoint's template with what generation needs from it."""

    template: ChatTemplate
    format: ChatFormat  # how its answers write tool calls (``formats``)
    end_of_turn_ids: tuple[int, ...]  # the special token that closes an assistant turn, if any

    @classmethod
    def build(cls, template: ChatTemplate, tokenizer: Any) -> ChatSetup:
        sources = template.templates
        source = sources.get("tool_use") or sources.get("default") or next(iter(sources.values()))
        ids: tuple[int, ...] = ()
        after = end_of_turn_text(template).lstrip(" ")
        if tokenizer is not None and after:
            first = tokenizer.encode(after, add_special_tokens=False).ids[:1]
            ids = tuple(i for i in first if i in special_ids(tokenizer))
        return cls(template, detect(source), ids)


def thinking_opened(prompt_text: str) -> bool:
    """True when the generation prompt ends inside an open ``<think>`` block, so the answer starts with
    reasoning and holds only its ``</think>``."""
    tail = prompt_text.rstrip()
    return tail.endswith("<think>")
