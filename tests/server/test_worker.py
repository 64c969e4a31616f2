"""The continuous-batching scheduler (``server.worker``): admission at every step within ``max_active`` and the
token budget, first come first served, cancelled and finished requests leaving at once, and every answer the one
the request gets alone."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace
from typing import Any

import httpx
import pytest

from hypic_rag import Engine, Segment
from hypic_rag.fidelity import kl_divergence
from hypic_rag.options import RequestOptions
from hypic_rag.prepare import Prepared
from hypic_rag.server import create_app
from hypic_rag.server.worker import EngineWorker, Job
from hypic_rag.status import Event
from hypic_rag.testing.server import serve_in_thread

DOCS = [
    Segment("Ana Lee lives in Oslo and works as a pilot for a small airline based near the fjord."),
    Segment("Bo Ek lives in Rome. He teaches chemistry at a school near the river, five days a week."),
]
QUERIES = ["Where does Ana live?", "What does Bo teach?", "Who is a pilot?", "Name a river.", "Who lives in Rome?"]
TOKENS = 10


def _arguments(query: str, **options: Any) -> dict[str, Any]:
    opts = RequestOptions.from_mapping({"max_new_tokens": TOKENS, "mode": "hypic", **options})
    return {"segments": DOCS, "query": query, "options": opts}


def _serve(engine, requests: list[dict[str, Any]], cancel_after: dict[int, int] | None = None, **worker: Any):
    """Run ``requests`` (all queued before the worker starts) to the end; each one's final event, and the steps
    (requests decoded, tokens run). ``cancel_after[i] = n``: request ``i`` is cancelled after its ``n``-th delta."""
    steps: list[tuple[int, int]] = []

    async def main() -> list[tuple[str, Any]]:
        loop = asyncio.get_running_loop()
        pool = EngineWorker(engine, observe_step=lambda r, t: steps.append((r, t)), **worker)
        jobs = [Job(a if isinstance(a, Prepared) else engine.prepare(**a), loop) for a in requests]
        for job in jobs:
            pool.submit(job)
        pool.start()

        async def finish(i: int, job: Job) -> tuple[str, Any]:
            deltas = 0
            while True:
                kind, payload = await asyncio.wait_for(job.events.get(), 120)
                if kind in (Event.DONE, Event.ERROR):
                    return kind, payload
                if kind is not Event.FIRST:
                    deltas += 1
                    if cancel_after and deltas == cancel_after.get(i):
                        job.cancel()

        try:
            return await asyncio.gather(*(finish(i, job) for i, job in enumerate(jobs)))
        finally:
            await asyncio.to_thread(pool.stop)

    return asyncio.run(main()), steps


@pytest.fixture(scope="module")
def alone(engine):
    for query in QUERIES:  # documents warm, as the workers below find them
        engine.generate(DOCS, query, max_new_tokens=2)
    return [engine.generate(**_arguments(q)) for q in QUERIES]


def test_waiting_requests_join_the_running_batch_and_answer_as_alone(engine, alone):
    results, steps = _serve(engine, [_arguments(q) for q in QUERIES], max_active=3)
    for (kind, out), want in zip(results, alone, strict=True):
        assert kind == Event.DONE and out.token_ids == want.token_ids and out.text == want.text
    sizes = [running for running, _ in steps]
    assert all(len(w.token_ids) == TOKENS for w in alone)
    # Three decode together; the step after they finish, the two that waited join: 20 steps, not 50.
    assert sizes == [3] * TOKENS + [2] * TOKENS


def test_the_token_budget_admits_one_long_prompt_a_step(engine, alone):
    budget = 4  # below any prompt here: each step admits only the first waiting request
    # composed in one forward each (an atomic piece), not restored from the states the requests above kept
    engine.keep_states = False
    try:
        results, steps = _serve(
            engine, [_arguments(q) for q in QUERIES[:3]], max_active=3, max_num_batched_tokens=budget
        )
    finally:
        engine.keep_states = True
    assert [running for running, _ in steps[:3]] == [1, 2, 3]
    for (kind, out), want in zip(results, alone[:3], strict=True):
        assert kind == Event.DONE and out.token_ids == want.token_ids
    _, roomy = _serve(engine, [_arguments(q) for q in QUERIES[:3]], max_active=3)
    assert roomy[0][0] == 3 and roomy[0][1] > 3  # the default budget takes all three prompts in one step


def test_a_cancelled_request_leaves_at_once_and_the_others_go_on(engine, alone):
    results, steps = _serve(engine, [_arguments(q) for q in QUERIES[:3]], cancel_after={1: 2}, max_active=3)
    kind, cancelled = results[1]
    assert kind == Event.DONE and cancelled.finish_reason == "cancelled"
    assert len(cancelled.token_ids) < len(alone[1].token_ids)
    assert cancelled.token_ids == alone[1].token_ids[: len(cancelled.token_ids)]
    for i in (0, 2):
        assert results[i][0] == Event.DONE and results[i][1].token_ids == alone[i].token_ids
    assert 2 in [running for running, _ in steps]  # the batch went on without it


def test_a_bad_request_fails_alone(engine, alone):
    """A request whose prompt fails when it runs (an id past the vocabulary, which preparing would refuse)."""
    prepared = engine.prepare(**_arguments(QUERIES[0]))
    bad = replace(prepared, prompt=replace(prepared.prompt, query=[10**9]))
    results, _ = _serve(engine, [_arguments(QUERIES[0]), bad, _arguments(QUERIES[1])], max_active=3)
    assert results[1][0] == Event.ERROR and isinstance(results[1][1], ValueError)
    assert results[0][1].token_ids == alone[0].token_ids and results[2][1].token_ids == alone[1].token_ids


def test_a_failing_metrics_callback_fails_no_request_and_the_worker_goes_on(engine, alone):
    def broken(job, output):
        raise RuntimeError("a metrics bug")

    results, _ = _serve(engine, [_arguments(q) for q in QUERIES[:3]], observe=broken, max_active=2)
    # the third was admitted after the first two ended
    assert [kind for kind, _ in results] == [Event.DONE, Event.DONE, Event.DONE]
    assert [out.token_ids for _, out in results] == [a.token_ids for a in alone[:3]]


def test_the_budget_must_cover_a_step_of_every_running_request(engine):
    with pytest.raises(ValueError, match="at least max_active"):
        EngineWorker(engine, max_active=8, max_num_batched_tokens=4)


LONG = [Segment(f"Note {i}: the ferry to the island leaves from pier {i} at {i} past the hour. ") for i in range(12)]


def test_a_long_cold_prompt_runs_a_chunk_a_step_while_the_others_decode(engine):
    chunk = 32
    engine.clear_cache()
    long_alone = engine.generate(LONG, "When does the ferry leave?", max_new_tokens=6, mode="full")
    prompt_tokens = long_alone.stats["prompt_tokens"]
    assert prompt_tokens > 6 * chunk
    short = [_arguments(q, max_new_tokens=40) for q in QUERIES[:2]]
    short_alone = [engine.generate(**a) for a in short]
    long = _arguments("When does the ferry leave?", mode="full", max_new_tokens=6)
    long["segments"] = LONG
    results, steps = _serve(engine, [*short, long], max_active=3, max_num_batched_tokens=chunk)
    assert [out.token_ids for _, out in results] == [w.token_ids for w in [*short_alone, long_alone]]
    # The first step runs the two short prompts; then the long one runs in chunks of at most 32 tokens, each in
    # a step that decodes the requests running (a step is recorded only when some are).
    prefill = [tokens - running for running, tokens in steps[1:] if tokens > running]
    assert all(ran <= chunk for ran in prefill)
    assert sum(prefill) >= prompt_tokens - chunk and len(prefill) >= prompt_tokens // chunk


# -- shadow runs: a share of requests run again in full once the worker is idle, their KL exported ----------

SHADOW_DOCUMENTS = [
    "Ana Lee lives in Oslo and works as a pilot at Nordfly Systems.",
    "Bo Ek lives in Rome and works as a baker at Forno Labs since 2019.",
]
SHADOW_MESSAGES = [
    {"role": "system", "content": "Answer from the documents."},
    {
        "role": "user",
        "content": [{"type": "text", "text": d, "hypic": {"kind": "document"}} for d in SHADOW_DOCUMENTS]
        + [{"type": "text", "text": "Where does Ana Lee live?"}],
    },
]


def _ask_shadowed(url: str) -> dict:
    body = {"model": "m", "messages": SHADOW_MESSAGES, "max_tokens": 6, "temperature": 0, "hypic": {"seam": 4}}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=120).json()


def test_shadow_runs_after_the_answer_and_changes_nothing(monkeypatch):
    engine = Engine.from_pretrained()
    release, shadow_started = threading.Event(), threading.Event()
    modes: list[str] = []
    begin = engine.begin

    def spy(prepared, **kwargs):
        modes.append(prepared.options.mode)
        if prepared.options.mode == "full":  # the shadow waits until the test has the answer in hand
            shadow_started.set()
            assert release.wait(60)
        return begin(prepared, **kwargs)

    monkeypatch.setattr(engine, "begin", spy)
    with serve_in_thread(create_app(engine, model_names=["m"], shadow_rate=1.0)) as url:
        first = _ask_shadowed(url)  # answered while its shadow may not even have started: nothing waits for it
        assert shadow_started.wait(60)  # the worker is idle now, so the shadow runs, and blocks
        release.set()
        second = _ask_shadowed(url)
        assert first["choices"][0]["message"] == second["choices"][0]["message"]
        assert first["hypic"]["segments"] >= 3
        text = ""
        for _ in range(200):
            text = httpx.get(url + "/metrics").text
            if 'hypic_shadow_kl_count{mode="hypic"} 2.0' in text:
                break
            threading.Event().wait(0.05)
        assert 'hypic_shadow_kl_count{mode="hypic"} 2.0' in text
    assert modes == ["hypic", "full", "hypic", "full"]
    with serve_in_thread(create_app(Engine.from_pretrained(), model_names=["m"])) as url:
        unshadowed = _ask_shadowed(url)  # the same request where nothing is shadowed
    assert first["choices"][0]["message"] == unshadowed["choices"][0]["message"]


def test_a_shadow_runs_a_chunk_a_step_and_yields_to_a_request_that_arrives():
    """A long shadow holds a request that arrives while it runs back by one chunk, not by its whole prompt."""
    engine = Engine.from_pretrained()
    loop = asyncio.new_event_loop()
    kls: list[float] = []
    worker = EngineWorker(engine, max_num_batched_tokens=16, shadow_rate=1.0, shadowed=lambda _, kl: kls.append(kl))
    served = engine.generate(DOCS, QUERIES[0], max_new_tokens=1, seam=4)
    assert served.stats["prompt_tokens"] > 2 * 16
    worker._sample_shadow(Job(engine.prepare(**_arguments(QUERIES[0], seam=4)), loop), served)
    [shadow] = worker.scheduler.background  # a background request of the worker's own scheduler
    worker._turn()  # idle: the shadow's first piece
    ran = shadow.prefilled_tokens
    assert 0 < ran <= 16 and not kls
    job = Job(engine.prepare(**_arguments(QUERIES[1])), loop)
    worker.submit(job)
    worker._turn()  # the request goes first; the shadow waits where it was
    assert job.request.started is not None and shadow.prefilled_tokens == ran and not kls
    while job in worker.active or worker.prefilling is job:
        worker._turn()
        assert shadow.prefilled_tokens == ran  # nothing of it runs while the request is in hand
    while not worker.scheduler.idle:
        worker._turn()
    full = engine.prompt_logits(DOCS, QUERIES[0], mode="full")
    assert len(kls) == 2  # the first shadow's, then the one of the request that arrived (shadow_rate 1)
    assert kls[0] == pytest.approx(kl_divergence(full, served.prompt_logits), rel=1e-3)  # chunked: rounding
    loop.close()


def test_shadow_rate_is_off_by_default_and_checked():
    engine = Engine.from_pretrained()
    assert EngineWorker(engine).shadow_rate == 0.0
    for bad in (-0.1, 1.5, True):
        with pytest.raises(ValueError, match="shadow_rate"):
            EngineWorker(engine, shadow_rate=bad)


def test_a_guarded_request_exports_its_estimate():
    engine = Engine.from_pretrained(fidelity_budget=1e9)
    with serve_in_thread(create_app(engine, model_names=["m"])) as url:
        answer = _ask_shadowed(url)
        assert answer["choices"][0]["message"]["content"] is not None
        text = httpx.get(url + "/metrics").text
    assert 'hypic_fidelity_estimate_count{mode="hypic"} 1.0' in text
    assert 'hypic_fidelity_actions_total{action="none"} 1.0' in text
