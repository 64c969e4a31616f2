"""RAG with LlamaIndex on the bundled model, offline: a VectorStoreIndex with MiniLM and a
RetrieverQueryEngine whose synthesizer passes each node as a cached segment.

    python examples/rag_llamaindex.py
"""

from __future__ import annotations

from llama_index.core import Settings, VectorStoreIndex
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.schema import TextNode

from hypic_rag.eval.data import corpus
from hypic_rag.integrations.llamaindex import HypicSynthesizer, MiniLMEmbedding


def main(questions: int = 4) -> list[tuple[str, str, dict]]:
    Settings.llm = None  # offline: no default LLM
    texts, qa = corpus(16, seed=4)
    index = VectorStoreIndex([TextNode(text=t, id_=str(i)) for i, t in enumerate(texts)], embed_model=MiniLMEmbedding())
    engine = RetrieverQueryEngine(
        retriever=index.as_retriever(similarity_top_k=3), response_synthesizer=HypicSynthesizer()
    )
    out = []
    for question, expected in (qa[4 * i + i % 4] for i in range(questions)):  # city, company, job, age, ...
        response = engine.query(question)
        stats = response.metadata["hypic"]
        print(f"{question}\n  answer {response.response!r} (expected {expected!r}); hits {stats['hit_segments']}")
        out.append((question, response.response, stats))
    return out


if __name__ == "__main__":
    main()
