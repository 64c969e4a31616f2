"""A request prepared for the engine: its prompt as token ids by segment, and everything about its answer that the
request's text decides (the stop ids, the grammar, a forced opening, the bans, how the output is parsed).

``Preparer`` is the one step from what a caller sends (messages and tools, or segments and a query) to a
``Prepared``: render the chat template, keep the caller's text as text, tokenize each piece on its own, check the
prompt against the context, shape the answer, build and compile its grammar. It needs a tokenizer, a template
and the model's vocabulary and context, not the model, so a server runs it on its compile threads before a request
is queued, and a fleet's ingress (which holds no model) runs the same step to find a request's segment keys.
``request.Request`` is built from what it gives; the engine thread only builds state.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .chat.conversation import ChatSetup, generation_prompt_text, thinking_opened
from .chat.grammar import CALL_FORMATS, no_call_bans, tool_signatures
from .chat.requests import ChatRequests
from .chat.segmentation import RenderedPrompt
from .chat.streaming import CallStreaming
from .chat.template import ChatTemplate
from .chat.tool_calls import THINK_CLOSE, parse_output
from .generation_config import GenerationDefaults, eos_token_ids, read_generation_defaults
from .grammar import SPACED, GrammarTokenizer, asks_json, compile_checked, response_lark, response_schema
from .inputs import as_list
from .logits import Banned
from .model.families import config_from_file
from .options import RequestOptions
from .outputs import GenerationOutput
from .plan import Prompt
from .segments import Segment, as_query, check_unicode
from .tokenizer import load_tokenizer


@dataclass
class Prepared:
    """``prompt`` (ending with a forced call's opening, whose tokens are ``opening_ids``) and its ``options`` with
    their defaults filled; the template's end-of-turn ids (``ends``), the answer's grammar (Lark,
    ``hypic_rag.grammar``, compiled already) or ``banned`` tokens, whether the answer is steered to close near its
    budget (``closing``), ``finalize`` (the output parsed), and what a stream is told: ``thinking`` (the template
    opened a reasoning block), ``forced`` (the text written for the model), ``exact`` (the content is a grammar's,
    as written). ``rendered`` is the chat template's text, for a chat request."""

    prompt: Prompt
    options: RequestOptions
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
    calls: CallStreaming | None = None  # how a stream sends the answer's calls as they are written; None: whole


class Preparer:
    """A checkpoint's tokenizer, chat template, vocabulary size, context and EOS ids: what preparing a request
    reads. Thread-safe: the grammar tokenizers it makes are kept under a lock, the tokenizer and the template are
    read only."""

    def __init__(
        self,
        tokenizer: Any,
        chat_setup: ChatSetup | None,
        *,
        vocab_size: int,
        context: int,
        eos_token_ids: Sequence[int] = (),
        generation_defaults: GenerationDefaults | None = None,
        name: str = "model",
    ) -> None:
        self.tokenizer, self.chat_setup = tokenizer, chat_setup
        self.vocab_size, self.context = vocab_size, context
        self.eos_token_ids = tuple(eos_token_ids)
        self.generation_defaults = generation_defaults or GenerationDefaults()
        self.name = name
        self._grammar_tokenizers: dict[tuple[int, ...], GrammarTokenizer] = {}
        self._openings: dict[str, list[int]] = {}  # the generation prompt's ids, per set of template variables
        self._lock = threading.Lock()

    @classmethod
    def from_checkpoint(cls, root: str | Path, name: str | None = None) -> Preparer:
        """The preparer of the checkpoint in ``root``, read from its files without loading its weights."""
        root = Path(root)
        config = config_from_file(root)
        tokenizer = load_tokenizer(root)
        template = ChatTemplate.from_checkpoint(root)
        return cls(
            tokenizer,
            ChatSetup.build(template, tokenizer) if template is not None else None,
            vocab_size=config.vocab_size,
            context=config.max_position_embeddings,
            eos_token_ids=eos_token_ids(root, config.eos_token_ids),
            generation_defaults=read_generation_defaults(root),
            name=name or root.name,
        )

    # -- text -----------------------------------------------------------------------------------------------------

    def _require_tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise ValueError(f"checkpoint {self.name!r} has no tokenizer files; pass token ids instead of text")
        return self.tokenizer

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise ValueError(f"text must be a str, got {type(text).__name__}")
        check_unicode(text, "text")
        return list(self._require_tokenizer().encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return self._require_tokenizer().decode(list(ids), skip_special_tokens=True)

    def segment_ids(self, segment: Segment) -> list[int]:
        ids = list(segment.token_ids) if segment.token_ids is not None else self.encode(segment.text or "")
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})")
        return ids

    def segments_ids(self, segments: Sequence[Segment]) -> list[list[int]]:
        """Each segment's ids, tokenized on its own; none may be empty."""
        if isinstance(segments, Segment) or not all(isinstance(s, Segment) for s in segments):
            raise ValueError("segments must be a list of Segment")
        seg_ids = [self.segment_ids(s) for s in segments]
        empty = [i for i, ids in enumerate(seg_ids) if not ids]
        if empty:
            raise ValueError(f"segment {empty[0]} tokenizes to no tokens")
        return seg_ids

    def build_prompt(self, segments: Sequence[Segment], query: str | Segment) -> Prompt:
        """Tokenize each segment on its own; reject prompts the model cannot take."""
        segments = as_list(segments, "segments", "Segment", Segment)
        seg_ids = self.segments_ids(segments)
        query_ids = self.segment_ids(as_query(query))
        prompt = Prompt(seg_ids, query_ids, tuple(s.cache for s in segments), tuple(s.kind for s in segments))
        if not prompt.ids:
            raise ValueError("the prompt is empty: give at least one segment or a non-empty query")
        if not query_ids:
            raise ValueError("the query tokenizes to no tokens")
        self._check_context(len(prompt.ids))
        return prompt

    def _check_context(self, tokens: int) -> None:
        if tokens > self.context:
            raise ValueError(f"prompt of {tokens} tokens is past the model's context of {self.context}")

    def grammar_tokenizer(self, stop_ids: Sequence[int] = ()) -> GrammarTokenizer:
        """The tokenizer as the output grammar reads it, with every EOS id and ``stop_ids`` as the ends of a
        finished answer; made once per set of ends (it walks the vocabulary)."""
        ends = tuple(sorted(set(self.eos_token_ids) | set(stop_ids)))
        with self._lock:
            if ends not in self._grammar_tokenizers:
                tokenizer = self._require_tokenizer()
                self._grammar_tokenizers[ends] = GrammarTokenizer(tokenizer, self.vocab_size, ends)
            return self._grammar_tokenizers[ends]

    def header_at(self, prompt: Prompt, chat_template_kwargs: Mapping[str, Any] | None) -> int | None:
        """Where the template's generation prompt begins in ``prompt`` (rendered with ``chat_template_kwargs``): a
        state kept there is one the next turn can restore when its template renders this turn's answer without
        the opening it was generated after (a reasoning block). None when the prompt does not end with it."""
        assert self.chat_setup is not None
        kwargs = dict(chat_template_kwargs or {})
        name = json.dumps(kwargs, sort_keys=True, default=repr)
        with self._lock:
            ids = self._openings.get(name)
        if ids is None:
            text = generation_prompt_text(self.chat_setup.template, **kwargs)
            ids = self.encode(text) if text else []
            with self._lock:
                self._openings[name] = ids
        n = len(ids)
        return len(prompt.ids) - n if 0 < n <= len(prompt.query) and prompt.query[-n:] == ids else None

    # -- requests -------------------------------------------------------------------------------------------------

    @property
    def chats(self) -> ChatRequests:
        """The chat steps (``chat/requests.py``) over this preparer's tokenizer and template."""
        return ChatRequests(self)

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        options: RequestOptions | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: str | Mapping[str, Any] | None = None,
        parallel_tool_calls: bool = True,
        compile: bool = True,
    ) -> Prepared:
        """A chat request, its sampling settings left unset filled from the checkpoint's ``generation_config``;
        ``compile=False`` leaves its grammar uncompiled (for one that will only be looked at: a fleet's keys)."""
        options = (options or RequestOptions()).with_defaults(self.generation_defaults)
        chats = self.chats
        setup = chats.setup()
        shape, choice = chats.answer_shape(tools, tool_choice, parallel_tool_calls, options)
        asked, tools = tools, shape.tools
        rendered, prompt = chats.render(messages, tools, options.chat_template_kwargs, options.segmentation)
        prompt = replace(prompt, header_at=self.header_at(prompt, options.chat_template_kwargs))
        thinking = thinking_opened(rendered.text)
        structured = shape.response_format is not None
        rendered, prompt, opening_ids = chats.force_call(rendered, prompt, shape.choice, thinking, structured)
        forced = rendered.answer_prefix
        # The reasoning the template opened is closed before a forced call or a formatted answer; an answer whose
        # grammar leaves no room for reasoning is parsed without looking for one.
        closed = thinking and bool(forced)
        forced_choice = shape.choice not in (None, "auto", "none")
        free_reasoning = not (closed or structured or forced_choice)
        grammar = None
        if tools or structured or setup.format.name in CALL_FORMATS:
            grammar = chats.answer_lark(shape, parallel_tool_calls, thinking and not closed)
            if grammar is not None and compile:
                chats.compile(grammar, options, asked, choice)
        free_reasoning = free_reasoning or grammar is None
        offered = bool(tool_signatures(tools)) and shape.choice != "none"
        # content a grammar wrote (a regex, a choice, a schema): returned, and streamed, exactly as written
        exact = structured and not offered and shape.response_tool is None and grammar is not None
        banned = None
        if not offered and grammar is None:
            bans = no_call_bans(setup.format, self.grammar_tokenizer(setup.end_of_turn_ids))
            banned = Banned(*bans) if bans is not None and any(bans) else None
        named = shape.choice if shape.choice not in (None, "auto", "none", "required") else None
        # A call that answers a response format is content once parsed (``unwrap``): it is never streamed as a call.
        streaming = CallStreaming.of(tools, named) if offered and shape.response_tool is None else None
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
                named=named,
            )
            content, calls = shape.unwrap(parsed.content, parsed.tool_calls)
            return replace(
                out, text=content, tool_calls=calls, reasoning=parsed.reasoning, partial_call=parsed.partial_call
            )

        return Prepared(
            prompt,
            options,
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
            calls=streaming,
        )

    def segments(
        self,
        segments: Sequence[Segment],
        query: str | Segment,
        options: RequestOptions | None = None,
        compile: bool = True,
    ) -> Prepared:
        """A request of segments and a query, its sampling settings left unset at their fixed defaults;
        ``compile=False`` as for ``chat``."""
        options = options or RequestOptions()
        chat_only = options.chat_only()
        if chat_only:
            raise ValueError(f"{', '.join(chat_only)} apply to chat requests (Engine.chat), not to segments")
        prompt = self.build_prompt(segments, query)
        grammar = None
        if options.response_format is not None:
            grammar = "start: " + response_lark(options.response_format, SPACED)
            if compile:
                schema, at = response_schema(options.response_format)
                compile_checked(self.grammar_tokenizer(), grammar, "response_format", schema, at)  # kept for the engine
        closing = asks_json(options.response_format)
        return Prepared(prompt, options.with_defaults(None), grammar=grammar, closing=closing)
