"""How sure an eval's differences are: a gap of a point at n=200 can be one answer, and a mean KL a few heavy
requests, so each difference comes with a bootstrap interval over the examples. Both sides of a difference
answered the same examples, so the resampling is paired (``scipy.stats.bootstrap``, percentile method: the
interval of a difference that is 0 on every example is exactly 0, where BCa is undefined)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

CONFIDENCE = 0.95
RESAMPLES = 4000


def paired_interval(
    first: Sequence[float], second: Sequence[float], confidence: float = CONFIDENCE, seed: int = 0
) -> tuple[float, float, float]:
    """The mean of ``first - second`` over paired examples and its bootstrap interval (low, high)."""
    import numpy as np
    from scipy.stats import bootstrap

    if len(first) != len(second) or not first:
        raise ValueError(
            f"a paired interval needs two equally long, non-empty lists, got {len(first)} and {len(second)}"
        )
    a, b = np.asarray(first, dtype=float), np.asarray(second, dtype=float)
    mean = float((a - b).mean())
    if len(a) < 2 or np.all(a - b == mean):
        return mean, mean, mean
    res = bootstrap(
        (a, b),
        lambda x, y, axis: (x - y).mean(axis=axis),
        paired=True,
        confidence_level=confidence,
        n_resamples=RESAMPLES,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    return mean, float(res.confidence_interval.low), float(res.confidence_interval.high)


def compare(report: dict[str, Any], first: str, second: str) -> dict[str, Any]:
    """``first`` against ``second`` (mode labels of one ``hypic-rag eval`` JSON): per workload and pooled over
    them, the difference of their gaps to ``full`` (points; > 0: ``first`` lost more) and of their KL, each
    with its paired interval. Pooled, the examples of every workload resample together (with equal ``n`` per
    workload their mean is the mean over workloads)."""
    reports = report.get("workloads", [report])
    rows: dict[str, Any] = {}
    pooled: dict[str, tuple[list[float], list[float]]] = {"gap": ([], []), "kl": ([], [])}
    for r in reports:
        examples = r.get("per_example")
        if not examples:
            raise ValueError(f"{r['workload']!r} has no per-example results: rerun it with this version's eval")
        for label in (first, second):
            if label not in examples or "kl" not in examples[label]:
                have = sorted(m for m in examples if m != "full")
                raise ValueError(f"no mode {label!r} with a KL in {r['workload']!r}; it has {have}")
        row: dict[str, Any] = {}
        # a gap is full's score minus the mode's, so first's gap minus second's is second's score minus first's
        for key, a, b in (
            ("gap", examples[second]["score"], examples[first]["score"]),
            ("kl", examples[first]["kl"], examples[second]["kl"]),
        ):
            row[key] = paired_interval(a, b)
            pooled[key][0].extend(a)
            pooled[key][1].extend(b)
        rows[r["workload"]] = row
    if len(reports) > 1:
        rows["pooled"] = {key: paired_interval(a, b) for key, (a, b) in pooled.items()}
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
