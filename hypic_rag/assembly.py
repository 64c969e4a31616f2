"""Continuing a prompt's cache through a cached segment (HYPIC.md §3-§4).

The first ``seam`` tokens run through every layer in context; the rest of the segment comes from
its entry: linear states composed with its operator, conv tail copied, K placed at the new
positions with the rotation it still owes (``stitch`` applies it). Variant ``"A"`` composes the
whole segment's operator onto the state before the seam; ``"B"`` composes the remainder's operator
onto the fresh state after it.
"""

from __future__ import annotations

import math

import torch

from .cache.entry import SegmentEntry
from .kernels.algebra import compose
from .model import HybridModel
from .model.cache import HybridCache

VARIANTS = ("A", "B")


def resolve_seam(seam: int | float, length: int) -> int:
    """A token count, or a fraction of the segment (rounded up), capped at its length."""
    if isinstance(seam, bool) or not isinstance(seam, (int, float)) or seam < 0:
        raise ValueError(f"seam must be a token count or a fraction in [0, 1], got {seam!r}")
    if isinstance(seam, float):
        if seam > 1:
            raise ValueError(f"a fractional seam must be in [0, 1], got {seam}")
        return min(length, math.ceil(seam * length))
    return min(length, seam)


@torch.inference_mode()
def install_segment(model: HybridModel, cache: HybridCache, entry: SegmentEntry, seam: int, variant: str) -> int:
    """Advance ``cache`` through ``entry``'s tokens; returns how many tokens went through the model."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown seam variant {variant!r}; expected one of {', '.join(VARIANTS)}")
    n = len(entry)
    w = min(seam, n)
    offset = cache.seq_len
    device = model.device
    linear_ids = cache.linear_layer_ids
    before = {i: (s.recurrent if (s := cache.linear(i)) is not None else None) for i in linear_ids}
    if w > 0:
        ids = torch.tensor([entry.token_ids[:w]], dtype=torch.long, device=device)
        model.hidden_states(ids, cache)
    if w == n:
        return w
    use_rest = variant == "B" and w > 0
    if use_rest and entry.seam != w:
        raise ValueError(f"entry holds the remainder after {entry.seam} seam tokens, not {w}")
    for i in linear_ids:
        lin = entry.linear[i]
        if use_rest:
            assert lin.p_rest is not None and lin.b_rest is not None
            start = cache.linear(i).recurrent[0]
            state = compose(lin.p_rest[None], lin.b_rest[None], start)[0]
        else:
            start = before[i][0] if before[i] is not None else None
            state = compose(lin.p[None], lin.b[None], start)[0]
        cache.set_linear(i, lin.conv_tail[None].to(model.dtype), state[None])
    positions = torch.arange(offset + w, offset + n, device=device)
    shift = torch.full((n - w,), offset, device=device)
    for i, att in entry.attention.items():  # keys stay at 0..L-1; stitch moves them by `shift`
        cache.append_kv(i, att.keys[None, :, w:], att.values[None, :, w:], positions, shift)
    cache.seq_len = offset + n
    return w
