"""The request plan: the one home of the seam rule (docs/design.md §4)."""

from __future__ import annotations

import pytest

from hypic_rag.plan import Prompt, plan_request, resolve_seam


def _plan(lengths, seam, variant="B", min_cached_tokens=1, default_seam=8):
    prompt = Prompt([list(range(n)) for n in lengths], [1, 2])
    return plan_request(
        prompt,
        seam=seam,
        default_seam=default_seam,
        variant=variant,
        min_cached_tokens=min_cached_tokens,
        key=lambda ids: f"k{len(ids)}",
    )


def test_a_seam_is_tokens_or_a_rounded_up_fraction_capped_at_the_segment():
    assert resolve_seam(8, 100) == 8 and resolve_seam(8, 5) == 5
    assert resolve_seam(0.1, 95) == 10 and resolve_seam(1.0, 7) == 7 and resolve_seam(0.0, 7) == 0
    for bad in (-1, 1.5, "8", True):
        with pytest.raises(ValueError, match="seam"):
            resolve_seam(bad, 10)


def test_the_first_segment_has_no_seam_and_the_others_use_their_remainder():
    plan = _plan([40, 52, 6], seam=8)
    assert [s.seam for s in plan.segments] == [0, 8, 6]
    # Variant B composes the remainder after the seam; a seam covering the segment leaves none.
    assert [s.remainder for s in plan.segments] == [0, 8, 0]
    # A cold prefill records the remainder it will need, the first segment the default seam's.
    assert [s.record_remainder for s in plan.segments] == [8, 8, 0]
    assert [s.in_context for s in plan.segments] == [False, False, True]


def test_pic_has_no_seam_and_records_the_default_one():
    plan = _plan([40, 52], seam=0, default_seam=4)
    assert [(s.seam, s.remainder, s.record_remainder) for s in plan.segments] == [(0, 0, 4), (0, 0, 4)]


def test_variant_a_uses_no_remainder():
    plan = _plan([40, 52], seam=0.25, variant="A")
    assert [(s.seam, s.remainder, s.record_remainder) for s in plan.segments] == [(0, 0, 0), (13, 0, 0)]


def test_short_segments_are_not_cached():
    plan = _plan([40, 10, 36], seam=8, min_cached_tokens=20)
    assert [s.key for s in plan.segments] == ["k40", None, "k36"]
    assert plan.segments[1].in_context


def test_unknown_variant():
    with pytest.raises(ValueError, match="unknown seam variant 'C'"):
        _plan([4], seam=1, variant="C")
