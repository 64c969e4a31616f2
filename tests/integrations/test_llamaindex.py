"""LlamaIndex with the real llama-index-core: a RetrieverQueryEngine over a VectorStoreIndex with the
offline MiniLM embedding, whose nodes reach the engine as document segments through HypicSynthesizer
and which answers questions about the bundled world from them."""

from __future__ import annotations

import asyncio

import pytest
from llama_index.core import Settings, VectorStoreIndex
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.schema import NodeWithScore, TextNode

from hypic_rag.eval.data import corpus
from hypic_rag.integrations.llamaindex import HypicLLM, HypicSynthesizer, MiniLMEmbedding
from hypic_rag.integrations.prompting import REGISTRY


@pytest.fixture(scope="module")
def world():
    texts, qa = corpus(16, seed=12)
    Settings.llm = None  # nothing may reach for an OpenAI default
    nodes = [TextNode(text=t, id_=str(i)) for i, t in enumerate(texts)]
    return VectorStoreIndex(nodes, embed_model=MiniLMEmbedding()), texts, qa


def _direct(fmt, engine, docs, question):
    segs = [fmt.segment("document", d) for d in docs]
    out = engine.generate(segs, fmt.query(question), max_new_tokens=24, stop_token_ids=fmt.stop_ids(engine))
    return fmt.answer(out.text)


# qa[4 * person + k] asks about attribute k (city, company, job, age) of a person in the corpus
EVERY_KIND = [4 * person + k for person in range(1, 16, 3) for k in range(4)]
# every kind of question about two people: what a newcomer asks the default query engine
EIGHT = [4 * person + k for person in (2, 9) for k in range(4)]


def test_the_default_query_engine_answers_on_the_bundled_model(engine, world):
    """``as_query_engine()`` with LlamaIndex's defaults (top two nodes, the compact synthesizer, its own text-QA
    chat prompt): the bundled model was trained on that wording (``framework_qa``), as it reaches the model."""
    index, _, qa = world
    engine.clear_cache()
    query_engine = index.as_query_engine(llm=HypicLLM(engine=engine, max_tokens=24))
    answers = [(query_engine.query(qa[i][0]).response.strip(), qa[i][1]) for i in EIGHT]
    assert sum(got == want for got, want in answers) >= 7, answers
    again = query_engine.query(qa[EIGHT[0]][0])
    assert again.metadata["hypic"]["miss_segments"] == 0 and again.metadata["hypic"]["hit_segments"] >= 2


def test_query_engine_answers_from_nodes_passed_as_segments_and_reordered_nodes_hit(engine, world, fmt):
    index, _, qa = world
    engine.clear_cache()
    synth = HypicSynthesizer(HypicLLM(engine=engine, max_tokens=24))
    query_engine = RetrieverQueryEngine(retriever=index.as_retriever(similarity_top_k=3), response_synthesizer=synth)
    for i in EVERY_KIND:
        question, answer = qa[i]
        assert query_engine.query(question).response == answer, question
    question = qa[0][0]
    response = query_engine.query(question)
    assert len(response.source_nodes) == 3
    assert any(question.split()[2] in n.node.get_content() for n in response.source_nodes)
    stats = response.metadata["hypic"]
    assert stats["hit_segments"] + stats["miss_segments"] == 3
    assert response.response == _direct(fmt, engine, [n.node.get_content() for n in response.source_nodes], question)
    again = synth.synthesize(question, list(reversed(response.source_nodes)))
    assert again.metadata["hypic"]["hit_segments"] == 3 and again.response == qa[0][1]


def test_nodes_cached_when_indexed_make_the_first_query_warm(engine, world, fmt):
    index, texts, qa = world
    engine.clear_cache()
    synth = HypicSynthesizer(HypicLLM(engine=engine, max_tokens=24))
    nodes = [TextNode(text=t, id_=str(i)) for i, t in enumerate(texts)]
    assert synth.cache_nodes(nodes) == len(texts) and synth.cache_nodes(nodes[::-1]) == 0
    query_engine = RetrieverQueryEngine(retriever=index.as_retriever(similarity_top_k=3), response_synthesizer=synth)
    question, answer = qa[5]
    response = query_engine.query(question)
    stats = response.metadata["hypic"]
    assert stats["hit_segments"] == 3 and stats["miss_segments"] == 0  # the very first query
    engine.clear_cache()
    assert response.response == _direct(fmt, engine, [n.node.get_content() for n in response.source_nodes], question)
    assert response.response == answer


def test_flat_prompts_find_registered_texts(engine, world, fmt):
    _, texts, qa = world
    REGISTRY.register(texts[:2])
    llm = HypicLLM(engine=engine, max_tokens=24)
    prompt = f"{texts[1]}\n\n{texts[0]}\n\n{qa[0][0]}"
    reply = llm.complete(prompt)
    assert reply.raw["hypic"]["hit_segments"] + reply.raw["hypic"]["miss_segments"] == 2
    assert reply.text == _direct(fmt, engine, [texts[1], texts[0]], qa[0][0]) == qa[0][1]
    assert list(llm.stream_complete(prompt))[-1].text == reply.text


def test_synthesizer_needs_a_hypic_llm_and_a_query(engine):
    with pytest.raises(ValueError, match="needs a HypicLLM"):
        HypicSynthesizer(llm="gpt")
    with pytest.raises(ValueError, match="query is empty"):
        HypicSynthesizer(HypicLLM(engine=engine)).synthesize("  ", [NodeWithScore(node=TextNode(text="x"))])


def test_synthesizer_goes_through_chat_with_todays_prompt(engine, world, monkeypatch, fmt):
    _, texts, qa = world
    sent = []
    real = engine.prepare_chat  # every chat, batched or streamed, is prepared there
    monkeypatch.setattr(engine, "prepare_chat", lambda m, *a, **kw: sent.append(m) or real(m, *a, **kw))
    synth = HypicSynthesizer(HypicLLM(engine=engine, max_tokens=24))
    nodes = [NodeWithScore(node=TextNode(text=t)) for t in texts[:3]]
    response = synth.synthesize(qa[0][0], nodes)
    # exactly the segments it sent before it went through engine.chat
    today = [fmt.segment("document", t) for t in texts[:3]], fmt.query(qa[0][0])
    assert engine.render(sent[-1]).token_ids == engine.build_prompt(*today).ids
    assert [p.get("hypic") for p in sent[-1][0]["content"]] == [{"kind": "document"}] * 3 + [None]
    again = asyncio.run(synth.asynthesize(qa[0][0], nodes))
    assert again.response == response.response and again.metadata["hypic"]["hit_segments"] == 3
