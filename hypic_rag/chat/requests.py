"""A chat request as the engine starts it (``ChatRequests.prepare``): the messages rendered with the checkpoint's
template and cut into segments, the tools and the response format as the model is asked for them, a forced
call's opening after the prompt, the answer's grammar (or, with no tool offered, the bans that keep it from a
call), and how its output is parsed back into content, reasoning and calls. ``ChatRequests.check`` compiles the
same grammar before a request is admitted."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

from ..grammar import SPACED, GrammarTokenizer, asks_json, compile_checked, json_lark, refused, response_lark
from ..inputs import as_list
from ..logits import Banned
from ..options import RequestOptions
from ..outputs import GenerationOutput
from ..plan import Prompt
from ..prepare import Prepared
from ..segments import Segment
from .caller_text import literal_pieces
from .conversation import ChatSetup, thinking_opened
from .grammar import (
    CALL_FORMATS,
    AnswerShape,
    answer_grammar,
    check_tools,
    no_call_bans,
    schema_as_call,
    tool_signatures,
)
from .segmentation import RenderedPrompt, segment_prompt
from .tool_calls import THINK_CLOSE, chosen_tool, forced_call_prefix, parse_output


class ChatEngine(Protocol):
    """What a chat request reads of its engine (``engine.Engine``)."""

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

    def prepare(
        self,
        messages: Sequence[Mapping[str, Any]],
        options: RequestOptions,
        tools: Sequence[Mapping[str, Any]] | None,
        tool_choice: str | Mapping[str, Any] | None,
        parallel_tool_calls: bool,
    ) -> Prepared:
        """The request ``Engine.start_chat`` starts, under ``options`` with their defaults filled."""
        setup = self.setup()
        shape, _ = self.answer_shape(tools, tool_choice, parallel_tool_calls, options)
        tools = shape.tools
        rendered, prompt = self.render(messages, tools, options.chat_template_kwargs, options.segmentation)
        thinking = thinking_opened(rendered.text)
        structured = shape.response_format is not None
        rendered, prompt, opening_ids = self.force_call(rendered, prompt, shape.choice, thinking, structured)
        forced = rendered.answer_prefix
        # The reasoning the template opened is closed before a forced call or a formatted answer; an answer whose
        # grammar leaves no room for reasoning is parsed without looking for one.
        closed = thinking and bool(forced)
        forced_choice = shape.choice not in (None, "auto", "none")
        free_reasoning = not (closed or structured or forced_choice)
        grammar = None
        if tools or structured or setup.format.name in CALL_FORMATS:
            grammar = self.answer_lark(shape, parallel_tool_calls, thinking and not closed)
        free_reasoning = free_reasoning or grammar is None
        offered = bool(tool_signatures(tools)) and shape.choice != "none"
        # content a grammar wrote (a regex, a choice, a schema): returned, and streamed, exactly as written
        exact = structured and not offered and shape.response_tool is None and grammar is not None
        banned = None
        if not offered and grammar is None:
            bans = no_call_bans(setup.format, self.engine.grammar_tokenizer(setup.end_of_turn_ids))
            banned = Banned(*bans) if bans is not None and any(bans) else None
        # Call ids hash the prompt too, so a call repeated later in a conversation gets a new id.
        seed_text = hashlib.sha256(rendered.text.encode()).hexdigest()[:16]

        def finalize(out: GenerationOutput) -> GenerationOutput:
            written = forced + (out.text or "")
            if not free_reasoning:
                written = written.removeprefix(THINK_CLOSE + "\n\n") if closed else written
            parsed = parse_output(
                written,
                setup.format,
                tools,
                thinking_open=thinking,
                id_seed=seed_text,
                reasoning=free_reasoning,
                calls=offered,
                exact=exact,
                # a response format asked as a call keeps the JSON written so far as its content (``unwrap``)
                cut=out.finish_reason == "length" and shape.response_tool is None,
                keep_end=out.stopped_at_string,
                named=shape.choice if shape.choice not in (None, "auto", "none", "required") else None,
            )
            content, calls = shape.unwrap(parsed.content, parsed.tool_calls)
            return replace(
                out, text=content, tool_calls=calls, reasoning=parsed.reasoning, partial_call=parsed.partial_call
            )

        return Prepared(
            prompt,
            ends=tuple(setup.end_of_turn_ids),
            grammar=grammar,
            opening_ids=opening_ids,
            banned=banned,
            closing=forced_choice or asks_json(shape.response_format),
            finalize=finalize,
            thinking=thinking,
            forced=forced,
            exact=exact,
            rendered=rendered,
        )

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

    def check(
        self,
        messages: Sequence[Mapping[str, Any]],
        options: RequestOptions,
        tools: Sequence[Mapping[str, Any]] | None,
        tool_choice: str | Mapping[str, Any] | None,
        parallel_tool_calls: bool,
    ) -> None:
        """``Engine.check_chat``: the grammar ``prepare`` would hold the answer to, compiled and kept, or a
        ``ValueError`` naming the field it cannot hold."""
        setup = self.setup()
        shape, choice = self.answer_shape(tools, tool_choice, parallel_tool_calls, options)
        if options.response_format is None and not (tools and choice != "none"):
            return  # nothing the request wrote to compile
        rendered = segment_prompt(
            setup.template,
            messages,
            tools=shape.tools,
            chat_template_kwargs=options.chat_template_kwargs,
            segmentation=options.segmentation,
        )
        thinking = thinking_opened(rendered.text)
        closed = bool(forced_call_prefix(setup.format, shape.choice)) or shape.response_format is not None
        lark = self.answer_lark(shape, parallel_tool_calls, thinking and not closed)
        if lark is None:
            return
        tokenizer = self.engine.grammar_tokenizer(setup.end_of_turn_ids)
        try:
            tokenizer.matcher(lark)
        except ValueError as exc:
            # Which field: each piece on its own (only on this failing path, so a good request compiles once).
            if options.response_format is not None:
                lark = "start: " + response_lark(options.response_format, SPACED)
                compile_checked(tokenizer, lark, "response_format")
            for i, (_, schema) in enumerate(tool_signatures(tools if choice != "none" else None)):
                compile_checked(tokenizer, "start: " + json_lark(schema), f"tools.{i}.function.parameters")
            raise refused("tools" if tools and choice != "none" else "response_format", exc) from None
