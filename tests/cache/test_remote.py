"""The shared Redis tier, against a real redis-server on loopback: replicas share entries, faults degrade, and
what Redis holds is checked like any other tier's bytes."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from hypic_rag import Engine, Segment
from hypic_rag.cache import segment_key
from hypic_rag.cache.remote import PREFIX, RedisTier
from hypic_rag.testing.redis import RedisServer

DOCS = [
    "Stithgo Dithgaith lives in Kothvenville and works as a pilot at Krudrel Labs.",
    "Ana Lee lives in Oslo and works as a baker; she has two cats and a bicycle.",
    "Bo Ek lives in Rome and works as a nurse at the city hospital near the river.",
]
QUESTION = "Where does Bo Ek live?"


@pytest.fixture
def redis_server(tmp_path):
    with RedisServer(tmp_path / "redis") as server:
        yield server


def _engine(**options) -> Engine:
    return Engine.from_pretrained(**{"min_cached_tokens": 1, **options})


def _ask(engine: Engine, docs=DOCS):
    out = engine.generate([Segment(d) for d in docs], QUESTION, max_new_tokens=1)
    if engine.segment_store.remote is not None:
        engine.segment_store.remote.flush()
    return out


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return int(a.argmax()) == int(b.argmax()) and float((a - b).abs().max()) < 1e-4


@pytest.fixture(scope="module")
def oracle():
    bare = _engine()

    def logits(docs=DOCS):
        bare.clear_cache()
        return bare.prompt_logits([Segment(d) for d in docs], QUESTION)

    return logits


def test_the_tier_round_trips_bytes_and_clears_only_its_keys(redis_server):
    tier = RedisTier(redis_server.url)
    tier.set("k", b"\x00bytes\xff")
    tier.flush()
    assert tier.get("k") == b"\x00bytes\xff" and tier.get("missing") is None
    tier.client.set("someone-elses", b"x")
    assert tier.stats()["entries"] == 1
    assert tier.clear() == 1 and tier.get("k") is None and tier.client.get("someone-elses") == b"x"


def test_a_document_first_seen_by_one_replica_is_a_hit_on_another(redis_server, oracle, tmp_path):
    a = _engine(cache_url=redis_server.url)
    _ask(a)
    b = _engine(cache_url=redis_server.url, cache_dir=tmp_path / "disk")  # another machine: nothing local
    out = _ask(b, DOCS[::-1])
    assert out.stats["remote_hits"] >= 3 and out.stats["hit_segments"] == 3
    assert _same(out.prompt_logits, oracle(DOCS[::-1]))
    b.memory.clear()  # a remote hit was promoted to b's disk: the next lookup finds it there
    again = _ask(b, DOCS[::-1])
    assert again.stats["disk_hits"] >= 3 and again.stats["remote_hits"] == 0


def test_redis_killed_mid_run_fails_no_request_and_hits_resume_after_a_restart(redis_server, oracle):
    engine = _engine(cache_url=redis_server.url)
    engine.segment_store.retry_s = 0.3
    _ask(engine)
    redis_server.kill()
    engine.memory.clear()
    down = _ask(engine, DOCS[::-1])
    assert down.stats["tier_errors"] == 1 and _same(down.prompt_logits, oracle(DOCS[::-1]))
    redis_server.start()  # empty again: no persistence
    time.sleep(0.35)
    engine.memory.clear()
    refill = _ask(engine)  # the tier is tried again, reconnects, and takes the entries back
    assert refill.stats["tier_errors"] == 0 and _same(refill.prompt_logits, oracle())
    engine.memory.clear()
    assert _ask(engine, DOCS[::-1]).stats["remote_hits"] >= 3


def test_a_slow_redis_is_bounded_by_the_timeout(redis_server, oracle):
    engine = _engine(cache_url=redis_server.url)
    # Redis is stopped (SIGSTOP) while the request runs: it answers nothing until it is continued, however long
    # a loaded machine takes over the rest of the request, so the property is that the call times out, with no
    # race against a wall clock.
    os.kill(redis_server.proc.pid, signal.SIGSTOP)
    try:
        out = _ask(engine)
    finally:
        os.kill(redis_server.proc.pid, signal.SIGCONT)
    # One call timed out, then the tier was bypassed; the answer is the cache-less one.
    assert out.stats["tier_errors"] == 1 and _same(out.prompt_logits, oracle())


def test_a_corrupted_value_in_redis_is_detected_and_recomputed(redis_server, oracle):
    writer = _engine(cache_url=redis_server.url)
    _ask(writer)
    key = segment_key(writer.segment_ids(Segment(DOCS[1])), writer.fingerprint, torch.float32)
    value = writer.segment_store.remote.client.get(PREFIX + key)
    damaged = value[:200] + bytes(b ^ 0xFF for b in value[200:264]) + value[264:]  # 64 bytes flipped
    writer.segment_store.remote.client.set(PREFIX + key, damaged)
    reader = _engine(cache_url=redis_server.url)
    out = _ask(reader, DOCS[::-1])
    assert out.stats["corrupt"] == 1 and _same(out.prompt_logits, oracle(DOCS[::-1]))


def test_another_models_fingerprint_never_reads_our_entries(redis_server, checkpoint):
    _ask(_engine(cache_url=redis_server.url))
    other = Engine.from_pretrained(checkpoint("qwen3_5_text"), cache_url=redis_server.url, min_cached_tokens=1)
    segs = [Segment(token_ids=list(range(10 + i, 40 + i))) for i in range(3)]
    out = other.generate(segs, Segment(token_ids=[3, 4, 5], kind="query"), max_new_tokens=1)
    assert out.stats["remote_hits"] == 0 and out.stats["corrupt"] == 0


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_16_bit_entries_round_trip_through_redis_and_never_mix_with_float32(redis_server, dtype):
    writer = _engine(cache_url=redis_server.url, entry_dtype=dtype)
    cold = _ask(writer)
    reader = _engine(cache_url=redis_server.url, entry_dtype=dtype)  # another replica
    warm = _ask(reader)
    assert warm.stats["remote_hits"] >= 3 and warm.stats["corrupt"] == 0 and warm.stats["hit_segments"] == 3
    # The cold request already composed the rounded entries it stored: the replica's hit gives the same logits.
    assert float((warm.prompt_logits - cold.prompt_logits).abs().max()) <= 1e-5
    wide = _engine(cache_url=redis_server.url)  # float32 entries: other keys, no hits, nothing corrupt
    out = _ask(wide)
    assert out.stats["remote_hits"] == 0 and out.stats["corrupt"] == 0 and out.stats["hit_segments"] == 0
    assert warm.stats["cache_bytes"] * 2 == pytest.approx(out.stats["cache_bytes"], rel=0.01)


def test_the_store_checks_its_tiers_and_says_why_one_is_bypassed(redis_server):
    engine = _engine(cache_url=redis_server.url)
    store = engine.segment_store
    store.retry_s = 0.2
    assert store.check_tiers() == {"remote": None} and store.tier_status() == {"remote": None}
    redis_server.kill()
    reason = store.check_tiers()["remote"]
    assert reason is not None and "Connection" in reason and store.tier_status() == {"remote": reason}
    redis_server.start()
    time.sleep(0.25)  # past retry_s: the next check tries it again
    assert store.check_tiers() == {"remote": None}


def _forge(engine: Engine, doc: str, server: RedisServer) -> None:
    """What one who can write the Redis does without the secret: take a document's entry, change its state (the
    attention values reversed along the tokens), recompute its checksum and put it back under the same key."""
    from dataclasses import replace

    from hypic_rag.cache.entry import AttentionEntry, SegmentEntry
    from hypic_rag.cache.seal import MAC_BYTES, MAGIC

    client = RedisTier(server.url).client
    key = PREFIX + segment_key(engine.segment_ids(Segment(doc)), engine.fingerprint, torch.float32)
    value = client.get(key)
    sealed = value.startswith(MAGIC)
    body = value[len(MAGIC) + MAC_BYTES :] if sealed else value
    entry = SegmentEntry.from_bytes(body, engine.fingerprint)
    attention = {i: AttentionEntry(a.keys, a.values.flip(1)) for i, a in entry.attention.items()}
    forged = replace(entry, attention=attention).to_bytes(engine.fingerprint)
    # the attacker cannot seal, but may keep the old seal or leave it off
    client.set(key, value[: len(MAGIC) + MAC_BYTES] + forged if sealed else forged)
    client.close()


def test_without_a_secret_whoever_writes_the_tier_changes_answers(redis_server, oracle):
    """The case the secret is for: an entry re-signed with its plain checksum is used as it is."""
    writer = _engine(cache_url=redis_server.url)
    _ask(writer)
    _forge(writer, DOCS[2], redis_server)
    victim = _engine(cache_url=redis_server.url)
    out = _ask(victim, DOCS[::-1])
    assert out.stats["corrupt"] == 0 and out.stats["remote_hits"] >= 3
    assert float((out.prompt_logits - oracle(DOCS[::-1])).abs().max()) > 1e-2


def test_with_a_secret_a_forged_entry_is_refused_counted_and_recomputed(redis_server, oracle):
    secret = "s3cret-s3cret-s3cret-0123456789"
    writer = _engine(cache_url=redis_server.url, cache_secret=secret)
    _ask(writer)
    _forge(writer, DOCS[2], redis_server)
    victim = _engine(cache_url=redis_server.url, cache_secret=secret)
    out = _ask(victim, DOCS[::-1])
    assert out.stats["corrupt"] == 1 and _same(out.prompt_logits, oracle(DOCS[::-1]))
    # the refused entry was rewritten, sealed: the next engine finds all three
    victim.segment_store.remote.flush()
    again = _ask(_engine(cache_url=redis_server.url, cache_secret=secret), DOCS[::-1])
    assert again.stats["corrupt"] == 0 and again.stats["remote_hits"] >= 3
    assert _same(again.prompt_logits, oracle(DOCS[::-1]))
    # another secret, or none, shares no key with it: nothing is read, nothing refused
    for other in ("another-secret-0123456789abcdef", None):
        stranger = _ask(_engine(cache_url=redis_server.url, cache_secret=other), DOCS[::-1])
        assert stranger.stats["remote_hits"] == 0 and stranger.stats["corrupt"] == 0
