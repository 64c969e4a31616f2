from __future__ import annotations

import pytest

from hypic_rag.eval.bench.turns import run


def test_the_turns_bench_reports_each_turn_of_each_workload_on_the_bundled_model():
    report = run(turns=6, steps=4, tokens=4, models=["bundled"], log=lambda _: None)
    bundled = report["models"]["bundled"]
    seam = bundled["seam"]
    conversation = bundled["conversation"]
    assert len(conversation["turns"]) == 6 and len(bundled["tool_loop"]["steps"]) == 4
    for row in conversation["turns"][2:] + bundled["tool_loop"]["steps"][2:]:
        # full runs the whole prompt, prefix what is new since the last turn's prompt and answer, hypic that and
        # the seams of the turn's new segments
        assert row["full"]["recomputed_tokens"] == row["prompt_tokens"]
        assert row["new_tokens"] <= row["prefix"]["recomputed_tokens"] <= row["new_tokens"] + seam
        assert row["hypic"]["recomputed_tokens"] <= row["new_tokens"] + 3 * seam
        assert row["hypic"]["prefix_tokens"] > 0 and row["prefix"]["same_answer"]
    summary = conversation["summary"]["hypic"]
    assert summary["in_seams"] <= 3 and 0 <= summary["answers_differ"] <= 6
    inserted = bundled["insertion"]
    assert inserted["new_tokens"] < inserted["prompt_tokens"] and inserted["prefix"]["prefix_tokens"] > 0


def test_the_turns_bench_refuses_runs_too_short_to_summarise():
    with pytest.raises(ValueError, match="turns >= 3"):
        run(turns=2, models=["bundled"])
