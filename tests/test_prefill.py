"""The composed modes read the exact prefix store first: the leading segments it holds are restored as ``prefix``
mode would restore them, and only the segments after them are composed, the first of those with its seam run in
the context of that exact state."""

from __future__ import annotations

import pytest
import torch

from hypic_rag import Engine, Segment
from hypic_rag.assembly import install_segment, run_in_context
from hypic_rag.testing.parity import rounding_bound

KINDS = ["qwen3_5_text", "nemotron_h"]  # a dense operator (Gated DeltaNet) and a scalar one (Mamba2)
SEAM = 8


def _segments(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [Segment(token_ids=torch.randint(3, 320, (n,), generator=gen).tolist()) for n in lengths]


QUERY = Segment(token_ids=[5, 6, 7, 8, 9, 10, 11], kind="query")


def _engine(checkpoint, kind: str, **options) -> Engine:
    return Engine.from_pretrained(checkpoint(kind), **{"min_cached_tokens": 0, "seam": SEAM, **options})


def _bound(engine: Engine, segs) -> float:
    ids = torch.tensor([[i for s in [*segs, QUERY] for i in s.token_ids]])
    return rounding_bound(engine.model, ids)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fused", [True, False])
def test_a_composed_request_restores_the_cached_prefix_and_composes_the_rest_onto_it(checkpoint, kind, fused):
    engine = _engine(checkpoint, kind, fuse_forwards=fused)
    segs = _segments([30, 41, 26, 35])
    engine.generate(segs[:2], QUERY, mode="prefix", max_new_tokens=1)  # the exact prefix: segs 0 and 1
    engine.generate(segs[:1:-1], QUERY, mode="hypic", max_new_tokens=1)  # entries for segs 2 and 3
    out = engine.generate(segs, QUERY, mode="hypic", max_new_tokens=1)
    stats = out.stats
    assert stats["prefix_segments"] == 2 and stats["hit_segments"] == 4 and stats["miss_segments"] == 0
    assert stats["recomputed_tokens"] == 2 * SEAM + len(QUERY.token_ids)  # the two seams after it and the query
    assert stats["cached_tokens"] == 30 + 41 + 26 + 35 - 2 * SEAM == stats["prompt_tokens"] - stats["recomputed_tokens"]
    # The same by hand: the two leading segments run exactly, each later one's seam in their context, its
    # cached rest composed onto the state after it.
    model, program = engine.model, engine.prefill_program
    state = model.new_state()
    with torch.inference_mode():
        run_in_context(model, state, [*segs[0].token_ids, *segs[1].token_ids])
        plan = program.plan(engine.build_prompt(segs, QUERY), "hypic")
        for seg, found in zip(plan.segments[2:], program.lookup(plan)[2:], strict=True):
            assert seg.seam == SEAM and found is not None
            install_segment(model, state, found, seg.seam, plan.variant)
        want = program.last_logits(QUERY.token_ids, state)
    assert float((out.prompt_logits - want).abs().max()) <= _bound(engine, segs)


@pytest.mark.parametrize("kind", KINDS)
def test_after_a_restored_prefix_a_seam_over_whole_segments_still_equals_full(checkpoint, kind):
    engine = _engine(checkpoint, kind)
    segs = _segments([30, 41, 26, 35], seed=1)
    engine.generate(segs[:2], QUERY, mode="prefix", max_new_tokens=1)
    full = engine.prompt_logits(segs, QUERY, mode="full")
    out = engine.generate(segs, QUERY, mode="hypic", seam=1.0, max_new_tokens=1)
    assert out.stats["prefix_segments"] == 2
    assert float((out.prompt_logits - full).abs().max()) <= _bound(engine, segs)


@pytest.mark.parametrize("mode", ["hypic", "pic"])
def test_a_prompt_the_prefix_store_holds_whole_runs_only_its_query_as_prefix_does(checkpoint, mode):
    engine = _engine(checkpoint, "nemotron_h")
    segs = _segments([30, 41, 26], seed=2)
    engine.generate(segs, QUERY, mode="prefix", max_new_tokens=1)
    want = engine.generate(segs, QUERY, mode="prefix", max_new_tokens=1)
    out = engine.generate(segs, QUERY, mode=mode, max_new_tokens=1)
    assert out.stats["prefix_segments"] == 3 and out.stats["recomputed_tokens"] == len(QUERY.token_ids)
    assert out.stats["cached_tokens"] == want.stats["cached_tokens"] == 30 + 41 + 26
    assert float((out.prompt_logits - want.prompt_logits).abs().max()) <= _bound(engine, segs)


def test_reordered_documents_still_hit_their_entries(checkpoint):
    """The prefix stops at the first segment that moved; every segment after it is composed as before."""
    engine = _engine(checkpoint, "qwen3_5_text")
    segs = _segments([30, 41, 26], seed=3)
    engine.generate(segs, QUERY, mode="prefix", max_new_tokens=1)
    cold = engine.generate(segs[::-1], QUERY, mode="hypic", max_new_tokens=1)  # no prefix: entries for all three
    assert cold.stats["prefix_segments"] == 0 and cold.stats["miss_segments"] == 3
    reordered = engine.generate(segs[::-1], QUERY, mode="hypic", max_new_tokens=1)
    assert reordered.stats["prefix_segments"] == 0 and reordered.stats["hit_segments"] == 3
    moved = engine.generate([segs[0], segs[2], segs[1]], QUERY, mode="hypic", max_new_tokens=1)
    assert moved.stats["prefix_segments"] == 1 and moved.stats["hit_segments"] == 3
    assert moved.stats["recomputed_tokens"] == 2 * SEAM + len(QUERY.token_ids)


def test_a_guarded_request_composes_from_the_start(checkpoint):
    """``auto`` seams and a fidelity budget probe the plan from the prompt's start: no prefix is restored."""
    engine = _engine(checkpoint, "nemotron_h")
    segs = _segments([30, 41, 26], seed=4)
    engine.generate(segs, QUERY, mode="prefix", max_new_tokens=1)
    out = engine.generate(segs, QUERY, mode="hypic", seam="auto", max_new_tokens=1)
    assert out.stats["prefix_segments"] == 0
