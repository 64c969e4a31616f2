"""Cold prefill on a local Ray cluster of 2 CPU actors: the split, and answers equal to the in-process policy's."""

from __future__ import annotations

import pytest

from hypic_rag import Engine, Segment
from hypic_rag.ray_prefill import split_longest_first
from hypic_rag.testing.redis import RedisServer

DOCS = [
    "Stithgo Dithgaith lives in Kothvenville and works as a pilot at Krudrel Labs since the spring.",
    "Ana Lee lives in Oslo and works as a baker; she has two cats and a bicycle.",
    "Bo Ek lives in Rome and works as a nurse at the city hospital near the river.",
    "Cy Ru lives in Lima.",
]


def test_misses_go_longest_first_to_the_least_loaded_worker():
    assert split_longest_first([10, 50, 30, 20], 2) == [[1, 0], [2, 3]]  # 60 and 50 tokens
    assert split_longest_first([5], 3) == [[0]]


@pytest.fixture(scope="module")
def ray_engine(tmp_path_factory):
    import ray

    with RedisServer(tmp_path_factory.mktemp("redis")) as redis:
        engine = Engine.from_pretrained(prefill_workers=2, min_cached_tokens=1, cache_url=redis.url)
        yield engine, redis
        engine.prefill_pool.close()
    ray.shutdown()


@pytest.mark.ray
def test_ray_workers_answer_as_the_in_process_policy_and_fill_the_shared_tier(ray_engine):
    engine, redis = ray_engine
    local = Engine.from_pretrained(min_cached_tokens=1)
    segs = [Segment(d) for d in DOCS]
    theirs = local.generate(segs, "Where does Bo Ek live?", max_new_tokens=4)
    ours = engine.generate(segs, "Where does Bo Ek live?", max_new_tokens=4)
    assert ours.stats["miss_segments"] == 4
    assert float((ours.prompt_logits - theirs.prompt_logits).abs().max()) <= 1e-4
    assert ours.token_ids == theirs.token_ids
    engine.segment_store.remote.flush()
    replica = Engine.from_pretrained(min_cached_tokens=1, cache_url=redis.url)  # another machine, no workers
    again = replica.generate(segs[::-1], "Where does Bo Ek live?", max_new_tokens=1)
    assert again.stats["hit_segments"] == 4 and again.stats["remote_hits"] >= 4
    warm_here = engine.prompt_logits(segs[::-1], "Where does Bo Ek live?")  # from its own memory tier
    assert float((warm_here - again.prompt_logits).abs().max()) <= 1e-5


def test_bad_worker_counts_are_refused():
    with pytest.raises(ValueError, match="prefill_workers must be an integer >= 1"):
        Engine.from_pretrained(prefill_workers=-1)
