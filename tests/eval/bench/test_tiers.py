"""The tier benchmark on a tiny model: each tier serves every entry of a warm request, through a real Redis."""

from __future__ import annotations

from hypic_rag.eval.bench.tiers import run
from hypic_rag.testing.synthetic import TINY


def test_each_tier_serves_the_warm_request():
    report = run(segments=3, segment_tokens=24, query_tokens=4, layers=2, repeats=1, log=lambda _: None, shapes=TINY)
    assert set(report["results"]) == {"full", "memory", "disk", "remote"}
    sizes = {report["results"][t]["entry_bytes"] for t in ("memory", "disk", "remote")}
    assert len(sizes) == 1 and sizes.pop() > 0  # the same entries, whichever tier they came from
