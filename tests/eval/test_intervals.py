"""Paired bootstrap intervals of eval's differences, and the comparison of two modes from an eval JSON."""

from __future__ import annotations

import random

import pytest

from hypic_rag.eval.intervals import check_pair, compare, format_comparison, paired_interval


def test_an_equal_difference_on_every_example_has_no_spread():
    assert paired_interval([3.0, 1.0, 2.0], [3.0, 1.0, 2.0]) == (0.0, 0.0, 0.0)
    assert paired_interval([100.0, 0.0, 100.0], [0.0, -100.0, 0.0]) == (100.0, 100.0, 100.0)


def test_pairing_removes_what_both_sides_share():
    """Examples vary a lot, the difference little: paired, the interval is the difference's, not the examples'."""
    rng = random.Random(0)
    base = [rng.uniform(0, 100) for _ in range(200)]
    other = [b + 1.0 + rng.gauss(0, 0.1) for b in base]
    mean, low, high = paired_interval(other, base)
    assert low < mean < high and 0.97 < low and high < 1.03


def test_a_few_flips_leave_zero_inside_and_many_do_not():
    first = [100.0] * 200
    few = [0.0, 0.0] + [100.0] * 198  # two answers lost: a gap of one point that resampling often loses
    assert paired_interval(first, few)[1] <= 0.0 < paired_interval(first, few)[2]
    many = [0.0] * 40 + [100.0] * 160
    assert paired_interval(first, many)[1] > 0.0


def test_the_interval_is_reproducible_and_checks_its_input():
    rng = random.Random(1)
    a, b = [rng.random() for _ in range(50)], [rng.random() for _ in range(50)]
    assert paired_interval(a, b) == paired_interval(a, b)
    for bad in (([1.0], [1.0, 2.0]), ([], []), ([1.0], [2.0])):
        with pytest.raises(ValueError, match="paired lists of equal length, at least 2"):
            paired_interval(*bad)


def _report(workload, full, first, second, kl_first, kl_second):
    return {
        "workload": workload,
        "per_example": {
            "full": {"score": full},
            "a": {"score": first, "kl": kl_first},
            "b": {"score": second, "kl": kl_second},
        },
    }


def test_compare_signs_and_pools():
    """A positive gap difference: the first mode lost more points to full than the second; pooled, the mean
    of the workloads' means (as mean_gap_points), whatever their n."""
    one = _report("one", [100.0] * 4, [0.0, 100.0, 100.0, 100.0], [100.0] * 4, [0.2] * 4, [0.1] * 4)
    two = _report("two", [100.0] * 2, [100.0] * 2, [100.0] * 2, [0.1] * 2, [0.1] * 2)
    out = compare({"workloads": [one, two]}, "a", "b")
    rows = out["workloads"]
    assert rows["one"]["gap"][0] == 25.0 and rows["one"]["kl"] == pytest.approx((0.1, 0.1, 0.1))
    assert rows["two"]["gap"] == (0.0, 0.0, 0.0)
    assert rows["pooled"]["gap"][0] == 12.5 and rows["pooled"]["kl"] == pytest.approx((0.05, 0.05, 0.05))
    # resampled within each workload: the pooled gap can only be a quarter of one's draws' means over two
    assert {rows["pooled"]["gap"][1], rows["pooled"]["gap"][2]} <= {0.0, 12.5, 25.0, 37.5, 50.0}
    lines = format_comparison(out)
    assert lines[0].startswith("a against b (difference, 95% paired") and "one" in lines[1]
    # one workload: no pooled row
    assert set(compare(one, "a", "b")["workloads"]) == {"one"}


def test_compare_names_what_is_missing():
    one = _report("one", [1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [0.0, 0.0], [0.0, 0.0])
    with pytest.raises(ValueError, match=r"no mode 'c' with a KL in 'one'; it has \['a', 'b'\]"):
        compare(one, "a", "c")
    with pytest.raises(ValueError, match="no per-example results"):
        compare({"workload": "old", "results": {}}, "a", "b")


def test_a_pair_is_checked_against_the_run_before_it():
    check_pair(["hypic@auto", "hypic"], ["full", "hypic", "hypic@auto"])
    for pair, message in (
        (["hypic"], "two different mode labels"),
        (["hypic", "hypic"], "two different mode labels"),
        (["hypic", "full"], r"no mode 'full' with a KL in this run; it has \['hypic'\]"),
        (["hypic", "hypic@w4"], "no mode 'hypic@w4'"),
    ):
        with pytest.raises(ValueError, match=message):
            check_pair(pair, ["full", "hypic"])
