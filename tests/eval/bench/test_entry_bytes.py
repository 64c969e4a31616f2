"""The bytes bench on Qwen3.5-0.8B's Gated DeltaNet shapes (16 heads, K = V = 128): entries of up to 64 tokens keep
their tokens and are at least 2x smaller than dense in every entry dtype; from 128 tokens on they are dense."""

from __future__ import annotations

from hypic_rag.eval.bench.entry_bytes import run


def test_short_entries_are_at_least_twice_smaller_than_dense_and_long_ones_dense():
    report = run(lengths=(16, 64, 128), layers=2, repeats=1, log=lambda _: None)  # one Gated DeltaNet, one attention
    rows = {row["tokens"]: row for row in report["rows"]}
    for n in (16, 64):
        assert rows[n]["form"] == "tokens" and rows[n]["remainder_share"] == 0
        for dtype in ("float32", "bfloat16", "float16"):
            assert rows[n][dtype]["dense_over_entry"] >= 2
    assert rows[128]["form"] == "dense" and rows[128]["float32"]["dense_over_entry"] == 1
    assert rows[16]["bfloat16"]["bytes"] * 2 - rows[16]["float32"]["bytes"] < rows[16]["float32"]["bytes"] / 50
