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


def test_auto_is_a_seam_and_plans_no_width_until_one_is_chosen():
    from hypic_rag.plan import check_seam, with_widths

    check_seam("auto")
    for bad in ("Auto", "8", -1):
        with pytest.raises(ValueError, match="seam"):
            check_seam(bad)
    with pytest.raises(ValueError, match="auto"):
        resolve_seam("auto", 10)
    plan = _plan([40, 52, 30], seam="auto")
    assert [s.seam for s in plan.segments] == [0, 0, 0] and plan.boundaries == [1, 2]
    assert [s.record_remainder for s in plan.segments] == [8, 8, 8]  # what a cold prefill records: seam 8's
    wide = with_widths(plan, {1: 16, 2: 30})
    assert [(s.seam, s.remainder) for s in wide.segments] == [(0, 0), (16, 16), (30, 0)]
    assert wide.seam == "auto"


def test_seams_are_allocated_under_the_budget_to_the_boundaries_that_deviate():
    from hypic_rag.plan import allocate_seams

    lengths = [40, 40, 40, 40]
    widths = allocate_seams([0.1, 0.1, 2.0, 0.0], lengths, budget=32)
    assert sum(widths) <= 32 and widths[3] == 0 and widths[2] == max(widths)
    assert all(w in (0, 4, 8, 16, 32, 40) for w in widths)
    assert allocate_seams([0.1, 0.1, 0.1, 0.1], lengths, budget=32) == [8, 8, 8, 8]
    assert allocate_seams([0.0] * 4, lengths, budget=float("inf")) == lengths  # unlimited: every segment whole
    assert allocate_seams([1.0] * 4, lengths, budget=0) == [0, 0, 0, 0]
    with pytest.raises(ValueError, match="budget"):
        allocate_seams([1.0], [40], budget=-1)


def test_the_guard_keeps_widens_or_computes_exactly():
    from hypic_rag.plan import choose_widths, estimate

    dev, lengths = [0.2, 0.3], [40, 40]
    kept, est, action = choose_widths(dev, lengths, [8, 8], auto=False, fidelity_budget=1.0)
    assert (kept, action) == ([8, 8], "none") and est == pytest.approx(estimate(dev, [8, 8], lengths))
    wider, est, action = choose_widths(dev, lengths, [8, 8], auto=False, fidelity_budget=0.1)
    assert action == "widened" and est <= 0.1 and sum(wider) > 16
    _, est, action = choose_widths(dev, lengths, [8, 8], auto=False, fidelity_budget=0.0)
    assert action == "exact" and est > 0  # a whole recompute of both is past the widening allowance
    auto, _, action = choose_widths(dev, lengths, [0, 0], auto=True, seam_budget=4)
    assert sum(auto) <= 8 and action == "none"
