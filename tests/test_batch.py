"""The same requests, in every mode and under a small token budget, answer as each does alone through each of the
three drivers of the one scheduler: a caller's batch (``batch.run_batch``, under ``generate_batch``), threads on a
``concurrent.SharedBatch`` and the server's ``EngineWorker``."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import pytest

from hypic_rag import Engine, Segment
from hypic_rag.batch import run_batch
from hypic_rag.concurrent import SharedBatch
from hypic_rag.options import RequestOptions
from hypic_rag.server.worker import EngineWorker, Job
from hypic_rag.status import Event

DOCS = [
    Segment("Ana Lee lives in Oslo and works as a pilot for a small airline based near the fjord."),
    Segment("Bo Ek lives in Rome. He teaches chemistry at a school near the river, five days a week."),
    Segment("The museum in Lima opens at nine and closes at five, except on Mondays and in August."),
]
REQUESTS = [
    (DOCS, "Where does Ana live?", "hypic"),
    (DOCS[::-1], "What does Bo teach?", "prefix"),
    (DOCS[1:], "When does the museum open?", "full"),
    (DOCS[:2], "Who is a pilot?", "pic"),
    (DOCS[::-1], "Who lives in Rome?", "hypic"),
]
TOKENS, BUDGET, ACTIVE = 10, 32, 3


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine.from_pretrained(min_cached_tokens=0)


def _options(mode: str) -> RequestOptions:
    return RequestOptions(mode=mode, max_new_tokens=TOKENS)


def _batch(engine: Engine) -> list:
    begins = [partial(engine.start, s, q, _options(m)) for s, q, m in REQUESTS]
    return run_batch(begins, max_active=ACTIVE, max_num_batched_tokens=BUDGET)


def _shared(engine: Engine) -> list:
    batch = SharedBatch(max_active=ACTIVE, max_num_batched_tokens=BUDGET)
    with ThreadPoolExecutor(len(REQUESTS)) as pool:
        futures = [pool.submit(batch.run, partial(engine.start, s, q, _options(m))) for s, q, m in REQUESTS]
        return [f.result(120) for f in futures]


def _worker(engine: Engine) -> list:
    async def main() -> list:
        loop = asyncio.get_running_loop()
        worker = EngineWorker(engine, max_active=ACTIVE, max_num_batched_tokens=BUDGET)
        jobs = [Job(engine.prepare(s, q, _options(m)), loop) for s, q, m in REQUESTS]
        for job in jobs:
            worker.submit(job)
        worker.start()

        async def final(job: Job):
            while True:
                kind, payload = await asyncio.wait_for(job.events.get(), 120)
                if kind is Event.ERROR:
                    raise payload
                if kind is Event.DONE:
                    return payload

        try:
            return await asyncio.gather(*(final(job) for job in jobs))
        finally:
            await asyncio.to_thread(worker.stop)

    return asyncio.run(main())


@pytest.fixture(scope="module")
def alone(engine: Engine) -> list:
    """Each request alone, its segments (and prefixes) warm, as the batched ones find them in any arrival order."""
    for segments, query, mode in REQUESTS:
        engine.generate(segments, query, _options(mode))
    return [engine.generate(s, q, _options(m)) for s, q, m in REQUESTS]


@pytest.mark.parametrize("caller", [_batch, _shared, _worker], ids=["run_batch", "shared_batch", "server_worker"])
def test_every_mode_answers_as_alone_through_each_driver(engine, alone, caller):
    got = caller(engine)
    for g, w in zip(got, alone, strict=True):
        assert g.token_ids == w.token_ids and g.text == w.text
        assert g.stats["mode"] == w.stats["mode"] and g.stats["recomputed_tokens"] == w.stats["recomputed_tokens"]
