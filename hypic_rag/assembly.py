"""Building a request's state from its plan: cached segments composed, the rest run in context
(HYPIC.md §3-§4).

A cached segment's first ``seam`` tokens run through every layer in context; the rest comes from its
entry: linear states composed with its operator, conv tail copied, K placed at the new positions
with the rotation it still owes (``stitch`` applies it). Variant ``"A"`` composes the whole segment's
operator onto the state before the seam; ``"B"`` composes the remainder's operator onto the fresh
state after it. Segments that run in context go through the model as one forward per consecutive
stretch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .cache.entry import RemainderEntry, SegmentEntry
from .kernels.algebra import compose
from .model import HybridModel, RequestState
from .plan import RequestPlan


@dataclass(frozen=True)
class Cached:
    """What the cache gave a segment: its shared entry, and the remainder its plan uses (or None)."""

    entry: SegmentEntry
    rest: RemainderEntry | None = None

    @property
    def nbytes(self) -> int:
        return self.entry.nbytes + (self.rest.nbytes if self.rest is not None else 0)


def run_in_context(model: HybridModel, state: RequestState, ids: Sequence[int]) -> None:
    if ids:
        model.hidden_states(torch.tensor([list(ids)], dtype=torch.long, device=model.device), state)


@torch.inference_mode()
def install_segment(model: HybridModel, state: RequestState, cached: Cached, seam: int, variant: str) -> int:
    """Advance ``state`` through a cached segment's tokens; returns how many went through the model."""
    entry = cached.entry
    n = len(entry)
    w = min(seam, n)
    offset = state.seq_len
    before = {i: (s.recurrent[0] if (s := state.linear(i)) is not None else None) for i in state.linear_layer_ids}
    run_in_context(model, state, entry.token_ids[:w])
    if w == n:
        return w
    use_rest = variant == "B" and w > 0
    if use_rest and (cached.rest is None or cached.rest.seam != w):
        raise ValueError(f"segment with a {w}-token seam needs its remainder entry after {w} tokens")
    linear = {}
    for i, lin in entry.linear.items():
        if use_rest:
            rest = cached.rest.linear[i]
            s = compose(rest.p[None], rest.b[None], state.linear(i).recurrent[0])[0]
        else:
            s = compose(lin.p[None], lin.b[None], before[i])[0]
        linear[i] = (lin.conv_tail[None].to(model.dtype), s[None])
    kv = {i: (att.keys[None, :, w:], att.values[None, :, w:]) for i, att in entry.attention.items()}
    state.extend(n - w, linear, kv, shift=offset)  # keys stay at w..L-1; stitch moves them by `offset`
    return w


def assemble(model: HybridModel, state: RequestState, plan: RequestPlan, cached: Sequence[Cached | None]) -> int:
    """Advance an empty ``state`` through the plan's segments; returns the tokens that went through the
    model. ``cached[i]`` None means segment ``i`` runs in context."""
    recomputed = 0
    stretch: list[int] = []
    for seg, found in zip(plan.segments, cached, strict=True):
        if found is None or seg.in_context:
            stretch.extend(seg.ids)
            recomputed += len(seg.ids)
            continue
        run_in_context(model, state, stretch)
        stretch = []
        recomputed += install_segment(model, state, found, seg.seam, plan.variant)
    run_in_context(model, state, stretch)
    return recomputed

