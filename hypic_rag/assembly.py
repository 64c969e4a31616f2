"""Building a request's state from its plan: cached segments composed, the others run in context
(docs/design.md §3-§4).

A cached segment's first ``seam`` tokens run through every layer in context; its others come from its
entry: linear states composed with its operator, conv tail copied, K placed at the new positions
with the rotation it still owes (``stitch`` applies it). Variant ``"A"`` composes the whole segment's
operator onto the state before the seam; ``"B"`` composes its remainder's (the tokens after the seam)
onto the fresh state after it. Segments that run in context go through the model as one forward per
consecutive stretch.

``assemble_fused`` does the same in one forward for the whole request: the weights are read once and the
cached keys rotated once. ``assemble`` stays as its reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .cache.entry import CachedSegment, LinearEntry, LinearRemainder, LinearTokens
from .kernels.algebra import DeltaTokens, compose_forms, rerotate
from .kernels.indices import int64
from .model import HybridModel, RequestState, SegmentJumps
from .model.state import StateMarks
from .plan import RequestPlan

Operator = LinearEntry | LinearRemainder | DeltaTokens


def operators(
    cached: CachedSegment, seam: int, variant: str, through_layer: int | None = None
) -> tuple[bool, dict[int, Operator]]:
    """Per linear layer (up to ``through_layer``), the map that carries the state past a cached segment after
    ``seam`` recomputed tokens (``p`` and ``b``, or the segment's tokens as a ``DeltaTokens``, applied without
    forming ``p``), and whether it starts from the state after the seam (variant B's remainder) rather than the
    state before it (the whole segment's, variant A or no seam)."""
    after_seam = variant == "B" and seam > 0
    if not after_seam:
        return False, {i: _operator(e) for i, e in cached.entry.linear.items() if _reaches(i, through_layer)}
    if cached.remainder is None or cached.remainder.seam != seam:
        raise ValueError(f"segment with a {seam}-token seam needs its remainder entry after {seam} tokens")
    return True, {i: _operator(e) for i, e in cached.remainder.linear.items() if _reaches(i, through_layer)}


def _reaches(layer: int, through_layer: int | None) -> bool:
    return through_layer is None or layer <= through_layer


def _operator(e: LinearEntry | LinearRemainder | LinearTokens) -> Operator:
    return e.operator() if isinstance(e, LinearTokens) else e


def placed_state(mixer: torch.nn.Module, b: torch.Tensor, offset: int, model: HybridModel) -> torch.Tensor:
    """A cached state moved to where its segment now begins, for mixers whose state depends on it (RoPE-rotated
    keys in a linear layer: Ring-linear); the others' states are position-free."""
    place = getattr(mixer, "place_state", None)
    return place(b, offset, model.inv_freq) if place is not None else b


def run_in_context(model: HybridModel, state: RequestState, ids: Sequence[int]) -> None:
    if ids:
        model.hidden_states(int64(ids, model.device)[None], state)


@torch.inference_mode()
def install_segment(model: HybridModel, state: RequestState, cached: CachedSegment, seam: int, variant: str) -> int:
    """Advance ``state`` through a cached segment's tokens; returns how many went through the model."""
    entry = cached.entry
    n = len(entry)
    w = min(seam, n)
    offset = state.seq_len
    before = {i: (s.recurrent[0] if (s := state.linear(i)) is not None else None) for i in state.linear_layer_ids}
    run_in_context(model, state, entry.token_ids[:w])
    if w == n:
        return w
    after_seam, ops = operators(cached, w, variant)
    forms, mixers = model.operator_forms, model.linear_mixers()
    linear = {}
    for i, lin in entry.linear.items():
        start, op = state.linear(i).recurrent[0] if after_seam else before[i], ops[i]
        if isinstance(op, DeltaTokens):
            s = op.apply(start)
        else:
            s = compose_forms(forms[i], op.p[None], placed_state(mixers[i], op.b, offset, model)[None], start)[0]
        linear[i] = (lin.conv_tail[None].to(model.dtype), s[None])
    kv = {i: (att.keys[None, :, w:], att.values[None, :, w:]) for i, att in entry.attention.items()}
    state.extend(n - w, linear, kv, shift=offset)  # keys stay at w..L-1; stitch moves them by `offset`
    return w


def assemble(model: HybridModel, state: RequestState, plan: RequestPlan, cached: Sequence[CachedSegment | None]) -> int:
    """Advance ``state`` (empty, or an exact prefix) through the plan's segments; returns the tokens that went
    through the model. ``cached[i]`` None means segment ``i`` runs in context."""
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


def fresh_tokens(plan: RequestPlan, cached: Sequence[CachedSegment | None]) -> int:
    """The tokens ``assemble`` (with the query) and ``fused_inputs`` run through the model for ``plan``: each cached
    segment's seam, every segment run in context, and the query; a scheduler's cost of that forward, known before
    it runs."""
    seams = sum(
        len(seg.ids) if found is None or seg.in_context else min(seg.seam, len(seg.ids))
        for seg, found in zip(plan.segments, cached, strict=True)
    )
    return seams + len(plan.query)


@dataclass
class FusedInputs:
    """What one forward over a plan runs: the fresh token ids, each at its position, the jumps over cached
    segments, and per cached segment the index range of its seam among the fresh tokens."""

    ids: torch.Tensor
    positions: torch.Tensor
    jumps: SegmentJumps | None
    seams: dict[int, range]  # segment index -> its seam's indices among the fresh tokens
    offsets: dict[int, int]  # segment index -> where it begins in the prompt
    placed: int  # cached keys placed in the state before the fresh ones


def fused_inputs(
    model: HybridModel,
    state: RequestState,
    plan: RequestPlan,
    cached: Sequence[CachedSegment | None],
    through_layer: int | None = None,
) -> FusedInputs:
    """Place the cached segments' keys in ``state`` (rotated once, every layer together) after what it holds (an
    exact prefix restored into it, or nothing) and gather the tokens the plan recomputes, with the jumps the
    linear layers make over cached segments. ``through_layer``: only the layers up to it get keys and jumps (a
    forward that stops there, the probe)."""
    device = model.device
    state.reserve(state.seq_len + sum(len(seg.ids) for seg in plan.segments) + len(plan.query) + 1)
    fresh: list[int] = []
    positions: list[int] = []
    at: list[int] = []
    src: list[int] = []
    linear = [i for i in state.linear_layer_ids if _reaches(i, through_layer)]
    ops: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {i: [] for i in linear}
    tails: dict[int, list[torch.Tensor]] = {i: [] for i in linear}
    tokens: dict[int, list[DeltaTokens | None]] = {i: [] for i in linear}
    mixers = model.linear_mixers()
    attention = [i for i in state.attention_layer_ids if _reaches(i, through_layer)]
    placed: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {i: [] for i in attention}
    at_positions: list[range] = []  # where each placed run of cached keys sits
    shifts: list[int] = []  # per placed key, the rotation it still owes: where its segment now begins
    seams: dict[int, range] = {}
    offsets: dict[int, int] = {}
    offset = state.seq_len
    for k, (seg, found) in enumerate(zip(plan.segments, cached, strict=True)):
        n = len(seg.ids)
        offsets[k] = offset
        if found is None or seg.in_context:
            fresh += seg.ids
            positions += range(offset, offset + n)
            offset += n
            continue
        w = min(seg.seam, n)
        before = len(fresh)
        fresh += seg.ids[:w]
        seams[k] = range(before, before + w)
        positions += range(offset, offset + w)
        after_seam, through = operators(found, w, plan.variant, through_layer)
        at.append(len(fresh))
        src.append(len(fresh) if after_seam else before)
        for i in linear:
            op = through[i]
            tails[i].append(found.entry.linear[i].conv_tail)
            tokens[i].append(op if isinstance(op, DeltaTokens) else None)
            if not isinstance(op, DeltaTokens):
                ops[i].append((op.p, placed_state(mixers[i], op.b, offset, model)))
        for i in attention:
            att = found.entry.attention[i]
            placed[i].append((att.keys[:, w:], att.values[:, w:]))
        at_positions.append(range(offset + w, offset + n))
        shifts += [offset] * (n - w)
        offset += n
    layers = list(placed)
    if shifts and layers:  # every cached key rotated once, to where its token now sits: all layers in one rotation
        heads = [placed[i][0][0].shape[0] for i in layers]  # layers stacked along the kv heads
        keys = torch.cat([torch.cat([k for k, _ in placed[i]], dim=1) for i in layers])
        keys = rerotate(keys[None], int64(shifts, device), model.inv_freq)[0].split(heads)
        where = int64((p for run in at_positions for p in run), device)
        for i, k in zip(layers, keys, strict=True):
            state.append_kv(i, k[None], torch.cat([v for _, v in placed[i]], dim=1)[None], where)
    if shifts:
        state.advance(len(shifts))
    fresh += plan.query
    positions += range(offset, offset + len(plan.query))
    jumps = None
    if at:
        stacked = {i: (*_stacked(ops[i], tokens[i]), torch.stack(tails[i])) for i in ops}
        kept = {i: tuple(t) for i, t in tokens.items() if any(x is not None for x in t)}
        jumps = SegmentJumps(int64(at), int64(src), stacked, kept)
    return FusedInputs(int64(fresh, device)[None], int64(positions, device), jumps, seams, offsets, len(shifts))


def _stacked(
    dense: list[tuple[torch.Tensor, torch.Tensor]], tokens: list[DeltaTokens | None]
) -> tuple[torch.Tensor, ...]:
    """The dense jumps' ``P`` and ``B`` stacked; none (``[0, H, K, K]``, ``[0, H, K, V]``) where every jump of the
    layer keeps its tokens."""
    if dense:
        return tuple(torch.stack(t) for t in zip(*dense, strict=True))
    first = next(t for t in tokens if t is not None)
    (h, _, dk), dv = first.k.shape, first.v.shape[-1]
    return first.k.new_zeros(0, h, dk, dk), first.k.new_zeros(0, h, dk, dv)


@torch.inference_mode()
def assemble_fused(
    model: HybridModel,
    state: RequestState,
    plan: RequestPlan,
    cached: Sequence[CachedSegment | None],
    marks: StateMarks | None = None,
) -> tuple[torch.Tensor, int]:
    """The whole prompt in ONE forward: every token the request recomputes (in-context stretches, each
    cached segment's seam, the query) goes through the model together, at its own position; cached
    segments' keys are placed first, rotated once to where they now sit, and the linear layers jump
    over each cached segment (``SegmentJumps``). Returns the next-token logits ``[V]`` and how many tokens went
    through the model; equal to ``assemble`` then a query forward, up to rounding. ``marks``, among the query's
    tokens (counted among the fresh ones), get the linear layers' states there."""
    inputs = fused_inputs(model, state, plan, cached)
    out = model(inputs.ids, state=state, positions=inputs.positions, logits_to_keep=1, jumps=inputs.jumps, marks=marks)
    return out[0, -1].float(), inputs.ids.shape[1]
