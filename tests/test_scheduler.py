"""The one scheduler, driven directly (no thread, no queue): first come first served under ``max_active`` and the
token budget, answers equal to the same requests alone, cancellation in every state, and failures that stay the
failing request's own."""

from __future__ import annotations

from functools import partial

import pytest

from hypic_rag import Engine, Segment
from hypic_rag.concurrent import SharedBatch
from hypic_rag.request import Request
from hypic_rag.scheduler import MAX_PROMPTS, Scheduler
from hypic_rag.status import Event, Status

ANSWERED = (Status.STOPPED, Status.LENGTH)  # ended with a whole answer

DOCS = [
    Segment("Ana Lee lives in Oslo and works as a pilot for a small airline based near the fjord."),
    Segment("Bo Ek lives in Rome. He teaches chemistry at a school near the river, five days a week."),
]
QUERIES = ["Where does Ana live?", "What does Bo teach?", "Who is a pilot?", "Name a river."]
TOKENS = 8


@pytest.fixture(scope="module")
def engine() -> Engine:
    engine = Engine.from_pretrained()
    for query in QUERIES:  # documents warm, as the scheduler's requests find them
        engine.generate(DOCS, query, max_new_tokens=2)
    return engine


def _request(engine: Engine, query: str, flag: dict | None = None, **options) -> Request:
    def begin(prefill_chunk: int):
        return engine.start(DOCS, query, max_new_tokens=TOKENS, prefill_chunk=prefill_chunk, **options)

    cancelled = (lambda: flag["cancel"]) if flag is not None else (lambda: False)
    return Request(begin, cancelled, tag=query)


def _run(scheduler: Scheduler, log: list) -> int:
    steps = 0
    while not scheduler.idle:
        scheduler.step(wait=False)
        steps += 1
        assert steps < 500
    return steps


def test_requests_answer_as_alone_and_at_most_max_active_decode(engine):
    alone = [engine.generate(DOCS, q, max_new_tokens=TOKENS).token_ids for q in QUERIES]
    log: list = []
    widths = []
    scheduler = Scheduler(max_active=2, max_num_batched_tokens=64, notify=lambda k, r: log.append((k, r.tag)))
    requests = [_request(engine, q) for q in QUERIES]
    for request in requests:
        scheduler.add(request)
    while not scheduler.idle:
        scheduler.step(wait=False)
        widths.append(len(scheduler.running))
    assert max(widths) == 2
    assert [r.output.token_ids for r in requests] == alone
    assert all(r.status in ANSWERED for r in requests)
    starts = [tag for kind, tag in log if kind == Event.FIRST]
    assert starts == QUERIES  # first come, first served
    assert [kind for kind, tag in log if tag == QUERIES[0]] == [Event.FIRST, Event.DONE]


def test_source_is_pulled_only_when_there_is_room(engine):
    queued = [_request(engine, q) for q in QUERIES]

    def source(wait: bool):
        return queued.pop(0) if queued else None

    scheduler = Scheduler(max_active=1, max_num_batched_tokens=64, source=source)
    scheduler.step(wait=False)
    assert len(queued) == 3  # one taken: the batch is full once it runs
    while queued or not scheduler.idle:
        assert len(scheduler.running) <= 1
        scheduler.step(wait=False)


def test_cancellation_in_every_state(engine):
    flags = [{"cancel": False} for _ in range(3)]
    log: list = []
    scheduler = Scheduler(max_active=1, max_num_batched_tokens=16, notify=lambda k, r: log.append((k, r.tag)))
    decoding = _request(engine, QUERIES[0], flags[0])
    prefilling = _request(engine, QUERIES[1], flags[1], mode="full")  # in context: 16 tokens a step
    waiting = _request(engine, QUERIES[2], flags[2])
    for request in (decoding, prefilling, waiting):
        scheduler.add(request)
    for _ in range(50):
        if decoding in scheduler.running:
            break
        scheduler.step(wait=False)
    flags[0]["cancel"] = True  # decoding: ends at its next token
    flags[2]["cancel"] = True  # waiting: dropped when its turn comes
    for _ in range(50):
        scheduler.step(wait=False)
        if scheduler.prefilling is prefilling and prefilling.prefilled_tokens:
            break
    assert decoding.status == Status.CANCELLED and decoding.output.finish_reason == "cancelled"
    assert scheduler.prefilling is prefilling, "the in-context prompt runs in more than one piece"
    flags[1]["cancel"] = True  # its prompt stops before its next piece
    _run(scheduler, log)
    assert prefilling.status == Status.CANCELLED and waiting.status == Status.CANCELLED
    assert prefilling.output is None and waiting.output is None  # cancelled before a first token: no answer
    assert (Event.DONE, QUERIES[1]) in log and (Event.DONE, QUERIES[2]) in log
    assert (Event.FIRST, QUERIES[1]) not in log and (Event.FIRST, QUERIES[2]) not in log


def test_a_failing_request_fails_alone(engine):
    log: list = []
    scheduler = Scheduler(max_active=4, max_num_batched_tokens=64, notify=lambda k, r: log.append((k, r.tag)))
    good = [_request(engine, q) for q in QUERIES[:2]]
    bad_start = Request(partial(engine.start, DOCS, "x", mode="nope"), tag="bad start")

    def broken(_id, _text):
        raise RuntimeError("a streaming callback failed")

    bad_stream = Request(
        lambda prefill_chunk: engine.start(
            DOCS, QUERIES[2], max_new_tokens=TOKENS, prefill_chunk=prefill_chunk, on_token=broken
        ),
        tag="bad stream",
    )
    for request in (good[0], bad_start, bad_stream, good[1]):
        scheduler.add(request)
    _run(scheduler, log)
    assert bad_start.status == Status.FAILED and isinstance(bad_start.error, ValueError)
    assert bad_stream.status == Status.FAILED and "streaming callback" in str(bad_stream.error)
    alone = [engine.generate(DOCS, q, max_new_tokens=TOKENS).token_ids for q in QUERIES[:2]]
    assert [r.output.token_ids for r in good] == alone
    assert {tag for kind, tag in log if kind == Event.ERROR} == {"bad start", "bad stream"}


def test_the_step_budget_is_checked():
    with pytest.raises(ValueError, match="at least max_active"):
        Scheduler(max_active=8, max_num_batched_tokens=4)
    with pytest.raises(ValueError, match="max_active must be"):
        Scheduler(max_active=0)


def _words(n: int, seed: int) -> str:
    names = ["Ana", "Bo", "Oslo", "Rome", "river", "school", "pilot", "museum", "opens", "closes", "nine", "five"]
    return " ".join(names[(seed * 7 + i * 5) % len(names)] for i in range(n)) + "."


def test_d3_no_step_runs_more_than_the_budget_but_a_lone_atomic_piece(engine):
    budget = 40
    cold = [Segment(_words(60, s)) for s in range(3)]  # a cold fill of about 60 tokens: atomic, over the budget
    loads = [
        (DOCS, QUERIES[0], {}),  # warm: the fused seam+query forward alone
        (cold[:2], QUERIES[1], {}),  # cold segments, one fill a piece
        (DOCS + cold[2:], QUERIES[2], {"mode": "full"}),  # in context: splittable
        (cold[::-1], QUERIES[3], {"mode": "prefix"}),
        (DOCS + cold[:1], QUERIES[0], {"seam": "auto"}),  # probes: the guard's pieces
        (cold[1:], QUERIES[1], {"fidelity_budget": 0.0}),  # over any budget: exact, in context after its probes
    ]
    alone = [engine.generate(s, q, max_new_tokens=TOKENS, **o) for s, q, o in loads]
    engine.clear_cache()
    for query in QUERIES:  # DOCS warm again, the cold ones cold
        engine.generate(DOCS, query, max_new_tokens=2)
    scheduler = Scheduler(max_active=4, max_num_batched_tokens=budget)
    requests = [
        Request(partial(engine.start, s, q, max_new_tokens=TOKENS, **o), tag=i) for i, (s, q, o) in enumerate(loads)
    ]
    for request in requests:
        scheduler.add(request)
    reports = []
    while not scheduler.idle:
        reports.append(scheduler.step(wait=False))
        assert len(reports) < 500
    for report in reports:
        lone_atomic = len(report.pieces) == 1 and not report.pieces[0].splittable
        assert report.prefilled + report.decoded <= budget or lone_atomic, report
    assert any(len(r.pieces) > 1 for r in reports)  # the budget was shared, not one piece a step
    assert any(r.prefilled + r.decoded > budget for r in reports)  # and a fill over it ran, alone
    for request, want in zip(requests, alone, strict=True):
        assert request.status in ANSWERED, request.error
        assert request.output.token_ids == want.token_ids
        stats = request.output.stats  # each piece said what it ran: together, what the prompt ran
        probed = (stats.get("probe_tokens") or 0) + (stats.get("probe_cold_tokens") or 0)
        assert request.prefilled_tokens == stats["recomputed_tokens"] + probed


def test_d4_under_the_exact_policy_the_first_token_goes_out_before_the_deferred_fill(monkeypatch):
    engine = Engine.from_pretrained(cold_policy="exact", min_cached_tokens=0)
    log: list[str] = []
    fill = engine.prefill_program.fill

    def logged_fill(misses):
        log.append("fill")
        return fill(misses)

    monkeypatch.setattr(engine.prefill_program, "fill", logged_fill)

    def request(query: str) -> Request:
        on_token = lambda _id, _delta: log.append("token")  # noqa: E731
        return Request(partial(engine.start, DOCS, query, max_new_tokens=TOKENS, on_token=on_token))

    scheduler = Scheduler(max_active=2, max_num_batched_tokens=64)
    first = request(QUERIES[0])
    scheduler.add(first)
    scheduler.run()
    assert log[0] == "token" and log.count("fill") == 1  # handed out, then the fill, once
    assert first.output.stats["cold_policy"] == "exact" and first.output.stats["miss_segments"] == len(DOCS)
    log.clear()  # alone, through generate: the same order
    engine.clear_cache()
    out = engine.generate(DOCS, QUERIES[1], max_new_tokens=TOKENS, on_token=lambda _i, _d: log.append("token"))
    assert log[0] == "token" and log.count("fill") == 1
    assert out.ttft_s > 0
    warm = engine.generate(DOCS, QUERIES[2], max_new_tokens=2)
    assert warm.stats["hit_segments"] == len(DOCS)  # the cache learned them after the first token
    log.clear()  # a shared batch's last caller runs the fill before it returns
    engine.clear_cache()
    batch = SharedBatch()
    batch.run(partial(engine.start, DOCS, QUERIES[3], max_new_tokens=2))
    assert log == ["fill"] and batch.scheduler.idle


@pytest.mark.parametrize("mode", ["full", "hypic"])  # splittable chunks; atomic cold fills, each over the budget
def test_a_short_prompt_behind_a_long_one_is_in_at_its_next_step_and_the_long_one_never_starves(engine, mode):
    budget = 48
    long_docs = [Segment(_words(70, s)) for s in range(10, 15)]  # about 350 tokens, cold
    alone_long = engine.generate(long_docs, QUERIES[0], max_new_tokens=TOKENS, mode=mode)
    alone_short = engine.generate(DOCS, QUERIES[1], max_new_tokens=TOKENS)
    engine.clear_cache()
    for query in QUERIES:
        engine.generate(DOCS, query, max_new_tokens=2)
    log: list = []
    scheduler = Scheduler(max_active=4, max_num_batched_tokens=budget, notify=lambda k, r: log.append((k, r.tag)))
    long = Request(partial(engine.start, long_docs, QUERIES[0], max_new_tokens=TOKENS, mode=mode), tag="long")
    short = Request(partial(engine.start, DOCS, QUERIES[1], max_new_tokens=TOKENS), tag="short")
    scheduler.add(long)
    scheduler.step(wait=False)  # the long prompt's first step
    scheduler.add(short)
    progress = [long.prefilled_tokens]
    scheduler.step(wait=False)
    progress.append(long.prefilled_tokens)
    assert (Event.FIRST, "short") in log and (Event.FIRST, "long") not in log  # passed the long one, at its next step
    scheduler.step(wait=False)
    progress.append(long.prefilled_tokens)
    steps = 0
    while (Event.FIRST, "long") not in log:
        scheduler.step(wait=False)
        progress.append(long.prefilled_tokens)
        steps += 1
        assert steps < 200
    assert all(b > a for a, b in zip(progress[::2], progress[2::2], strict=False))  # a piece every other step
    _run(scheduler, log)
    assert long.output.token_ids == alone_long.token_ids and short.output.token_ids == alone_short.token_ids


def test_prompts_begin_in_the_order_they_came_and_at_most_max_prompts_run_at_once(engine):
    log: list = []
    scheduler = Scheduler(max_active=16, max_num_batched_tokens=24, notify=lambda k, r: log.append((k, r.tag)))
    requests = [
        Request(partial(engine.start, DOCS, q, max_new_tokens=2, mode="full"), tag=i) for i, q in enumerate(QUERIES * 2)
    ]
    for request in requests:
        scheduler.add(request)
    most = 0
    while not scheduler.idle:
        scheduler.step(wait=False)
        most = max(most, len(scheduler.prompts))
    assert most == MAX_PROMPTS  # side by side, never more
    assert [r.tag for r in sorted(requests, key=lambda r: r.order)] == list(
        range(len(requests))
    )  # first come, first begun
    starts = [tag for kind, tag in log if kind == Event.FIRST]
    assert sorted(starts) == list(range(len(requests))) and all(r.status in ANSWERED for r in requests)


def test_newcomers_every_step_never_stop_a_long_prompt(engine):
    """A new prompt arrives at every step: each goes first in its own, within half the budget, and the rest of the
    step goes round robin among the prompts running before, so the long one runs a piece in every MAX_PROMPTS
    steps."""
    budget = 64
    long_docs = [Segment(_words(70, s)) for s in range(20, 24)]
    scheduler = Scheduler(max_active=16, max_num_batched_tokens=budget)
    long = Request(partial(engine.start, long_docs, QUERIES[0], max_new_tokens=2, mode="full"), tag="long")
    scheduler.add(long)
    scheduler.step(wait=False)
    progress = [long.prefilled_tokens]
    for i in range(8):
        scheduler.add(Request(partial(engine.start, DOCS, QUERIES[i % 4], max_new_tokens=2, mode="full"), tag=i))
        scheduler.step(wait=False)
        progress.append(long.prefilled_tokens)
    assert all(c > a for a, c in zip(progress, progress[MAX_PROMPTS:], strict=False)), progress
    _run(scheduler, [])
    assert long.status in ANSWERED


def test_a_background_request_runs_only_when_nothing_else_is_in_hand(engine):
    scheduler = Scheduler(max_active=4, max_num_batched_tokens=16)
    back = _request(engine, QUERIES[0], mode="full")  # in context: 16 tokens a step
    front = _request(engine, QUERIES[1])
    scheduler.add(back, background=True)
    scheduler.add(front)
    while not front.status.ended:
        scheduler.step(wait=False)
        assert back.prefilled_tokens == 0  # nothing of it runs while a request is in hand
    steps = _run(scheduler, [])
    assert steps > 1 and back.status in ANSWERED  # a piece a step, then its answer
    assert back.output.token_ids == engine.generate(DOCS, QUERIES[0], max_new_tokens=TOKENS, mode="full").token_ids
