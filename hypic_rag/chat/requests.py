"""The steps of preparing a chat request (``prepare.Preparer.chat`` runs them): the messages rendered with the
checkpoint's template and cut into segments, the tools and the response format as the model is asked for them, a
forced call's opening after the prompt, and the answer's grammar, compiled, with the field it cannot hold named."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

from ..grammar import SPACED, GrammarTokenizer, compile_checked, json_lark, refused, response_lark, response_schema
from ..inputs import as_list
from ..options import RequestOptions
from ..plan import Prompt
from ..segments import Segment
from .caller_text import literal_pieces
from .conversation import ChatSetup
from .grammar import (
    AnswerShape,
    answer_grammar,
    check_tools,
    schema_as_call,
    tool_signatures,
)
from .segmentation import RenderedPrompt, segment_prompt
from .tool_calls import THINK_CLOSE, chosen_tool, forced_call_prefix


class ChatEngine(Protocol):
    """What a chat request reads of its preparer (``prepare.Preparer``)."""

    name: str
    tokenizer: Any
    chat_setup: ChatSetup | None

    def _require_tokenizer(self) -> Any: ...

    def _check_context(self, tokens: int) -> None: ...

    def build_prompt(self, segments: Sequence[Segment], query: str | Segment) -> Prompt: ...

    def encode(self, text: str) -> list[int]: ...

    def grammar_tokenizer(self, stop_ids: Sequence[int] = ()) -> GrammarTokenizer: ...


class ChatRequests:
    """One engine's chat side, over its template, tokenizer and grammar tokenizers."""

    def __init__(self, engine: ChatEngine) -> None:
        self.engine = engine

    def setup(self) -> ChatSetup:
        engine = self.engine
        if engine.chat_setup is None:
            raise ValueError(f"checkpoint {engine.name!r} has no chat template; use generate() with segments")
        engine._require_tokenizer()
        return engine.chat_setup

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        chat_template_kwargs: Mapping[str, Any] | None,
        segmentation: str,
    ) -> tuple[RenderedPrompt, Prompt]:
        """The rendered prompt and its tokenized form, tokenized once for both."""
        setup = self.setup()
        rendered = segment_prompt(
            setup.template,
            messages,
            tools=tools,
            chat_template_kwargs=chat_template_kwargs,
            segmentation=segmentation,
        )
        engine = self.engine
        segments, query = literal_pieces(engine.tokenizer, setup.template, rendered, tools, chat_template_kwargs)
        prompt = engine.build_prompt(segments, query)
        return replace(rendered, token_ids=prompt.ids), prompt

    def force_call(
        self, rendered: RenderedPrompt, prompt: Prompt, force_call: str | None, thinking: bool, structured: bool = False
    ) -> tuple[RenderedPrompt, Prompt, list[int]]:
        """``force_call`` (``"required"`` or a tool's name) ends the prompt with the opening of a call
        (``answer_prefix``), after closing the reasoning block the template opened (``thinking``), which a
        ``structured`` answer (a response format) closes too; also the opening's tokens."""
        opening = forced_call_prefix(self.setup().format, force_call)
        close = THINK_CLOSE + "\n\n" if thinking and (opening or structured) else ""
        if not opening and not close:
            return rendered, prompt, []
        # Tokenized on its own, as the model writes it after the prompt: across the boundary BPE would merge
        # it with the generation prompt into tokens the model never produced there.
        engine = self.engine
        opening_ids = engine.encode(opening) if opening else []
        prompt = replace(prompt, query=prompt.query + (engine.encode(close) if close else []) + opening_ids)
        engine._check_context(len(prompt.ids))
        forced = close + opening
        rendered = replace(rendered, text=rendered.text + forced, answer_prefix=forced, token_ids=prompt.ids)
        return rendered, prompt, opening_ids

    def answer_shape(
        self,
        tools: Sequence[Mapping[str, Any]] | None,
        tool_choice: str | Mapping[str, Any] | None,
        parallel_tool_calls: bool,
        options: RequestOptions,
    ) -> tuple[AnswerShape, str | None]:
        """The request's tools, tool choice and response format checked and as the model is asked for them
        (``schema_as_call``), and the tool choice as asked."""
        setup = self.setup()
        tools = as_list(tools, "tools", "tool schemas (dicts)") if tools is not None else None
        check_tools(tools)
        choice = chosen_tool(tool_choice, tools)
        if not isinstance(parallel_tool_calls, bool):
            raise ValueError(f"parallel_tool_calls must be true or false, got {parallel_tool_calls!r}")
        return schema_as_call(setup.format, tools, choice, options.response_format), choice

    def answer_lark(self, shape: AnswerShape, parallel: bool, thinking: bool) -> str | None:
        """The answer's grammar (``chat.grammar.answer_grammar``), or None when nothing constrains it."""
        setup = self.setup()
        return answer_grammar(
            setup.format,
            self.engine.grammar_tokenizer(setup.end_of_turn_ids),
            tools=shape.tools,
            choice=shape.choice,
            parallel=parallel,
            response_format=shape.response_format,
            thinking=thinking,
        )

    def compile(
        self,
        lark: str,
        options: RequestOptions,
        tools: Sequence[Mapping[str, Any]] | None,
        choice: str | None,
    ) -> None:
        """``lark`` compiled and kept for the engine, or a ``ValueError`` naming the field it cannot hold."""
        tokenizer = self.engine.grammar_tokenizer(self.setup().end_of_turn_ids)
        try:
            tokenizer.matcher(lark)
        except ValueError as exc:
            # Which field: each piece on its own (only on this failing path, so a good request compiles once).
            if options.response_format is not None:
                lark = "start: " + response_lark(options.response_format, SPACED)
                compile_checked(tokenizer, lark, "response_format", *response_schema(options.response_format))
            for i, (_, schema) in enumerate(tool_signatures(tools if choice != "none" else None)):
                where = f"tools.{i}.function.parameters"
                compile_checked(tokenizer, "start: " + json_lark(schema), where, schema)
            raise refused("tools" if tools and choice != "none" else "response_format", exc) from None
