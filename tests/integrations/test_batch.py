"""LangChain's ``batch``/``abatch`` and LlamaIndex's concurrent ``achat`` calls decoded together
(``hypic_rag.concurrent``): each answer is the one the same call gets alone."""

from __future__ import annotations

import asyncio

import pytest

from hypic_rag.integrations.langchain import ChatHypic

QUESTIONS = ["Where does Ana Lee live?", "What does Bo Ek teach?", "Who lives in Rome?", "Who is a pilot?"]


@pytest.fixture
def rows(engine, decode_rows) -> list[int]:
    """The rows of every batched decode step."""
    return decode_rows(engine)


def test_chathypic_batch_and_abatch_decode_together_and_answer_as_alone(engine, rows):
    llm = ChatHypic(engine=engine, max_tokens=12)
    want = [llm.invoke(q).content for q in QUESTIONS]
    rows.clear()
    assert [m.content for m in llm.batch(QUESTIONS)] == want
    assert max(rows) > 1
    rows.clear()
    assert [m.content for m in asyncio.run(llm.abatch(QUESTIONS))] == want
    assert max(rows) > 1


def test_llamaindex_concurrent_achat_calls_decode_together_and_answer_as_alone(engine, rows):
    from llama_index.core.llms import ChatMessage

    from hypic_rag.integrations.llamaindex import HypicLLM

    llm = HypicLLM(engine=engine, max_tokens=12)
    asks = [[ChatMessage(role="user", content=q)] for q in QUESTIONS]
    want = [llm.chat(a).message.content for a in asks]
    rows.clear()

    async def together():
        return await asyncio.gather(*(llm.achat(a) for a in asks))

    assert [r.message.content for r in asyncio.run(together())] == want
    assert max(rows) > 1


def test_abatch_is_not_capped_by_the_event_loops_default_executor(engine, rows):
    from concurrent.futures import ThreadPoolExecutor

    llm = ChatHypic(engine=engine, max_tokens=12)
    want = [llm.invoke(q).content for q in QUESTIONS]
    rows.clear()

    async def narrow_loop():  # a default executor of two threads would let at most two calls share a step
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(2))
        return await llm.abatch(QUESTIONS)

    assert [m.content for m in asyncio.run(narrow_loop())] == want
    assert max(rows) > 2


def _abandoned_before_it_runs(engine, monkeypatch, call) -> None:
    """``call()`` (a framework's own async call) given up by ``asyncio.wait_for`` while the shared batch cannot step:
    its request leaves before its prompt runs."""
    import time

    from hypic_rag.concurrent import shared_batch

    batch = shared_batch(engine)
    started: list[object] = []
    real = engine.begin
    monkeypatch.setattr(engine, "begin", lambda *a, **k: started.append(a) or real(*a, **k))

    async def give_up() -> None:
        waiting = asyncio.ensure_future(asyncio.wait_for(call(), 0.5))
        deadline = time.monotonic() + 30
        while not batch._driving and time.monotonic() < deadline:  # its thread waits for the engine
            await asyncio.sleep(0.01)
        assert batch._driving
        with pytest.raises(TimeoutError):
            await waiting

    with batch.lock:  # the engine busy (a stream has it): no step runs
        asyncio.run(give_up())
    deadline = time.monotonic() + 30
    while (batch._driving or not batch.scheduler.idle) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert batch.scheduler.idle and not batch._driving
    assert started == []  # dropped when its turn came: no prompt ran for an answer nobody waits for


def test_a_timed_out_ainvoke_leaves_the_shared_batch(engine, monkeypatch):
    llm = ChatHypic(engine=engine, max_tokens=12)
    _abandoned_before_it_runs(engine, monkeypatch, lambda: llm.ainvoke(QUESTIONS[0]))


def test_a_timed_out_llamaindex_achat_leaves_the_shared_batch(engine, monkeypatch):
    from llama_index.core.llms import ChatMessage

    from hypic_rag.integrations.llamaindex import HypicLLM

    llm = HypicLLM(engine=engine, max_tokens=12)
    _abandoned_before_it_runs(engine, monkeypatch, lambda: llm.achat([ChatMessage(role="user", content=QUESTIONS[0])]))
