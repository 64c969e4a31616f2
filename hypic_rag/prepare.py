"""A request prepared for the engine: its prompt as token ids by segment, and everything about its answer that the
request's text decides (the stop ids, the grammar, a forced opening, the bans, how the output is parsed). A
``request.Request`` is built from one of these and its options; nothing in it needs the model."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .chat.segmentation import RenderedPrompt
from .logits import Banned
from .outputs import GenerationOutput
from .plan import Prompt


@dataclass
class Prepared:
    """``prompt`` (ending with a forced call's opening, whose tokens are ``opening_ids``), the template's
    end-of-turn ids (``ends``), the answer's grammar (Lark, ``hypic_rag.grammar``) or ``banned`` tokens, whether
    the answer is steered to close near its budget (``closing``), ``finalize`` (the output parsed), and what a
    stream is told: ``thinking`` (the template opened a reasoning block), ``forced`` (the text written for the
    model), ``exact`` (the content is a grammar's, as written). ``rendered`` is the chat template's text, for a
    chat request."""

    prompt: Prompt
    ends: tuple[int, ...] = ()
    grammar: str | None = None
    opening_ids: Sequence[int] = ()
    banned: Banned | None = None
    closing: bool = False
    finalize: Callable[[GenerationOutput], GenerationOutput] | None = None
    thinking: bool = False
    forced: str = ""
    exact: bool = False
    rendered: RenderedPrompt | None = None
