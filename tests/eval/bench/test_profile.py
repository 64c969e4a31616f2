from __future__ import annotations

from hypic_rag.eval.bench.profile import run
from hypic_rag.testing.synthetic import TINY


def test_profile_splits_the_ttft_into_parts_that_add_up():
    report = run(segments=3, segment_tokens=24, query_tokens=5, layers=4, repeats=1, shapes=TINY, log=lambda _: None)
    parts = report["parts_s"]
    assert abs(sum(parts.values()) - report["ttft_s"]) < 1e-9
    assert report["stats"]["hit_segments"] == 3 and report["forwards"] >= 1
    assert sum(report["tokens_per_forward"]) == report["stats"]["recomputed_tokens"]
    assert set(report["decode_tokens_per_s"]) == {"full", "hypic"}
