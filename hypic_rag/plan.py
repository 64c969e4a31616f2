"""A request's plan: for each segment of the prompt, whether it is cached, under which key, how many
of its leading tokens the seam recomputes, and which remainder it composes (docs/design.md §4).

This is the one home of the seam rule:

- a seam is ``seam`` tokens, or a fraction of each segment rounded up, capped at the segment; ``"auto"``
  gives each boundary its own width, chosen from a deviation signal under a token budget
  (``allocate_seams``, then ``with_widths``);
- the first segment of the prompt has no seam (nothing precedes it); ``pic`` mode has none at all;
- under seam variant B a segment whose seam leaves part of it cached composes the operator of that
  remainder (its tokens after the seam: ``cache.entry.RemainderEntry``); a cold segment records the
  remainder for the request's seam (or, where this request needs none, the engine's default seam) so
  that later requests find it;
- segments shorter than ``min_cached_tokens``, or marked not to be cached, run in context.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

VARIANTS = ("A", "B")
AUTO = "auto"
# The widths ``auto`` picks from (and a whole segment): each one a remainder entry a segment may be stored with,
# so a few fixed widths keep the entries shared across requests.
AUTO_WIDTHS = (0, 4, 8, 16, 32)
AUTO_MEAN_SEAM = 8  # ``auto``'s default budget: on average the tokens of this fixed seam per boundary

Seam = int | float | str


def check_seam(seam: object) -> None:
    """A token count, a fraction in [0, 1] or ``"auto"``; anything else is a ``ValueError``."""
    if seam != AUTO:
        resolve_seam(seam, 1)  # type: ignore[arg-type]


def resolve_seam(seam: int | float, length: int) -> int:
    """A token count, or a fraction of the segment (rounded up), capped at its length."""
    if seam == AUTO:
        raise ValueError('an "auto" seam has no width of its own: each boundary gets one (plan.allocate_seams)')
    if isinstance(seam, bool) or not isinstance(seam, (int, float)) or not math.isfinite(seam) or seam < 0:
        raise ValueError(f'seam must be a token count, a fraction in [0, 1] or "auto", got {seam!r}')
    if isinstance(seam, float):
        if seam > 1:
            raise ValueError(f"a fractional seam must be in [0, 1], got {seam}")
        return min(length, math.ceil(seam * length))
    return min(length, seam)


@dataclass(frozen=True)
class Prompt:
    """A prompt's token ids, segment by segment; the query comes last."""

    segments: list[list[int]]
    query: list[int]
    cacheable: tuple[bool, ...] | None = None  # per segment; None: all may be cached

    @property
    def ids(self) -> list[int]:
        return [i for seg in self.segments for i in seg] + self.query


@dataclass(frozen=True)
class SegmentPlan:
    ids: tuple[int, ...]
    key: str | None  # the cache key; None: too short to cache, it runs in context
    seam: int  # leading tokens recomputed in context before the cached tokens take over
    remainder: int  # the seam width of the remainder this request composes (variant B, 0 < seam < len), else 0
    record_remainder: int  # the seam width of the remainder a cold prefill records for it, 0 for none

    @property
    def in_context(self) -> bool:
        """Runs through the model in context whatever the cache holds."""
        return self.key is None or self.seam >= len(self.ids)


@dataclass(frozen=True)
class RequestPlan:
    segments: list[SegmentPlan]
    query: tuple[int, ...]
    seam: Seam
    variant: str

    @property
    def boundaries(self) -> list[int]:
        """The segments a seam may repair: cached ones after the prompt's first."""
        return [i for i, seg in enumerate(self.segments) if i and seg.key is not None]


def plan_request(
    prompt: Prompt,
    *,
    seam: Seam,
    default_seam: Seam,
    variant: str,
    min_cached_tokens: int,
    key: Callable[[Sequence[int]], str],
) -> RequestPlan:
    """The plan of a composed (``pic`` or ``hypic``) request; ``seam`` 0 is ``pic``. Under ``"auto"`` every
    seam is 0 until ``with_widths`` sets the widths ``allocate_seams`` chose."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown seam variant {variant!r}; expected one of {', '.join(VARIANTS)}")
    record_seam = seam if seam and seam != AUTO else default_seam
    if record_seam == AUTO:
        record_seam = AUTO_MEAN_SEAM
    plans = []
    for i, ids in enumerate(prompt.segments):
        n = len(ids)
        width = resolve_seam(seam, n) if i and seam != AUTO else 0
        remainder = width if variant == "B" and 0 < width < n else 0
        record = resolve_seam(record_seam, n) if variant == "B" else 0
        cached = n >= max(1, min_cached_tokens) and (prompt.cacheable is None or prompt.cacheable[i])
        plans.append(
            SegmentPlan(
                ids=tuple(ids),
                key=key(ids) if cached else None,
                seam=width,
                remainder=remainder,
                record_remainder=remainder or (record if 0 < record < n else 0),
            )
        )
    return RequestPlan(plans, tuple(prompt.query), seam, variant)


def with_widths(plan: RequestPlan, widths: dict[int, int]) -> RequestPlan:
    """``plan`` with segment ``i``'s seam set to ``widths[i]`` (capped at the segment), its remainder with it."""
    segments = list(plan.segments)
    for i, w in widths.items():
        seg = segments[i]
        n = len(seg.ids)
        w = min(max(0, w), n)
        remainder = w if plan.variant == "B" and 0 < w < n else 0
        segments[i] = replace(seg, seam=w, remainder=remainder, record_remainder=remainder or seg.record_remainder)
    return replace(plan, segments=segments)


def error_left(width: int, length: int) -> float:
    """The share of a boundary's deviation a seam of ``width`` leaves: none for a whole segment, else
    ``1 / (1 + width / AUTO_MEAN_SEAM)`` (a seam of 8 halves it)."""
    return 0.0 if width >= length else 1.0 / (1.0 + width / AUTO_MEAN_SEAM)


def estimate(deviation: Sequence[float], widths: Sequence[int], lengths: Sequence[int]) -> float:
    """A request's fidelity estimate: each boundary's deviation times the share its seam leaves, averaged over
    the boundaries (0 for none)."""
    left = [d * error_left(w, n) for d, w, n in zip(deviation, widths, lengths, strict=True)]
    return float(sum(left) / len(left)) if left else 0.0


def allocate_seams(
    deviation: Sequence[float],
    lengths: Sequence[int],
    budget: float,
    widths: Sequence[int] = AUTO_WIDTHS,
    start: Sequence[int] | None = None,
    target: float | None = None,
) -> list[int]:
    """Each boundary's seam width, from ``widths`` or its whole segment, so that the total is at most
    ``budget`` tokens and the estimate (``estimate``) is small: greedily, the step that removes the most
    deviation per token first, from ``start`` (default no seams). With ``target``, it stops as soon as the
    estimate is at most that. A boundary with no deviation gets no seam; a budget past every segment's length
    recomputes them all (``hypic`` then equals ``full``)."""
    if len(deviation) != len(lengths):
        raise ValueError("one deviation per boundary")
    if not budget >= 0:
        raise ValueError(f"a seam budget is a token count >= 0, got {budget!r}")
    if budget >= sum(lengths) and target is None:
        return list(lengths)
    first = [min(w, n) for w, n in zip(start or [0] * len(lengths), lengths, strict=True)]
    steps = [sorted({min(w, n) for w in widths} | {n, f}) for n, f in zip(lengths, first, strict=True)]
    at = [st.index(f) for st, f in zip(steps, first, strict=True)]
    spent = float(sum(steps[i][k] for i, k in enumerate(at)))
    while target is None or estimate(deviation, [steps[i][k] for i, k in enumerate(at)], lengths) > target:
        best, best_gain = -1, 0.0
        for i, (d, n) in enumerate(zip(deviation, lengths, strict=True)):
            if at[i] + 1 >= len(steps[i]):
                continue
            w, nxt = steps[i][at[i]], steps[i][at[i] + 1]
            if spent + nxt - w > budget:
                continue
            gain = d * (error_left(w, n) - error_left(nxt, n)) / (nxt - w)
            if gain > best_gain:
                best, best_gain = i, gain
        if best < 0:
            break
        spent += steps[best][at[best] + 1] - steps[best][at[best]]
        at[best] += 1
    return [steps[i][k] for i, k in enumerate(at)]


WIDEN_FACTOR = 4  # the guard widens seams up to this many times the tokens they had (or a seam of 8 each)
ACTIONS = ("none", "widened", "exact")


def choose_widths(
    deviation: Sequence[float],
    lengths: Sequence[int],
    current: Sequence[int],
    *,
    auto: bool,
    seam_budget: float | None = None,
    fidelity_budget: float | None = None,
) -> tuple[list[int], float, str]:
    """The boundaries' widths, the request's estimate with them, and what the guard did (``ACTIONS``).

    ``auto`` allocates ``seam_budget`` tokens per boundary on average (default ``AUTO_MEAN_SEAM``) by
    ``allocate_seams``; otherwise the ``current`` widths stay. Where the estimate is above
    ``fidelity_budget``, the seams widen (up to ``WIDEN_FACTOR`` times the tokens) until it is not; if no
    widening within that reaches it, the action is ``"exact"``: compute the request as ``full`` does."""
    n = len(lengths)
    mean = AUTO_MEAN_SEAM if seam_budget is None else seam_budget
    if auto:
        widths = allocate_seams(deviation, lengths, mean * n)
    else:
        widths = [min(w, m) for w, m in zip(current, lengths, strict=True)]
    est = estimate(deviation, widths, lengths)
    if fidelity_budget is None or est <= fidelity_budget:
        return widths, est, "none"
    cap = WIDEN_FACTOR * max(sum(widths), AUTO_MEAN_SEAM * n)
    wider = allocate_seams(deviation, lengths, cap, start=widths, target=fidelity_budget)
    wider_est = estimate(deviation, wider, lengths)
    if wider_est <= fidelity_budget:
        return wider, wider_est, "widened"
    return widths, est, "exact"
