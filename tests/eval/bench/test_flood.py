"""The flood benchmark's stream and a short run of it: the value policy keeps more of the pool than LRU."""

from __future__ import annotations

from collections import Counter

from hypic_rag.eval.bench.flood import plot, run, stream


def test_the_stream_draws_popular_pool_documents_and_never_repeats_a_new_one():
    requests = stream(2000, pool=50, per_request=4, novel=2, zipf=0.9, seed=0)
    assert all(len(r) == 6 and len(set(r)) == 6 for r in requests)
    pooled = Counter(d for r in requests for d in r if d < 50)
    new = [d for r in requests for d in r if d >= 50]
    assert len(new) == len(set(new)) == 4000
    assert pooled[0] > 2 * pooled[25] > 0  # Zipf: the head is drawn far more than the middle


def test_a_short_flood_keeps_more_of_the_pool_under_the_value_policy(tmp_path):
    report = run(
        requests=80, pool=30, budget_share=0.2, doc_tokens=8, query_tokens=2, layers=2, window=40, log=lambda _: None
    )
    lru, value = report["results"]["lru"], report["results"]["value"]
    assert value["pool_hit_ratio"] > lru["pool_hit_ratio"]
    assert value["refused"].get("frequency", 0) > 0 and not lru["refused"]
    assert max(lru["memory_bytes"], value["memory_bytes"]) <= report["budget_bytes"]
    assert len(value["windows"]["pool_hit_ratio"]) == 2
    assert plot(report, tmp_path / "flood.png").stat().st_size > 0
