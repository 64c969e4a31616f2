"""Cold segments prefilled in isolation, all at once (docs/design.md §5): one left-padded batched forward
from the zero state, whose per-row states, transition operators and KV become cache entries.

The operators come out of the forward through an explicit ``TransitionCapture``; each row's
remainder (seam variant B) starts at its own column, so the batch needs no common split. A short Gated DeltaNet
segment keeps the capture's keys, values and gates instead (``cache.entry.LinearTokens``): its operator and state
are functions of them in fewer numbers, and every remainder is a suffix of them, so none is stored.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .cache.entry import (
    AttentionEntry,
    CachedSegment,
    LinearEntry,
    LinearRemainder,
    LinearTokens,
    RemainderEntry,
    SegmentEntry,
)
from .kernels.algebra import rerotate
from .model import HybridModel, TransitionCapture


@torch.inference_mode()
def prefill_isolated(
    model: HybridModel,
    segments: Sequence[Sequence[int]],
    remainders: Sequence[int],
    *,
    max_batch_tokens: int = 2048,
    compact: bool = True,
) -> list[CachedSegment]:
    """One entry per segment. ``0 < remainders[i] < len(segments[i])`` also records its remainder after that
    many tokens, the operator of tokens ``[remainders[i], L)`` (seam variant B). Segments go longest first in
    batches of at most ``max_batch_tokens`` padded tokens, so padding stays small; a longer segment runs alone.
    On CPU a batch of that size keeps its activations cache-sized, which prefilled cold documents faster than
    one batch of all of them (``hypic-rag bench --sweep cold``). ``compact``: keep a short segment's Gated
    DeltaNet layers as their tokens where that is smaller (``cache.entry.LinearTokens``; its remainders are then
    views of the entry); False: always dense."""
    order = sorted(range(len(segments)), key=lambda i: -len(segments[i]))
    out: list[CachedSegment | None] = [None] * len(segments)
    batch: list[int] = []
    for i in order:
        if batch and len(segments[batch[0]]) * (len(batch) + 1) > max_batch_tokens:
            _prefill_batch(model, segments, remainders, batch, out, compact)
            batch = []
        batch.append(i)
    if batch:
        _prefill_batch(model, segments, remainders, batch, out, compact)
    return [e for e in out if e is not None]


def _unpadded(mixer: torch.nn.Module, b: torch.Tensor, pad: int, model: HybridModel) -> torch.Tensor:
    """A copy of a row's state, stored as if its segment began at 0: a state built from RoPE-rotated keys
    (Ring-linear) is rotated back by the row's padding; the others are position-free."""
    place = getattr(mixer, "place_state", None)
    return place(b, -pad, model.inv_freq) if place is not None and pad else b.clone()


def _tokens(
    capture: TransitionCapture, layer: int, row: int, start: int, conv_tail: torch.Tensor
) -> LinearTokens | None:
    """A row's Gated DeltaNet layer as its delta-rule inputs from column ``start`` on, where they take fewer
    numbers than the dense ``b`` and ``p`` of its whole segment (``kernels.algebra.DeltaTokens``); else None.
    Keys are kept per key head (the layer repeats them to the value heads)."""
    inputs = capture.inputs.get(layer)
    if inputs is None:
        return None
    keys, v, g, beta = (x[row, start:] for x in inputs)  # [L, H_k, K], [L, H_v, V], [L, H_v]
    n, key_heads, dk = keys.shape
    heads, dv = v.shape[1:]
    if n * (key_heads * dk + heads * (dv + 2)) >= heads * dk * (dk + dv):
        return None
    gates = torch.stack((g.float(), beta.float()), dim=-1).transpose(0, 1).contiguous()
    return LinearTokens(keys.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous(), gates, conv_tail)


def _prefill_batch(
    model: HybridModel,
    segments: Sequence[Sequence[int]],
    remainders: Sequence[int],
    rows: list[int],
    out: list[CachedSegment | None],
    compact: bool = True,
) -> None:
    device = model.device
    width = max(len(segments[i]) for i in rows)
    pads = [width - len(segments[i]) for i in rows]
    ids = torch.zeros(len(rows), width, dtype=torch.long, device=device)
    pad_mask = torch.zeros(len(rows), width, dtype=torch.bool, device=device)
    for r, i in enumerate(rows):
        ids[r, pads[r] :] = torch.tensor(segments[i], dtype=torch.long, device=device)
        pad_mask[r, pads[r] :] = True
    splits = [remainders[i] if 0 < remainders[i] < len(segments[i]) else 0 for i in rows]
    starts = [pads[r] + splits[r] if splits[r] else width for r in range(len(rows))]
    capture = TransitionCapture(torch.tensor(starts, device=device))
    state = model.new_state()
    # Without padding the batch runs the plain causal path.
    model.hidden_states(ids, state, pad_mask=None if not any(pads) else pad_mask, capture=capture)

    mixers = model.linear_mixers()
    for r, i in enumerate(rows):
        entry, remainder = SegmentEntry(tuple(segments[i])), None
        if splits[r]:
            remainder = RemainderEntry(entry.token_ids, splits[r])
        for layer in state.linear_layer_ids:
            lin, ops = state.linear(layer), capture.operators[layer]
            tokens = _tokens(capture, layer, r, pads[r], lin.conv[r].clone()) if compact else None
            if tokens is not None:
                entry.linear[layer] = tokens
                continue
            end = _unpadded(mixers[layer], lin.recurrent[r], pads[r], model)
            entry.linear[layer] = LinearEntry(end, ops.p[r].clone(), lin.conv[r].clone())
            if remainder is not None:
                state_after = _unpadded(mixers[layer], ops.rest_state[r], pads[r], model)
                remainder.linear[layer] = LinearRemainder(state_after, ops.rest_p[r].clone())
        for layer in state.attention_layer_ids:
            kv = state.attention(layer)
            keys = kv.keys[r, :, pads[r] :]
            # Store keys rotated at 0..L-1: free of the padding this batch happened to need.
            shift = torch.full((keys.shape[1],), -pads[r], device=device)
            entry.attention[layer] = AttentionEntry(
                rerotate(keys, shift, model.inv_freq) if pads[r] else keys.clone(),
                kv.values[r, :, pads[r] :].clone(),
            )
        if entry.derives_remainders:
            remainder = entry.derived_remainder(splits[r])
        out[i] = CachedSegment(entry, remainder)
