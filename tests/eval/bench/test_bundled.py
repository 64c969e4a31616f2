"""``bench --bundled``: the bundled model's own prompts, warm and reordered, every mode on the same ids."""

from __future__ import annotations

import pytest

from hypic_rag.eval.bench.bundled import run


def test_every_document_hits_and_hypic_recomputes_only_seams_and_the_question():
    report = run(prompts=2, rounds=1, log=lambda _: None)
    rows = {r["size"]: r for r in report["results"]}
    assert set(rows) == {"fact", "profile"}
    for row in rows.values():
        hits, cached = row["hit_segments"]["hypic"]
        assert cached == 6 and hits == 6  # every document cached by the warm request in another order
        assert row["hit_segments"]["prefix"][0] < 6  # the order moved, so exact prefixes stop early
        assert row["recomputed_tokens"]["full"] == row["prompt_tokens"]
        assert row["recomputed_tokens"]["hypic"] < row["prompt_tokens"]
        assert set(row["speedup"]) == {"prefix", "hypic"} and all(t > 0 for t in row["ttft_s"].values())
    # a profile is four facts of one person in one document: longer segments, more of them reused
    assert min(rows["profile"]["segment_tokens"][:6]) > max(rows["fact"]["segment_tokens"][:6])


def test_bad_arguments():
    with pytest.raises(ValueError, match="include full"):
        run(modes=("hypic",), log=lambda _: None)
    with pytest.raises(ValueError, match="modes come from full, prefix, pic, hypic"):
        run(modes=("full", "transformers"), log=lambda _: None)
    with pytest.raises(ValueError, match=">= 1"):
        run(rounds=0, log=lambda _: None)


def test_the_modes_asked_for_are_the_modes_run(monkeypatch):
    report = run(sizes=("fact",), prompts=1, rounds=1, modes=("full", "hypic"), log=lambda _: None)
    assert set(report["results"][0]["ttft_s"]) == {"full", "hypic"}
