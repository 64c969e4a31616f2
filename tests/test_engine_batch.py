"""Requests decoded together (``decoding.step_together``, ``Engine.run_together``) answer as each does alone: modes
mixed, prefills between decode steps, a request joining mid-decode, one cancelled mid-batch, a sampled one and a
constrained one, on the bundled model."""

from __future__ import annotations

import threading

import pytest

from hypic_rag import Engine, Segment
from hypic_rag.batch import BatchError
from hypic_rag.decoding import step_together

DOCS = [
    Segment("Ana Lee lives in Oslo and works as a pilot for a small airline."),
    Segment("Bo Ek lives in Rome. He teaches chemistry at a school near the river."),
    Segment("The museum in Lima opens at nine and closes at five, except on Mondays."),
]
SCHEMA = {
    "type": "json_schema",
    "json_schema": {"schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}}},
}
# (segments, query, options): every mode, a sampled answer with logprobs and penalties, a constrained one.
REQUESTS = [
    (DOCS, "Where does Ana live?", {"mode": "hypic"}),
    (DOCS[::-1], "What does Bo teach?", {"mode": "prefix"}),
    (DOCS[1:], "When does the museum open?", {"mode": "full"}),
    (DOCS[:2], "Who is a pilot?", {"mode": "pic"}),
    (
        DOCS,
        "Tell me about Lima.",
        {"mode": "hypic", "temperature": 0.9, "seed": 7, "logprobs": True, "top_logprobs": 2, "frequency_penalty": 0.5},
    ),
    (DOCS[::-1], "Which city?", {"mode": "hypic", "response_format": SCHEMA}),
]
TOKENS = 12


@pytest.fixture(scope="module")
def engine() -> Engine:
    engine = Engine.from_pretrained(min_cached_tokens=0)
    for segments, query, options in REQUESTS:  # documents warm, as the batched runs will find them
        engine.generate(segments, query, max_new_tokens=2, **options)
    return engine


@pytest.fixture(scope="module")
def alone(engine):
    return [engine.generate(s, q, max_new_tokens=TOKENS, **o) for s, q, o in REQUESTS]


def _same(got, want) -> None:
    assert got.token_ids == want.token_ids
    assert got.text == want.text
    assert got.finish_reason == want.finish_reason
    if want.logprobs is not None:
        assert [p.token for p in got.logprobs] == [p.token for p in want.logprobs]
        assert max(abs(a.logprob - b.logprob) for a, b in zip(got.logprobs, want.logprobs, strict=True)) < 1e-4


def test_requests_joining_mid_decode_and_one_cancelled_answer_as_alone(engine, alone):
    cancel = threading.Event()
    runs: dict[int, object] = {}
    # Requests join at these decode steps (their prefills run between the others' steps); request 3 is cancelled
    # after step 4, while the others keep decoding.
    joins = {0: 0, 1: 0, 2: 2, 3: 2, 4: 3, 5: 5}
    step = 0
    while True:
        for i, at in joins.items():
            if at == step:
                segments, query, options = REQUESTS[i]
                cancelled = cancel.is_set if i == 3 else None
                runs[i] = engine.start(segments, query, max_new_tokens=TOKENS, cancelled=cancelled, **options)
        live = [run for run in runs.values() if not run.done]
        if not live and len(runs) == len(REQUESTS):
            break
        step_together([run.decoder for run in live])
        if step == 4:
            cancel.set()
        step += 1
    for i, run in runs.items():
        out = run.output()
        if i == 3:
            assert out.finish_reason == "cancelled"
            assert 0 < len(out.token_ids) < len(alone[i].token_ids)
            assert out.token_ids == alone[i].token_ids[: len(out.token_ids)]
        else:
            _same(out, alone[i])


def test_generate_batch_equals_each_request_alone(engine, alone):
    greedy = [i for i, (_, _, o) in enumerate(REQUESTS) if o["mode"] == "hypic" and len(o) == 1]
    outs = engine.generate_batch([REQUESTS[i][:2] for i in greedy], mode="hypic", max_new_tokens=TOKENS)
    for i, out in zip(greedy, outs, strict=True):
        _same(out, alone[i])


def test_chat_batch_equals_each_chat_alone(engine):
    conversations = [
        [{"role": "system", "content": DOCS[0].text}, {"role": "user", "content": "Where does Ana live?"}],
        [{"role": "user", "content": "Name a city."}],
        [{"role": "system", "content": DOCS[2].text}, {"role": "user", "content": "When does it open?"}],
    ]
    want = [engine.chat(c, max_new_tokens=TOKENS) for c in conversations]
    got = engine.chat_batch(conversations, max_new_tokens=TOKENS)
    for g, w in zip(got, want, strict=True):
        _same(g, w)
    with pytest.raises(ValueError, match="conversations must be a list"):
        engine.chat_batch("hello")


@pytest.mark.parametrize("mode", ["full", "prefix", "hypic"])
def test_a_prompt_run_a_chunk_at_a_time_answers_as_whole(mode):
    engine = Engine.from_pretrained(min_cached_tokens=0)
    docs, query = DOCS * 3, "Where does Ana live?"
    whole = engine.generate(docs, query, mode=mode, max_new_tokens=TOKENS)
    engine.clear_cache()
    pending = engine.start(docs, query, mode=mode, max_new_tokens=TOKENS, prefill_chunk=16)
    chunks = []
    while pending.generation is None:
        chunks.append(pending.advance())
    out = engine.run_together([pending.generation])[0]
    assert out.token_ids == whole.token_ids
    assert sum(chunks) == out.stats["recomputed_tokens"] == whole.stats["recomputed_tokens"]
    if mode == "hypic":  # a cold segment a chunk, then one forward of the seams and the query, which records the
        assert len(chunks) == len(docs) + 1  # state where the query begins (kept)
    else:
        assert max(chunks) <= 16 and len(chunks) >= whole.stats["prompt_tokens"] // 16
    with pytest.raises(ValueError, match="prefill_chunk must be a positive"):
        engine.start(docs, query, prefill_chunk=0)
    with pytest.raises(ValueError, match="prefill_chunk is taken by start and start_chat, not by generate"):
        engine.generate(docs, query, prefill_chunk=16)  # it runs the prompt whole: no Prefilling to advance
    with pytest.raises(ValueError, match="not by chat_batch"):
        engine.chat_batch([[{"role": "user", "content": query}]], prefill_chunk=16)


def test_a_token_taken_early_goes_out_at_once_and_is_decoded_next(engine, alone):
    segments, query, options = REQUESTS[0]
    seen: list[int] = []
    run = engine.start(segments, query, max_new_tokens=TOKENS, on_token=lambda i, _d: seen.append(i), **options)
    run.decoder.take_now()
    run.decoder.take_now()  # already held: takes nothing more
    assert seen == alone[0].token_ids[:1]
    _same(engine.run_together([run])[0], alone[0])


def test_d2_one_failing_chat_leaves_the_others_answers_unchanged(engine):
    conversations = [
        [{"role": "system", "content": DOCS[0].text}, {"role": "user", "content": "Where does Ana live?"}],
        [{"role": "narrator", "content": "no such role"}],  # fails when its turn comes, after the first is in
        [{"role": "user", "content": "Name a city."}],
    ]
    want = [engine.chat(conversations[i], max_new_tokens=TOKENS) for i in (0, 2)]
    got = engine.chat_batch(conversations, max_new_tokens=TOKENS, return_exceptions=True)
    assert isinstance(got[1], ValueError) and "narrator" in str(got[1])
    _same(got[0], want[0])
    _same(got[2], want[1])
    with pytest.raises(BatchError, match=r"1 of 3 requests failed; request 1: ValueError: .*narrator") as caught:
        engine.chat_batch(conversations, max_new_tokens=TOKENS)
    assert caught.value.failed == [1] and isinstance(caught.value.__cause__, ValueError)
    _same(caught.value.results[0], want[0])  # nothing the batch computed is lost
    _same(caught.value.results[2], want[1])


def test_d2_a_stream_that_fails_mid_decode_fails_only_its_request(engine, alone):
    def broken(_id, _delta):
        raise RuntimeError("the client's stream broke")

    runs = [engine.start(s, q, max_new_tokens=TOKENS, **o) for s, q, o in REQUESTS[:3]]
    runs.insert(1, engine.start(DOCS, "Who is a pilot?", max_new_tokens=TOKENS, on_token=broken))
    got = engine.run_together(runs, return_exceptions=True)
    assert isinstance(got[1], RuntimeError) and "stream broke" in str(got[1])
    for out, want in zip([got[0], *got[2:]], alone[:3], strict=True):
        _same(out, want)


def test_batches_decode_at_most_max_active_at_once(engine, alone, decode_rows):
    rows = decode_rows(engine)
    outs = engine.generate_batch([r[:2] for r in REQUESTS[:4]], max_active=2, max_new_tokens=TOKENS, mode="hypic")
    assert max(rows) == 2
    want = [engine.generate(s, q, max_new_tokens=TOKENS, mode="hypic") for s, q, _ in REQUESTS[:4]]
    for got, w in zip(outs, want, strict=True):
        _same(got, w)
