"""ChatHypic with the real langchain-core: message mapping, an LCEL RAG chain on the bundled model
(it answers questions about the bundled world from the retrieved documents, its answers equal the
engine's own, reordered documents hit), the retriever wrapper for unchanged chains, streaming, tool
calls, and langchain-tests' unit suite."""

from __future__ import annotations

import pytest
from langchain_core.documents import Document
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnablePassthrough
from langchain_core.vectorstores import InMemoryVectorStore
from langchain_tests.unit_tests import ChatModelUnitTests

from hypic_rag import GenerationOutput, Segment
from hypic_rag.eval.data import TOOLS, corpus
from hypic_rag.integrations.langchain import (
    ChatHypic,
    HypicRetriever,
    MiniLMEmbeddings,
    documents_to_messages,
    messages_to_parts,
)
from hypic_rag.integrations.prompting import answer_text, segment, stop_ids
from hypic_rag.prompt_format import wrap

WEATHER = next(t for t in TOOLS if t["function"]["name"] == "get_weather")


def _doc_block(text):
    return {"type": "text", "text": text, "extras": {"hypic": {"kind": "document"}}}


def test_messages_map_onto_the_prompt_format():
    messages = [
        SystemMessage("Answer the question using only the documents."),
        HumanMessage("Tell me about a book."),
        AIMessage("Here is a short note on a book."),
        HumanMessage(content=[_doc_block("Ana Lee lives in Oslo."), {"type": "text", "text": "Where does Ana live?"}]),
        AIMessage("", tool_calls=[{"name": "get_weather", "args": {"city": "Oslo"}, "id": "c1"}]),
        ToolMessage('{"forecast":"snow"}', tool_call_id="c1"),
    ]
    parts = messages_to_parts(messages, [WEATHER])
    assert [s.kind for s in parts.segments()] == ["tool", "system", "turn", "turn", "document", "turn"]
    texts = [s.text for s in parts.segments()]
    assert texts[1] == "<sys>Answer the question using only the documents.</sys>\n"
    assert texts[2] == "<turn>user: Tell me about a book.</turn>\n"
    assert texts[4] == "<doc>Ana Lee lives in Oslo.</doc>\n"
    call = '{"arguments":{"city":"Oslo"},"name":"get_weather"}'
    assert texts[5] == f'<turn>call: {call}\nresult: {{"forecast":"snow"}}</turn>\n'
    assert parts.query == "Where does Ana live?"


def test_bad_messages_are_clear_errors():
    with pytest.raises(ValueError, match="no question"):
        messages_to_parts([SystemMessage("hi")])
    with pytest.raises(ValueError, match="unknown segment kind 'note'"):
        bad = {"type": "text", "text": "x", "extras": {"hypic": {"kind": "note"}}}
        messages_to_parts([HumanMessage(content=[bad, "q?"])])
    with pytest.raises(ValueError, match="unknown mode"):
        ChatHypic(mode="fast")


@pytest.fixture(scope="module")
def world():
    texts, qa = corpus(16, seed=11)
    store = InMemoryVectorStore(MiniLMEmbeddings())
    store.add_documents([Document(page_content=t, id=str(i)) for i, t in enumerate(texts)])
    return store, qa


def _direct(engine, docs, question, system=None):
    """What the engine itself answers for these documents, in the bundled model's prompt format."""
    segs = ([segment("system", system)] if system else []) + [segment("document", d) for d in docs]
    out = engine.generate(
        segs, Segment(wrap("query", question), kind="query"), max_new_tokens=24, stop_token_ids=stop_ids(engine)
    )
    return answer_text(out.text)


# qa[4 * person + k] asks about attribute k (city, company, job, age) of a person in the corpus
CITY_AND_JOB = [4 * person + k for person in range(0, 16, 3) for k in (0, 2)]


def test_lcel_rag_chain_answers_from_retrieved_documents_and_reordered_ones_hit(engine, world):
    store, qa = world
    engine.clear_cache()
    llm = ChatHypic(engine=engine, max_tokens=24)
    retriever = store.as_retriever(search_kwargs={"k": 3})
    chain = {"context": retriever, "question": RunnablePassthrough()} | documents_to_messages() | llm
    for i in CITY_AND_JOB:
        question, answer = qa[i]
        assert chain.invoke(question).content == answer, question
    question = qa[0][0]
    docs = retriever.invoke(question)
    reply = chain.invoke(question)
    stats = reply.response_metadata["hypic"]
    assert stats["hit_segments"] + stats["miss_segments"] == 3
    assert reply.content == _direct(engine, [d.page_content for d in docs], question)
    assert reply.usage_metadata["input_tokens"] == stats["prompt_tokens"]
    # the same documents in another order, as another question would retrieve them: all three hit
    again = (documents_to_messages() | llm).invoke({"context": docs[::-1], "question": question})
    assert again.content == qa[0][1]
    assert again.response_metadata["hypic"]["hit_segments"] == 3
    assert again.response_metadata["hypic"]["recomputed_tokens"] < again.response_metadata["hypic"]["prompt_tokens"]


def test_unchanged_chain_keeps_document_boundaries_through_the_retriever_wrapper(engine, world):
    store, qa = world
    retriever = HypicRetriever(retriever=store.as_retriever(search_kwargs={"k": 3}))
    system = "Answer the question using only the documents."
    prompt = ChatPromptTemplate.from_messages([("system", system + "\n\n{context}"), ("human", "{question}")])

    def format_docs(docs):
        return "\n\n".join(d.page_content for d in docs)

    llm = ChatHypic(engine=engine, max_tokens=24)
    chain = {"context": retriever | format_docs, "question": RunnablePassthrough()} | prompt | llm
    question = qa[8][0]
    reply = chain.invoke(question)
    stats = reply.response_metadata["hypic"]
    assert stats["hit_segments"] + stats["miss_segments"] == 4  # the system text and three documents
    docs = [d.page_content for d in retriever.invoke(question)]
    assert reply.content == _direct(engine, docs, question, system)
    assert (chain | StrOutputParser()).invoke(question) == reply.content


def test_streaming_matches_invoke(engine, world):
    _, qa = world
    llm = ChatHypic(engine=engine, max_tokens=24)
    msgs = [HumanMessage(content=[_doc_block(corpus(16, seed=11)[0][8]), {"type": "text", "text": qa[8][0]}])]
    chunks = list(llm.stream(msgs))
    assert "".join(c.content for c in chunks) == llm.invoke(msgs).content == qa[8][1]
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged += chunk
    assert merged.response_metadata["hypic"]["prompt_tokens"] > 0 and merged.usage_metadata["output_tokens"] > 0


def test_bound_tools_become_segments_and_calls_become_tool_calls(engine):
    others = [t for t in TOOLS if t["function"]["name"] in ("set_timer", "translate", "find_product")]
    llm = ChatHypic(engine=engine, max_tokens=40)
    reply = llm.bind_tools([*others, WEATHER]).invoke("What is the weather in Kothvenville right now?")
    stats = reply.response_metadata["hypic"]
    assert stats["hit_segments"] + stats["miss_segments"] == 4  # one segment per tool
    text = '{"arguments":{"city":"Kothvenville"},"name":"get_weather"}</a>'
    msg = llm._message(GenerationOutput(text, [], 0.0, dict(stats)), [WEATHER], None)
    assert msg.tool_calls[0]["name"] == "get_weather" and msg.tool_calls[0]["args"] == {"city": "Kothvenville"}
    assert msg.content == ""
    with pytest.raises(ValueError, match="not one of the bound tools"):
        llm.bind_tools([WEATHER], tool_choice="send_email")


class TestChatHypicUnit(ChatModelUnitTests):
    @property
    def chat_model_class(self):
        return ChatHypic

    @property
    def chat_model_params(self):
        return {"model": "hypic-default"}


def test_streaming_honours_stop_sequences(engine, world):
    _, qa = world
    llm = ChatHypic(engine=engine, max_tokens=24)
    msgs = [HumanMessage(content=[_doc_block(corpus(16, seed=11)[0][8]), {"type": "text", "text": qa[8][0]}])]
    whole = llm.invoke(msgs).content
    assert len(whole) >= 2
    stop = whole[1:3]
    streamed = "".join(c.content for c in llm.stream(msgs, stop=[stop]))
    assert streamed == llm.invoke(msgs, stop=[stop]).content == whole[: whole.index(stop)]
