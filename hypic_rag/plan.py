"""A request's plan: for each segment of the prompt, whether it is cached, under which key, how many
of its leading tokens the seam recomputes, and which remainder it composes (docs/design.md §4).

This is the one home of the seam rule:

- a seam is ``seam`` tokens, or a fraction of each segment rounded up, capped at the segment; ``"auto"``
  gives each boundary its own width, from a probe of how far its first tokens are from their in-context
  selves and one of how much the answer reads each segment, under a token budget (``allocate_seams``, then
  ``with_widths``); ``"blend"``, the CacheBlend-style
  baseline, picks the tokens that deviate most anywhere in a segment under the same budget, each one's seam
  reaching it (``blend_widths``);
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

from .options import ADAPTIVE, check_seam  # what a seam value may be is the options' to say

VARIANTS = ("A", "B")
AUTO_MEAN_SEAM = 8  # ``auto``'s default budget: on average the tokens of this fixed seam per boundary

Seam = int | float | str


def resolve_seam(seam: int | float, length: int) -> int:
    """A token count, or a fraction of the segment (rounded up), capped at its length."""
    if seam in ADAPTIVE:
        raise ValueError(f"a {seam!r} seam has no width of its own: each boundary gets one (plan.choose_widths)")
    check_seam(seam)
    if isinstance(seam, float):
        return min(length, math.ceil(seam * length))
    return min(length, seam)


@dataclass(frozen=True)
class Prompt:
    """A prompt's token ids, segment by segment; the query comes last."""

    segments: list[list[int]]
    query: list[int]
    cacheable: tuple[bool, ...] | None = None  # per segment; None: all may be cached
    kinds: tuple[str, ...] | None = None  # per segment (document, tool, ...), for the cache's hit ratio by kind
    # Where a chat template's generation prompt begins among the ids (the last message's end), a state kept for the
    # next turn, whose template may render the answer's opening otherwise (a reasoning block dropped); None: unknown.
    header_at: int | None = None

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


def after(plan: RequestPlan, at: int) -> tuple[RequestPlan, int]:
    """What is left of ``plan`` once its first ``at`` tokens are restored from a kept state, and how many segments
    that covered whole: the segment ``at`` falls inside runs the rest of its tokens in context (its cached entry
    covers the whole of it), and the later ones keep their plans, the first of them its seam."""
    offset = 0
    for covered, seg in enumerate(plan.segments):
        if offset + len(seg.ids) > at:
            rest = list(plan.segments[covered:])
            if at > offset:
                rest[0] = SegmentPlan(seg.ids[at - offset :], None, 0, 0, 0)
            return replace(plan, segments=rest), covered
        offset += len(seg.ids)
    return replace(plan, segments=[], query=plan.query[at - offset :]), len(plan.segments)


# A cached segment its seam leaves less than this many seams' worth of is run whole after a restored state.
SHORT_SEAMS = 4


def short_in_context(plan: RequestPlan, held: Sequence[bool]) -> RequestPlan:
    """``plan`` with each cached segment (``held``) that is shorter than ``SHORT_SEAMS`` of its seams run whole in
    context. After a restored state (a conversation's new turn) what is added runs exactly; composing a short
    message that recurs would save a few tokens for a jump over it, which on a small model costs more than they
    do, and for an approximation the exact run does not make. A long one (a document added to the history)
    still composes."""
    segments = [
        replace(seg, seam=len(seg.ids), remainder=0)
        if cached and seg.key is not None and 0 < seg.seam and len(seg.ids) < SHORT_SEAMS * seg.seam
        else seg
        for seg, cached in zip(plan.segments, held, strict=True)
    ]
    return replace(plan, segments=segments)


def with_run(plan: RequestPlan, first: int, length: int, key: str, opens: bool) -> tuple[RequestPlan, int, bool]:
    """``plan`` with a run of ``length`` kept tokens (``key``) in place of its segments from ``first`` on: one cached
    segment with the plan's seam (none where it ``opens`` the prompt, or in ``pic``), and the segment the run ends
    inside running the rest of its tokens in context. Also the index of the last segment it covers and whether
    that one was cut."""
    segments = plan.segments
    ids: list[int] = []
    last = first
    while len(ids) < length:
        ids += segments[last].ids
        last += 1
    last -= 1
    cut = len(ids) > length
    width = resolve_seam(plan.seam, length) if not opens and plan.seam not in ADAPTIVE else 0
    remainder = width if plan.variant == "B" and 0 < width < length else 0
    run = SegmentPlan(tuple(ids[:length]), key, width, remainder, 0)
    rest = [SegmentPlan(tuple(ids[length:]), None, 0, 0, 0)] if cut else []
    return replace(plan, segments=[*segments[:first], run, *rest, *segments[last + 1 :]]), last, cut


def plan_request(
    prompt: Prompt,
    *,
    seam: Seam,
    default_seam: Seam,
    variant: str,
    min_cached_tokens: int,
    key: Callable[[Sequence[int]], str],
) -> RequestPlan:
    """The plan of a composed (``pic`` or ``hypic``) request; ``seam`` 0 is ``pic``. Under ``"auto"`` (or
    ``"blend"``) every seam is 0 until ``with_widths`` sets the widths ``choose_widths`` chose."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown seam variant {variant!r}; expected one of {', '.join(VARIANTS)}")
    record_seam = seam if seam and seam not in ADAPTIVE else default_seam
    if record_seam in ADAPTIVE:
        record_seam = AUTO_MEAN_SEAM
    plans = []
    for i, ids in enumerate(prompt.segments):
        n = len(ids)
        width = resolve_seam(seam, n) if i and seam not in ADAPTIVE else 0
        remainder = width if variant == "B" and 0 < width < n else 0
        record = resolve_seam(record_seam, n) if variant == "B" else 0
        cached = is_cached(prompt, i, min_cached_tokens)
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


def is_cached(prompt: Prompt, i: int, min_cached_tokens: int) -> bool:
    """The cache rule: segment ``i`` of ``prompt`` is looked up and stored when it has ``min_cached_tokens`` or more
    (at least one) and was not marked to run in context."""
    n = len(prompt.segments[i])
    return n >= max(1, min_cached_tokens) and (prompt.cacheable is None or prompt.cacheable[i])


def cached_keys(prompt: Prompt, min_cached_tokens: int, key: Callable[[Sequence[int]], str]) -> list[str]:
    """The keys a composed request's plan looks ``prompt``'s segments up under, sorted, each once: what a fleet's
    router places a request by."""
    return sorted({key(ids) for i, ids in enumerate(prompt.segments) if is_cached(prompt, i, min_cached_tokens)})


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


SEAM_STEP = 8  # how far ``auto`` widens a read boundary's seam with what its budget leaves
SETTLED = 0.03  # a probed token whose value is this close (relative) to its cached one needs no recompute


def settled_width(profile: Sequence[float], length: int, threshold: float = SETTLED) -> int:
    """The seam a boundary needs: through the last probed token still more than ``threshold`` from its cached
    self, and one more, capped at the segment; 0 where every probed token is settled."""
    unsettled = [t for t, d in enumerate(profile) if d > threshold]
    return min(length, unsettled[-1] + 2) if unsettled else 0


def error_left(profile: Sequence[float], width: int, length: int) -> float:
    """How far the first cached token after a ``width``-token seam is from its in-context self (the probe's
    last token stands for those past it): 0 for a whole segment, ``1`` with no probe."""
    if width >= length:
        return 0.0
    return float(profile[min(width, len(profile) - 1)]) if profile else 1.0


def estimate(
    profiles: Sequence[Sequence[float]],
    widths: Sequence[int],
    lengths: Sequence[int],
    reads: Sequence[float] | None = None,
) -> float:
    """A request's fidelity estimate: ``error_left`` of each boundary, averaged (0 for no boundary); with
    ``reads``, each weighted by how much the answer reads its segment (what ``auto`` spent by)."""
    left = [error_left(p, w, n) for p, w, n in zip(profiles, widths, lengths, strict=True)]
    if reads is not None and sum(reads) > 0:
        return float(sum(x * r for x, r in zip(left, reads, strict=True)) / sum(reads))
    return float(sum(left) / len(left)) if left else 0.0


READ_FLOOR = 0.34  # a boundary read less than this share of an even split, in all and per token, gets no seam


def allocate_seams(
    profiles: Sequence[Sequence[float]],
    lengths: Sequence[int],
    budget: float,
    start: Sequence[int] | None = None,
    target: float | None = None,
    reads: Sequence[float] | None = None,
) -> list[int]:
    """Each boundary's seam width within ``budget`` tokens in all. Every boundary first gets its settled width
    (``settled_width``; raised to it from ``start``, if given), cut evenly when they exceed the budget; what is
    left recomputes whole segments: past its first tokens, a cached segment's error is spread through it,
    which a wider seam barely repairs and recomputing it removes.

    With ``reads`` (each boundary's share of what the answer reads, ``deviation.reading_shares``), a boundary
    read less than ``READ_FLOOR`` of an even share gets no seam (its error barely reaches the answer), unless
    its tokens are read as much as that (a short segment is read less in all, not per token); whole segments
    go most read first (one removes all the error the answer reads from it), and what no whole segment fits
    widens the most read seams by up to ``SEAM_STEP`` tokens each. Without, whole segments go by the most
    deviation removed per token.
    With ``target``, it stops as soon as the estimate is at most that. A budget past every segment's length
    recomputes them all (``hypic`` then equals ``full``)."""
    if len(profiles) != len(lengths) or (reads is not None and len(reads) != len(lengths)):
        raise ValueError("one profile (and read share) per boundary")
    if not budget >= 0:
        raise ValueError(f"a seam budget is a token count >= 0, got {budget!r}")
    if budget >= sum(lengths) and target is None:
        return list(lengths)
    widths = [settled_width(p, n) for p, n in zip(profiles, lengths, strict=True)]
    unread: list[bool] = []  # read less than READ_FLOOR of an even share, in all and per token
    if reads is not None and lengths:
        total, tokens, count = sum(reads), sum(lengths), len(lengths)
        unread = [
            r < READ_FLOOR * total / count and r / n < READ_FLOOR * total / tokens
            for r, n in zip(reads, lengths, strict=True)
        ]
        widths = [0 if u else w for w, u in zip(widths, unread, strict=True)]
    if start is not None:
        widths = [max(w, min(s, n)) for w, s, n in zip(widths, start, lengths, strict=True)]
    elif sum(widths) > budget:
        cap = int(budget // max(1, len(widths)))
        widths = [min(w, cap) for w in widths]
    spent = sum(widths)

    def done() -> bool:
        return target is not None and estimate(profiles, widths, lengths, reads) <= target

    def priority(i: int) -> float:
        w, n = widths[i], lengths[i]
        return reads[i] if reads is not None else error_left(profiles[i], w, n) / (n - w)

    while not done():
        options = [(priority(i), i) for i, n in enumerate(lengths) if widths[i] < n and spent + n - widths[i] <= budget]
        if not options:
            break
        _, best = max(options)
        spent += lengths[best] - widths[best]
        widths[best] = lengths[best]
    if reads is not None and target is None:
        for i in sorted(range(len(lengths)), key=lambda i: -reads[i]):
            if not unread[i]:
                more = max(0, min(SEAM_STEP, lengths[i] - widths[i], int(budget - spent)))
                widths[i], spent = widths[i] + more, spent + more
    return widths


def blend_widths(profiles: Sequence[Sequence[float]], lengths: Sequence[int], budget: float) -> list[int]:
    """The CacheBlend-style baseline's widths: tokens taken by their deviation, largest first, anywhere in their
    segment (``profiles`` cover whole segments), while the seams they need fit in ``budget`` tokens. A linear
    layer cannot restart inside a cached segment (its state there was never stored), so a token is recomputed
    with every token before it in its segment: its seam reaches it. A token whose seam would overrun the
    budget is passed over for the next."""
    if len(profiles) != len(lengths):
        raise ValueError("one profile per boundary")
    if not budget >= 0:
        raise ValueError(f"a seam budget is a token count >= 0, got {budget!r}")
    widths, spent = [0] * len(lengths), 0
    ranked = sorted(((d, i, t) for i, p in enumerate(profiles) for t, d in enumerate(p[: lengths[i]])), reverse=True)
    for _, i, t in ranked:
        extra = max(0, t + 1 - widths[i])
        if extra and spent + extra <= budget:
            widths[i], spent = t + 1, spent + extra
    return widths


def boundary_budget(seam_budget: float | None, boundaries: int) -> float:
    """The tokens an adaptive seam may spend over ``boundaries`` boundaries (``seam_budget`` each on average,
    default ``AUTO_MEAN_SEAM``); 0 without a boundary (an unlimited budget times none is not nan)."""
    return (AUTO_MEAN_SEAM if seam_budget is None else seam_budget) * boundaries if boundaries else 0.0


def recomputes_every_segment(seam_budget: float | None, lengths: Sequence[int]) -> bool:
    """Whether an ``auto`` budget covers every boundary's whole segment: no probe changes its widths then."""
    return bool(lengths) and boundary_budget(seam_budget, len(lengths)) >= sum(lengths)


WIDEN_FACTOR = 4  # the guard widens seams up to this many times the tokens they had (or a seam of 8 each)
ACTIONS = ("none", "widened", "exact")


def choose_widths(
    profiles: Sequence[Sequence[float]],
    lengths: Sequence[int],
    current: Sequence[int],
    *,
    auto: bool,
    blend: bool = False,
    seam_budget: float | None = None,
    fidelity_budget: float | None = None,
    widen: bool = True,
    reads: Sequence[float] | None = None,
) -> tuple[list[int], float, str]:
    """The boundaries' widths, the request's estimate with them, and what the guard did (``ACTIONS``), from
    each boundary's probe ``profiles``.

    ``auto`` allocates ``seam_budget`` tokens per boundary on average (default ``AUTO_MEAN_SEAM``) by
    ``allocate_seams``, where the answer ``reads`` if given, and its estimate weights the boundaries by them
    (``blend``: by ``blend_widths``, from profiles over whole segments); otherwise the ``current`` widths stay.
    Where the estimate is above ``fidelity_budget``, the seams widen (up to ``WIDEN_FACTOR`` times the tokens)
    until it is not; if no widening within that reaches it, or ``widen`` is False (``pic``, which has no seams
    by definition), the action is ``"exact"``: compute the request as ``full`` does."""
    n = len(lengths)
    if blend:
        widths = blend_widths(profiles, lengths, boundary_budget(seam_budget, n))
    elif auto:
        widths = allocate_seams(profiles, lengths, boundary_budget(seam_budget, n), reads=reads)
    else:
        widths = [min(w, m) for w, m in zip(current, lengths, strict=True)]
    reads = reads if auto and not blend else None
    est = estimate(profiles, widths, lengths, reads)
    if fidelity_budget is None or est <= fidelity_budget:
        return widths, est, "none"
    if not widen:
        return widths, est, "exact"
    cap = WIDEN_FACTOR * max(sum(widths), AUTO_MEAN_SEAM * n)
    wider = allocate_seams(profiles, lengths, cap, start=widths, target=fidelity_budget, reads=reads)
    wider_est = estimate(profiles, wider, lengths, reads)
    if wider_est <= fidelity_budget:
        return wider, wider_est, "widened"
    return widths, est, "exact"
