from __future__ import annotations

from hypic_rag.eval.bench.runtime import run
from hypic_rag.testing.synthetic import TINY


def test_bench_reports_both_implementations_and_their_ratio():
    report = run(lengths=(48, 96), layers=2, repeats=1, shapes=TINY, log=lambda _: None)
    rows = {(r["impl"], r["prompt_tokens"]) for r in report["results"]}
    assert rows == {(i, n) for i in ("transformers", "hypic-rag") for n in (48, 96)}
    assert set(report["speedup_vs_transformers"]) == {"48", "96"}
    assert all(v > 0 for v in report["speedup_vs_transformers"].values())
    assert report["config"]["layer_types"] == ["linear_attention", "full_attention"]
    assert max(r.get("max_abs_logit_diff", 0.0) for r in report["results"]) < 1e-4
