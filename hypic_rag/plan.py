"""A request's plan: for each segment of the prompt, whether it is cached, under which key, how many
of its leading tokens the seam recomputes, and which remainder it composes (docs/design.md §4).

This is the one home of the seam rule:

- a seam is ``seam`` tokens, or a fraction of each segment rounded up, capped at the segment;
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
from dataclasses import dataclass

VARIANTS = ("A", "B")


def resolve_seam(seam: int | float, length: int) -> int:
    """A token count, or a fraction of the segment (rounded up), capped at its length."""
    if isinstance(seam, bool) or not isinstance(seam, (int, float)) or not math.isfinite(seam) or seam < 0:
        raise ValueError(f"seam must be a token count or a fraction in [0, 1], got {seam!r}")
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
    kinds: tuple[str, ...] | None = None  # per segment (document, tool, ...), for the cache's hit ratio by kind

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
    seam: int | float
    variant: str


def plan_request(
    prompt: Prompt,
    *,
    seam: int | float,
    default_seam: int | float,
    variant: str,
    min_cached_tokens: int,
    key: Callable[[Sequence[int]], str],
) -> RequestPlan:
    """The plan of a composed (``pic`` or ``hypic``) request; ``seam`` 0 is ``pic``."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown seam variant {variant!r}; expected one of {', '.join(VARIANTS)}")
    record_seam = seam if seam else default_seam
    plans = []
    for i, ids in enumerate(prompt.segments):
        n = len(ids)
        width = resolve_seam(seam, n) if i else 0
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
