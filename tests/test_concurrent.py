"""Concurrent callers of one engine decoded together (``hypic_rag.concurrent``): each answer is the one it gets
alone, a failing request fails only its caller, and a stream run alone waits for a step boundary."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import pytest

from hypic_rag import Engine, Segment
from hypic_rag.concurrent import SharedBatch, alone, shared_batch

DOCS = [Segment("Ana Lee lives in Oslo and works as a pilot."), Segment("Bo Ek lives in Rome and teaches chemistry.")]
QUERIES = ["Where does Ana live?", "What does Bo teach?", "Who lives in Rome?", "Who is a pilot?"]


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine.from_pretrained(min_cached_tokens=0)


def test_concurrent_callers_share_decode_steps_and_answer_as_alone(engine, decode_rows):
    want = [engine.generate(DOCS, q, max_new_tokens=12) for q in QUERIES]
    rows = decode_rows(engine)
    batch = SharedBatch()

    def start(query):
        def begin(prefill_chunk):
            if query == QUERIES[0]:  # the driver waits for the others to be handed in: all four run together
                deadline = time.monotonic() + 30
                while len(batch._waiting) < len(QUERIES) - 1 and time.monotonic() < deadline:
                    time.sleep(0.005)
            return engine.start(DOCS, query, max_new_tokens=12, prefill_chunk=prefill_chunk)

        return begin

    with ThreadPoolExecutor(len(QUERIES)) as pool:
        first = pool.submit(batch.run, start(QUERIES[0]))
        while not batch._driving:
            time.sleep(0.001)
        rest = [pool.submit(batch.run, start(q)) for q in QUERIES[1:]]
        got = [first.result(60)] + [f.result(60) for f in rest]
    for g, w in zip(got, want, strict=True):
        assert g.token_ids == w.token_ids and g.text == w.text
    assert max(rows) == len(QUERIES)


def test_a_shared_batch_decodes_at_most_max_active_at_once(engine, decode_rows):
    want = [engine.generate(DOCS, q, max_new_tokens=12) for q in QUERIES]
    rows = decode_rows(engine)
    batch = SharedBatch(max_active=2)
    with ThreadPoolExecutor(len(QUERIES)) as pool:
        futures = [pool.submit(batch.run, partial(engine.start, DOCS, q, max_new_tokens=12)) for q in QUERIES]
        got = [f.result(60) for f in futures]
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert max(rows) <= 2


def test_a_driver_returns_with_its_own_answer_and_a_waiting_caller_drives_on(engine, decode_rows):
    want = engine.generate(DOCS, QUERIES[1], max_new_tokens=40)
    steps = decode_rows(engine)
    batch = SharedBatch()
    with ThreadPoolExecutor(1) as pool:
        late: list = []

        def short(prefill_chunk):  # the driver's own request; a long one is handed in before it starts
            late.append(pool.submit(batch.run, partial(engine.start, DOCS, QUERIES[1], max_new_tokens=40)))
            deadline = time.monotonic() + 30
            while not batch._waiting and time.monotonic() < deadline:
                time.sleep(0.005)
            return engine.start(DOCS, QUERIES[0], max_new_tokens=2, prefill_chunk=prefill_chunk)

        assert len(batch.run(short).token_ids) <= 2
        at_return = len(steps)  # back with its own answer, not held until the long one ends:
        assert late[0].result(60).token_ids == want.token_ids
        assert len(steps) > at_return  # the long one's caller drove its own remaining steps
    assert not batch._driving


def test_a_failing_request_fails_only_its_caller(engine):
    batch = shared_batch(engine)
    assert shared_batch(engine) is batch
    with ThreadPoolExecutor(2) as pool:
        bad = pool.submit(batch.run, partial(engine.start, [Segment(token_ids=[10**9])], "q"))
        good = pool.submit(batch.run, partial(engine.start, DOCS, QUERIES[0], max_new_tokens=4))
        with pytest.raises(ValueError, match="outside the vocabulary"):
            bad.result(60)
        assert good.result(60).token_ids == engine.generate(DOCS, QUERIES[0], max_new_tokens=4).token_ids
    assert not batch._driving  # the driver handed back once nothing was left


def test_a_stream_has_the_engine_to_itself(engine):
    lock = shared_batch(engine).lock
    pieces: list[str] = []

    def stream():
        assert lock.locked()  # no step of the shared batch can run meanwhile
        return engine.generate(DOCS, QUERIES[1], on_token=lambda _i, d: pieces.append(d or ""))

    out = alone(engine, stream)
    assert "".join(pieces) == out.text and not lock.locked()


def test_in_thread_runs_off_the_loop_with_the_callers_context():
    import asyncio
    import contextvars
    import threading

    from hypic_rag.concurrent import in_thread

    var = contextvars.ContextVar("var", default="unset")

    async def main():
        var.set("caller's")
        return await in_thread(lambda x: (var.get(), threading.current_thread().name, x), 7)

    value, thread, x = asyncio.run(main())
    assert (value, x) == ("caller's", 7) and thread.startswith("hypic-async")


def _in_thread_in_a_forked_child(queue) -> None:
    import asyncio

    from hypic_rag.concurrent import in_thread

    queue.put(asyncio.run(asyncio.wait_for(in_thread(lambda: "ran"), 10)))


def test_in_thread_works_in_a_child_forked_after_it_ran():
    import asyncio
    import multiprocessing
    import sys

    from hypic_rag.concurrent import in_thread

    if not sys.platform.startswith("linux"):
        pytest.skip("fork is the start method in question, and Linux's default")
    assert asyncio.run(in_thread(lambda: 1)) == 1  # the parent's pool exists, with an idle thread
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_in_thread_in_a_forked_child, args=(queue,))
    child.start()
    child.join(30)
    assert child.exitcode == 0 and queue.get(timeout=5) == "ran"


def test_d1_a_cancelled_await_takes_its_request_out_of_the_batch(engine):
    import asyncio
    import threading

    from hypic_rag.concurrent import in_thread

    want = engine.generate(DOCS, QUERIES[0], max_new_tokens=40)
    batch = SharedBatch()
    tokens: list[int] = []  # the abandoned request's
    at_cancel: list[int] = []

    class Flag(threading.Event):  # notes how far the abandoned request had decoded when its caller gave up
        def set(self) -> None:
            at_cancel.append(len(tokens))
            super().set()

    gave_up = Flag()
    dropped = partial(engine.start, DOCS, QUERIES[1], max_new_tokens=200, on_token=lambda i, _d: tokens.append(i))

    async def main():
        kept = asyncio.ensure_future(in_thread(batch.run, partial(engine.start, DOCS, QUERIES[0], max_new_tokens=40)))
        abandoned = asyncio.ensure_future(in_thread(batch.run, dropped, gave_up.is_set, cancel=gave_up))
        while len(tokens) < 4:
            await asyncio.sleep(0.002)
        abandoned.cancel()
        with pytest.raises(asyncio.CancelledError):
            await abandoned
        return await kept

    assert asyncio.run(main()).token_ids == want.token_ids
    deadline = time.monotonic() + 30
    while (batch._driving or not batch.scheduler.idle) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert batch.scheduler.idle and not batch._driving
    assert len(tokens) <= at_cancel[0] + 1  # at most the step already under way, not 200 tokens


def test_d1_an_interrupted_caller_takes_its_request_out_of_the_batch(engine):
    import signal
    import threading

    want = engine.generate(DOCS, QUERIES[0], max_new_tokens=80)
    batch = SharedBatch()
    tokens: list[int] = []  # the interrupted caller's request's
    main = threading.main_thread().ident
    assert threading.get_ident() == main  # a signal reaches the main thread

    def interrupt(token: int, _delta) -> None:  # Ctrl-C while the main thread waits for its answer
        tokens.append(token)
        if len(tokens) == 4:
            signal.pthread_kill(main, signal.SIGINT)

    with ThreadPoolExecutor(1) as pool:
        driver = pool.submit(batch.run, partial(engine.start, DOCS, QUERIES[0], max_new_tokens=80))
        while not batch._driving:
            time.sleep(0.001)
        with pytest.raises(KeyboardInterrupt):
            batch.run(partial(engine.start, DOCS, QUERIES[1], max_new_tokens=200, on_token=interrupt))
        at_interrupt = len(tokens)
        assert driver.result(60).token_ids == want.token_ids  # the others' answers go on, unchanged
    assert len(tokens) <= at_interrupt + 1 and batch.scheduler.idle  # it left at the next step, not 80 later
