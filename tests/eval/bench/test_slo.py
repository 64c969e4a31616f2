"""The SLO simulator: its cache models, its queue, the QPS search, and a tiny end-to-end run."""

from __future__ import annotations

import pytest

from hypic_rag.eval.bench.slo import CacheModel, Traffic, max_qps, percentile, run, simulate
from hypic_rag.testing.synthetic import TINY


def test_cache_models_count_what_each_mode_can_reuse():
    hypic, prefix, full = CacheModel("hypic", 10), CacheModel("prefix", 10), CacheModel("full", 10)
    for cache in (hypic, prefix, full):
        cache.serve([1, 2, 3])
    assert hypic.serve([3, 1, 4]) == 2  # order does not matter
    assert prefix.serve([3, 1, 4]) == 0  # the first document moved
    assert prefix.serve([1, 2, 5]) == 2
    assert full.serve([1, 2, 3]) == 0
    small = CacheModel("hypic", 2)
    small.serve([1, 2, 3])
    assert small.serve([3, 2, 1]) == 2  # 1 was evicted; 2 and 3 remain
    small.serve([4, 5])
    assert small.serve([2, 3]) == 0


def test_queueing_grows_with_load_and_the_search_respects_the_slo():
    wl = Traffic(corpus=50, k=3)
    service = [1.0, 0.7, 0.4, 0.1]
    light = percentile(simulate("hypic", service, 100, wl, 0.1, 2000, 0), 90)
    heavy = percentile(simulate("hypic", service, 100, wl, 1.5, 2000, 0), 90)
    assert heavy > light
    q = max_qps("hypic", service, 100, wl, slo=2.0, n=2000, seed=0)
    assert percentile(simulate("hypic", service, 100, wl, q, 2000, 0), 90) <= 2.0
    assert percentile(simulate("hypic", service, 100, wl, q * 1.1, 2000, 0), 90) > 2.0
    assert max_qps("full", [1.0] * 4, 100, wl, slo=2.0, n=2000, seed=0) < q


def test_requests_follow_zipf_popularity():
    reqs = Traffic(corpus=100, k=4, zipf=1.2).requests(500, 1)
    assert all(len(set(r)) == 4 for r in reqs)
    counts = [sum(d == i for r in reqs for d in r) for i in (0, 50)]
    assert counts[0] > 5 * counts[1]


def test_end_to_end_on_a_tiny_model():
    report = run(
        Traffic(corpus=20, k=3, doc_tokens=32, query_tokens=4),
        layers=2,
        requests=200,
        check_requests=4,
        shapes=TINY,
        log=lambda _: None,
        repeats=1,
    )
    assert set(report["max_qps"]) == {"full", "prefix", "hypic"}
    assert all(len(v) == 4 for v in report["service_ttft_s"].values())
    assert set(report["closed_loop"]["hypic"]) == {
        "measured_mean_ttft_s",
        "predicted_mean_ttft_s",
        "relative_difference",
    }
    with pytest.raises(ValueError, match="corpus larger than k"):
        run(Traffic(corpus=3, k=3), shapes=TINY, log=lambda _: None)
