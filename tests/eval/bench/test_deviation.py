"""The deviation benchmark on a tiny random checkpoint: each signal's rank correlation with the KL, and the
seams' KL and tokens, computed from real requests."""

from __future__ import annotations

import math

from hypic_rag import Engine
from hypic_rag.deviation import SIGNALS
from hypic_rag.eval.bench.deviation import AGGREGATES, _prompts_random, measure


def test_every_signal_gets_a_rank_correlation_with_the_kl(checkpoint):
    engine = Engine.from_pretrained(checkpoint("qwen3_5_text"), min_cached_tokens=12)
    res = measure(engine, _prompts_random(320, 6, seed=3))
    assert res["requests"] == 6 and res["mean_kl"] > 0
    expected = {f"{s}@{a}" for s in SIGNALS for a in AGGREGATES} | {"read@max", "boundaries", "estimate"}
    assert set(res["spearman"]) == expected
    assert all(math.isnan(v) or -1 <= v <= 1 for v in res["spearman"].values())


def test_the_pareto_run_counts_each_seams_tokens_and_its_probe(monkeypatch):
    import hypic_rag.eval.bench.deviation as bench

    monkeypatch.setattr(bench, "FAMILY_KINDS", bench.FAMILY_KINDS[:1])
    monkeypatch.setattr(bench, "PARETO_SEAMS", (8, "auto", ("blend", 8.0)))
    (rows,) = bench.pareto(1, seed=7, log=lambda _: None)["models"].values()
    assert set(rows) == {"8", "auto", "blend:8"}
    assert rows["8"]["cost_tokens"] == rows["8"]["recomputed_tokens"]  # a fixed seam probes nothing
    # blend's probe runs every segment token through the first attention layer; auto's its seams (and the
    # query through every layer)
    assert (
        rows["blend:8"]["cost_tokens"] - rows["blend:8"]["recomputed_tokens"]
        > (rows["auto"]["cost_tokens"] - rows["auto"]["recomputed_tokens"])
        > 0
    )
