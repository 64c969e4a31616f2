"""The request plan: the one home of the seam rule (docs/design.md §4)."""

from __future__ import annotations

import pytest

from hypic_rag.plan import Prompt, plan_request, resolve_seam, with_run


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
    from hypic_rag.options import check_seam
    from hypic_rag.plan import with_widths

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


def test_a_boundary_needs_the_seam_that_covers_its_unsettled_tokens():
    from hypic_rag.plan import error_left, settled_width

    assert settled_width([0.5, 0.2, 0.01, 0.1, 0.01, 0.0], 40) == 5  # through token 3, and one more
    assert settled_width([0.01, 0.0], 40) == 0 and settled_width([0.5, 0.5, 0.5], 2) == 2
    profile = [0.5, 0.2, 0.01]
    assert error_left(profile, 1, 40) == 0.2 and error_left(profile, 8, 40) == 0.01  # past the probe: its last
    assert error_left(profile, 40, 40) == 0.0 and error_left([], 3, 40) == 1.0


def test_seams_settle_every_boundary_then_recompute_whole_segments_with_what_is_left():
    from hypic_rag.plan import allocate_seams

    profiles = [[0.4, 0.2, 0.1, 0.01], [0.4, 0.01, 0.01, 0.01], [0.4, 0.3, 0.2, 0.2]]
    lengths = [40, 20, 40]
    assert allocate_seams(profiles, lengths, budget=11) == [4, 2, 5]  # settled: 11 tokens
    # 18 more tokens recompute the 20-token segment whole; the 40-token ones cost more than is left
    assert allocate_seams(profiles, lengths, budget=29) == [4, 20, 5]
    # with enough, the segment whose cached tokens deviate most goes first
    assert allocate_seams(profiles, lengths, budget=46) == [4, 2, 40]
    assert allocate_seams(profiles, lengths, budget=float("inf")) == lengths  # unlimited: every segment whole
    assert sum(allocate_seams(profiles, lengths, budget=3)) <= 3  # settling cut evenly to fit
    assert allocate_seams(profiles, lengths, budget=0) == [0, 0, 0]
    with pytest.raises(ValueError, match="budget"):
        allocate_seams(profiles, lengths, budget=-1)
    with pytest.raises(ValueError, match="profile"):
        allocate_seams(profiles[:1], lengths, budget=8)


def test_auto_spends_where_the_answer_reads():
    """With read shares: a boundary barely read (in all and per token) gets no seam, whole segments go most
    read first, and what no whole segment fits widens the most read seams."""
    from hypic_rag.plan import READ_FLOOR, SEAM_STEP, allocate_seams, choose_widths, estimate

    profiles = [[0.4, 0.2, 0.1, 0.01], [0.4, 0.01, 0.01, 0.01], [0.4, 0.3, 0.2, 0.2]]
    lengths, reads = [40, 20, 40], [0.05, 0.3, 0.5]
    assert 0.05 < READ_FLOOR * 0.85 / 3 and 0.05 / 40 < READ_FLOOR * 0.85 / 100  # the first: in all and per token
    # settled widths but the unread one's (0 + 2 + 5)
    assert allocate_seams(profiles, lengths, budget=7, reads=reads) == [0, 2, 5]
    # the most read segment whole when it fits; where only the less read one fits, that one, and what is left
    # widens the other seam
    assert allocate_seams(profiles, lengths, budget=42, reads=reads) == [0, 2, 40]
    assert allocate_seams(profiles, lengths, budget=60, reads=reads) == [0, 20, 40]
    assert allocate_seams(profiles, lengths, budget=30, reads=reads) == [0, 20, 5 + 5]
    # no whole segment fits: the seams widen, the most read first, while the budget lasts
    assert allocate_seams(profiles, lengths, budget=16, reads=reads) == [0, 2 + 1, 5 + SEAM_STEP]
    # a short segment, read less in all but as much per token as a long one, keeps its seam
    assert allocate_seams(profiles[:1] * 2, [12, 40], budget=8, reads=[0.05, 0.45]) == [4, 4]
    assert allocate_seams(profiles, lengths, budget=float("inf"), reads=reads) == lengths
    with pytest.raises(ValueError, match="read"):
        allocate_seams(profiles, lengths, budget=8, reads=reads[:2])
    # choose_widths passes them on for auto
    auto, _, _ = choose_widths(profiles, lengths, [0, 0, 0], auto=True, seam_budget=14, reads=reads)
    assert auto == [0, 2, 40]
    # and the guard's estimate weights the boundaries by them: a seam auto dropped where the answer barely
    # reads does not make the guard widen what auto chose
    same = [profiles[0]] * 3
    kept, est, action = choose_widths(same, lengths, [0, 0, 0], auto=True, reads=reads, fidelity_budget=0.1)
    assert action == "none" and kept == [0, 20, 4]
    assert est == pytest.approx((0.05 * 0.4 + 0.3 * 0.0 + 0.5 * 0.01) / 0.85)
    unweighted = estimate(same, kept, lengths)
    assert unweighted == pytest.approx((0.4 + 0.0 + 0.01) / 3) and unweighted > 0.1


def test_the_guard_keeps_widens_or_computes_exactly():
    from hypic_rag.plan import choose_widths, estimate

    profiles, lengths = [[0.4, 0.2, 0.1, 0.05], [0.4, 0.3, 0.2, 0.1]], [40, 40]
    kept, est, action = choose_widths(profiles, lengths, [2, 2], auto=False, fidelity_budget=1.0)
    assert (kept, action) == ([2, 2], "none") and est == pytest.approx(estimate(profiles, [2, 2], lengths))
    assert est == pytest.approx((0.1 + 0.2) / 2)
    wider, est, action = choose_widths(profiles, lengths, [2, 2], auto=False, fidelity_budget=0.06)
    assert action == "widened" and est <= 0.06 and sum(wider) > 4
    _, est, action = choose_widths(profiles, lengths, [2, 2], auto=False, fidelity_budget=0.0)
    assert action == "exact" and est > 0  # a whole recompute of both is past the widening allowance
    auto, _, action = choose_widths(profiles, lengths, [0, 0], auto=True, seam_budget=4)
    assert sum(auto) <= 8 and action == "none"
    # no boundary to probe (one segment, or none cached): nothing to allocate, whatever the budget
    assert choose_widths([], [], [], auto=True, seam_budget=float("inf"))[0] == []


def test_blend_takes_the_most_deviating_tokens_each_with_the_seam_that_reaches_it():
    from hypic_rag.options import check_seam
    from hypic_rag.plan import blend_widths, choose_widths

    check_seam("blend")
    with pytest.raises(ValueError, match="blend"):
        resolve_seam("blend", 10)
    assert [s.seam for s in _plan([40, 52, 30], seam="blend").segments] == [0, 0, 0]
    profiles = [[0.5, 0.1, 0.1, 0.9, 0.0], [0.6, 0.7, 0.0, 0.0, 0.0]]
    lengths = [5, 5]
    # 0.9 needs a 4-token seam (its segment's state is not stored before it); 0.7 and 0.6 then fit in 6
    assert blend_widths(profiles, lengths, budget=6) == [4, 2]
    # with 3, 0.9 would overrun: it is passed over for 0.7 (2 tokens) and 0.5 (1 more)
    assert blend_widths(profiles, lengths, budget=3) == [1, 2]
    assert blend_widths(profiles, lengths, budget=float("inf")) == lengths
    assert blend_widths(profiles, lengths, budget=0) == [0, 0]
    with pytest.raises(ValueError, match="budget"):
        blend_widths(profiles, lengths, budget=-1)
    widths, _, action = choose_widths(profiles, lengths, [0, 0], auto=False, blend=True, seam_budget=3)
    assert widths == [4, 2] and action == "none"  # 3 per boundary: 6 tokens in all


def test_a_budget_that_covers_every_segment_needs_no_probe():
    """The budget of an adaptive seam over its boundaries, and whether it already recomputes every segment
    (then the engine skips the reading probe: no share could change the widths)."""
    from hypic_rag.plan import AUTO_MEAN_SEAM, allocate_seams, boundary_budget, recomputes_every_segment

    assert boundary_budget(None, 3) == 3 * AUTO_MEAN_SEAM and boundary_budget(2.5, 4) == 10.0
    assert boundary_budget(float("inf"), 0) == 0.0  # no boundary: nothing to spend, not nan
    assert recomputes_every_segment(None, [AUTO_MEAN_SEAM] * 2) and not recomputes_every_segment(None, [9, 8])
    assert recomputes_every_segment(float("inf"), [1000]) and not recomputes_every_segment(float("inf"), [])
    lengths = [9, 7]
    covered = recomputes_every_segment(8, lengths)
    assert covered and allocate_seams([[0.0]] * 2, lengths, boundary_budget(8, 2), reads=[0.0, 0.0]) == lengths


def test_a_run_takes_the_place_of_the_segments_it_covers_with_one_seam():
    prompt = Prompt([[1] * 20, [2] * 15, [3] * 15, [4] * 10], [9, 9])
    plan = plan_request(prompt, seam=8, default_seam=8, variant="B", min_cached_tokens=12, key=str)
    runs, last, cut = with_run(plan, 1, 27, "run:x", opens=False)
    assert (last, cut) == (2, True)  # it ends three tokens before the third segment's end
    assert [len(s.ids) for s in runs.segments] == [20, 27, 3, 10]
    run, rest = runs.segments[1], runs.segments[2]
    assert (run.key, run.seam, run.remainder, run.record_remainder) == ("run:x", 8, 8, 0)
    assert rest.in_context and rest.ids == (3, 3, 3)
    whole, last, cut = with_run(plan, 0, 35, "run:y", opens=True)
    assert (last, cut) == (1, False) and whole.segments[0].seam == 0 and len(whole.segments) == 3
