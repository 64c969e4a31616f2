"""How sure an eval's differences are: a gap of a point at n=200 can be one answer, and a mean KL a few heavy
requests, so each difference comes with a bootstrap interval over the examples. Both sides of a difference
answered the same examples, so the resampling is paired; pooled over workloads it resamples within each
workload (stratified) and averages their means, as ``mean_gap_points`` does. Written here on numpy rather than
with ``scipy.stats.bootstrap``, which resamples one sample and cannot keep workloads apart; the percentile
interval keeps a difference that is the same on every example exact (BCa is undefined there)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 4000


def paired_interval(
    first: Sequence[float], second: Sequence[float], confidence: float = CONFIDENCE, seed: int = 0
) -> tuple[float, float, float]:
    """The mean of ``first - second`` over paired examples and its bootstrap interval (low, high)."""
    return stratified_interval([(first, second)], confidence, seed)


def stratified_interval(
    strata: Sequence[tuple[Sequence[float], Sequence[float]]], confidence: float = CONFIDENCE, seed: int = 0
) -> tuple[float, float, float]:
    """The mean over ``strata`` (pairs of paired lists, one per workload) of each one's mean difference, and
    its percentile bootstrap interval, every resample drawing each stratum's examples from that stratum."""
    diffs = []
    for a, b in strata:
        if len(a) != len(b) or len(a) < 2:
            raise ValueError(f"an interval needs paired lists of equal length, at least 2, got {len(a)} and {len(b)}")
        diffs.append(np.asarray(a, dtype=float) - np.asarray(b, dtype=float))
    if not diffs:
        raise ValueError("an interval needs at least one workload")
    mean = float(np.mean([d.mean() for d in diffs]))
    if all(np.all(d == d[0]) for d in diffs):
        return mean, mean, mean
    rng = np.random.default_rng(seed)
    means = np.zeros(RESAMPLES)
    for d in diffs:
        means += d[rng.integers(0, len(d), size=(RESAMPLES, len(d)))].mean(axis=1)
    low, high = np.quantile(means / len(diffs), [(1 - confidence) / 2, (1 + confidence) / 2])
    return mean, float(low), float(high)


def check_pair(pair: Sequence[str], labels: Sequence[str]) -> None:
    """Before a run: two different labels among the run's modes with a KL (not ``full``)."""
    if len(pair) != 2 or pair[0] == pair[1]:
        raise ValueError(f"--compare takes two different mode labels separated by a comma, got {list(pair)}")
    for label in pair:
        if label not in labels or label == "full":
            have = [m for m in labels if m != "full"]
            raise ValueError(f"--compare: no mode {label!r} with a KL in this run; it has {have}")


def compare(report: dict[str, Any], first: str, second: str) -> dict[str, Any]:
    """``first`` against ``second`` (mode labels of one ``hypic-rag eval`` JSON): per workload and pooled over
    them, the difference of their gaps to ``full`` (points; > 0: ``first`` lost more) and of their KL, each
    with its paired interval."""
    reports = report.get("workloads", [report])
    rows: dict[str, Any] = {}
    strata: dict[str, list[tuple[list[float], list[float]]]] = {"gap": [], "kl": []}
    for r in reports:
        examples = r.get("per_example")
        if not examples:
            raise ValueError(f"{r['workload']!r} has no per-example results: rerun it with this version's eval")
        for label in (first, second):
            if label not in examples or "kl" not in examples[label]:
                have = sorted(m for m in examples if m != "full")
                raise ValueError(f"no mode {label!r} with a KL in {r['workload']!r}; it has {have}")
        # a gap is full's score minus the mode's, so first's gap minus second's is second's score minus first's
        pairs = {
            "gap": (examples[second]["score"], examples[first]["score"]),
            "kl": (examples[first]["kl"], examples[second]["kl"]),
        }
        rows[r["workload"]] = {key: paired_interval(*pair) for key, pair in pairs.items()}
        for key, pair in pairs.items():
            strata[key].append(pair)
    if len(reports) > 1:
        rows["pooled"] = {key: stratified_interval(pairs) for key, pairs in strata.items()}
    return {"first": first, "second": second, "confidence": CONFIDENCE, "workloads": rows}


def format_comparison(comparison: dict[str, Any]) -> list[str]:
    """The comparison as lines for a terminal or a report."""
    first, second = comparison["first"], comparison["second"]
    percent = round(100 * comparison["confidence"])
    lines = [f"{first} against {second} (difference, {percent}% paired bootstrap interval):"]
    for workload, row in comparison["workloads"].items():
        gap, kl = row["gap"], row["kl"]
        lines.append(
            f"  {workload:<10} gap {gap[0]:+.2f} [{gap[1]:+.2f}, {gap[2]:+.2f}] points"
            f"   KL {kl[0]:+.2e} [{kl[1]:+.2e}, {kl[2]:+.2e}]"
        )
    return lines
