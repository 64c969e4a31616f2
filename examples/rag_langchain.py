"""RAG with LangChain on the bundled model, offline: MiniLM retrieval, an LCEL chain, the cache stats.

python examples/rag_langchain.py
"""

from __future__ import annotations

from langchain_core.documents import Document
from langchain_core.runnables import RunnablePassthrough
from langchain_core.vectorstores import InMemoryVectorStore

from hypic_rag.eval.data import corpus
from hypic_rag.integrations.langchain import ChatHypic, MiniLMEmbeddings, documents_to_messages


def main(questions: int = 4) -> list[tuple[str, str, dict]]:
    texts, qa = corpus(16, seed=3, profiles=True)  # one profile of a few sentences per person
    store = InMemoryVectorStore(MiniLMEmbeddings())
    store.add_documents([Document(page_content=t, id=str(i)) for i, t in enumerate(texts)])
    retriever = store.as_retriever(search_kwargs={"k": 3})
    llm = ChatHypic()
    llm.cache_documents(texts)  # when indexing: even the first question finds its documents cached
    chain = {"context": retriever, "question": RunnablePassthrough()} | documents_to_messages() | llm
    out = []
    for question, expected in (qa[4 * i + i % 4] for i in range(questions)):  # city, company, job, age, ...
        msg = chain.invoke(question)
        stats = msg.response_metadata["hypic"]
        print(f"{question}\n  answer {msg.content!r} (expected {expected!r}); hits {stats['hit_segments']}")
        out.append((question, msg.content, stats))
    return out


if __name__ == "__main__":
    main()
