"""Your own Qwen3.5 / Qwen3-Next checkpoint: a hub id from the local Hugging Face cache, its own chat
template, and the three ways in: ``engine.chat``, a plain LangChain chain, LlamaIndex's default query
engine. Each asks twice with the documents in another order; the second time they come from the cache.

    python examples/own_checkpoint.py Qwen/Qwen3.5-0.8B   # after `hf download Qwen/Qwen3.5-0.8B`
"""

from __future__ import annotations

import sys

from hypic_rag import Engine

DOCS = [
    "Ana Lee lives in Oslo and works as a pilot.",
    "Bo Ek lives in Rome and works as a baker.",
    "Cy Ru lives in Lima and works as a nurse.",
]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def with_chat(engine: Engine) -> list[dict]:
    """Documents as explicit parts, a tool schema, the template's own format and tool-call parser."""
    stats = []
    for docs in (DOCS, DOCS[::-1]):
        parts = [{"type": "text", "text": d, "hypic": {"kind": "document"}} for d in docs]
        question = {"type": "text", "text": "Where does Bo Ek live?"}
        messages = [
            {"role": "system", "content": "Answer from the documents."},
            {"role": "user", "content": [*parts, question]},
        ]
        out = engine.chat(messages, tools=[WEATHER], max_new_tokens=16)
        print(f"chat: {out.text!r} calls={out.tool_calls} hits={out.stats['hit_segments']}/{out.stats['segments']}")
        stats.append(out.stats)
    return stats


def with_langchain(engine: Engine) -> list[dict]:
    """A plain retriever | format_docs | prompt | llm chain: auto segmentation finds the documents."""
    from langchain_core.documents import Document
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_core.runnables import RunnableLambda, RunnablePassthrough

    from hypic_rag.integrations.langchain import ChatHypic

    prompt = ChatPromptTemplate.from_template("Answer based only on the following context:\n{context}\n\nQuestion: {q}")
    format_docs = RunnableLambda(lambda docs: "\n\n".join(d.page_content for d in docs))
    stats = []
    for docs in (DOCS, DOCS[::-1]):
        retriever = RunnableLambda(lambda _q, docs=docs: [Document(t) for t in docs])  # stands in for a vector store's
        chain = {"context": retriever | format_docs, "q": RunnablePassthrough()} | prompt | ChatHypic(engine=engine)
        reply = chain.invoke("Who is a nurse?")
        print(f"langchain: {reply.content!r} hits={reply.response_metadata['hypic']['hit_segments']}")
        stats.append(reply.response_metadata["hypic"])
    return stats


def with_llamaindex(engine: Engine) -> list[dict]:
    """LlamaIndex's default query engine over the documents: each retrieved node stays a segment."""
    from llama_index.core import Settings, VectorStoreIndex
    from llama_index.core.embeddings import MockEmbedding
    from llama_index.core.schema import TextNode

    from hypic_rag.integrations.llamaindex import HypicLLM

    Settings.llm = HypicLLM(engine=engine, max_tokens=16)
    index = VectorStoreIndex([TextNode(text=t) for t in DOCS], embed_model=MockEmbedding(embed_dim=8))
    query_engine = index.as_query_engine(similarity_top_k=3)
    stats = []
    for _ in range(2):
        response = query_engine.query("Who is a pilot?")
        print(f"llamaindex: {response.response!r} hits={response.metadata['hypic']['hit_segments']}")
        stats.append(response.metadata["hypic"])
    return stats


def main(model: str = "Qwen/Qwen3.5-0.8B") -> dict[str, list[dict]]:
    engine = Engine.from_pretrained(model, min_cached_tokens=1)  # the example's documents are one sentence each
    return {"chat": with_chat(engine), "langchain": with_langchain(engine), "llamaindex": with_llamaindex(engine)}


if __name__ == "__main__":
    main(*sys.argv[1:2])
