from __future__ import annotations

import pytest

from hypic_rag.eval.bench.ttft import run
from hypic_rag.testing.synthetic import TINY


def test_bench_json_follows_the_api_and_warm_means_reordered():
    report = run(
        segments=4,
        segment_tokens=64,
        query_tokens=8,
        modes=["full", "prefix", "pic", "hypic", "transformers"],
        repeats=1,
        layers=4,
        log=lambda _: None,
        shapes=TINY,
    )
    rows = {r["mode"]: r for r in report["results"]}
    assert set(rows) == {"full", "prefix", "pic", "hypic", "transformers"}
    for r in rows.values():
        assert r["ttft_s"] > 0 and r["prompt_tokens"] == 4 * 64 + 8 and r["segments"] == 4
    assert rows["hypic"]["hit_ratio"] == 1.0 and rows["pic"]["hit_ratio"] == 1.0
    assert rows["prefix"]["hit_ratio"] < 1.0  # the earlier request had the documents in another order
    assert rows["hypic"]["recomputed_tokens"] == 3 * 8 + 8
    assert set(report["speedup"]) == {"prefix", "pic", "hypic", "transformers"}


def test_bench_needs_full():
    with pytest.raises(ValueError, match="must include 'full'"):
        run(modes=["hypic"], log=lambda _: None, shapes=TINY)
