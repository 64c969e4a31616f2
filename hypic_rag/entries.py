"""Cold segments prefilled in isolation, all at once (HYPIC.md §5): one left-padded batched forward
from the zero state, whose per-row states, transition operators and KV become cache entries.

The operators come out of the forward through an explicit ``TransitionCapture``; each row's
remainder (seam variant B) starts at its own column, so the batch needs no common split.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .cache.entry import AttentionEntry, LinearEntry, LinearRemainder, RemainderEntry, SegmentEntry
from .kernels.algebra import rerotate
from .model import HybridModel, TransitionCapture


@dataclass(frozen=True)
class FreshEntry:
    """A segment just prefilled in isolation: its shared entry, and its remainder when one was asked."""

    entry: SegmentEntry
    rest: RemainderEntry | None


@torch.inference_mode()
def prefill_isolated(
    model: HybridModel, segments: Sequence[Sequence[int]], rests: Sequence[int], *, max_batch_tokens: int = 2048
) -> list[FreshEntry]:
    """One entry per segment. ``0 < rests[i] < len(segments[i])`` also records the operator of tokens
    ``[rests[i], L)`` (seam variant B). Segments go longest first in batches of at most
    ``max_batch_tokens`` padded tokens, so padding stays small; a longer segment runs alone. 2,048 (was
    32,768): on CPU a batch's activations then stay cache-sized, and 8 cold 1k-token documents prefilled
    two at a time ran 1.2x faster than all eight at once (``--sweep cold``, README)."""
    order = sorted(range(len(segments)), key=lambda i: -len(segments[i]))
    out: list[FreshEntry | None] = [None] * len(segments)
    batch: list[int] = []
    for i in order:
        if batch and len(segments[batch[0]]) * (len(batch) + 1) > max_batch_tokens:
            _prefill_batch(model, segments, rests, batch, out)
            batch = []
        batch.append(i)
    if batch:
        _prefill_batch(model, segments, rests, batch, out)
    return [e for e in out if e is not None]


def _unpadded(mixer: torch.nn.Module, b: torch.Tensor, pad: int, model: HybridModel) -> torch.Tensor:
    """A copy of a row's state, stored as if its segment began at 0: a state built from RoPE-rotated keys
    (Ring-linear) is rotated back by the row's padding; the others are position-free."""
    place = getattr(mixer, "place_state", None)
    return place(b, -pad, model.inv_freq) if place is not None and pad else b.clone()


def _prefill_batch(
    model: HybridModel,
    segments: Sequence[Sequence[int]],
    rests: Sequence[int],
    rows: list[int],
    out: list[FreshEntry | None],
) -> None:
    device = model.device
    width = max(len(segments[i]) for i in rows)
    pads = [width - len(segments[i]) for i in rows]
    ids = torch.zeros(len(rows), width, dtype=torch.long, device=device)
    pad_mask = torch.zeros(len(rows), width, dtype=torch.bool, device=device)
    for r, i in enumerate(rows):
        ids[r, pads[r] :] = torch.tensor(segments[i], dtype=torch.long, device=device)
        pad_mask[r, pads[r] :] = True
    splits = [rests[i] if 0 < rests[i] < len(segments[i]) else 0 for i in rows]
    starts = [pads[r] + splits[r] if splits[r] else width for r in range(len(rows))]
    capture = TransitionCapture(torch.tensor(starts, device=device))
    state = model.new_state()
    # Without padding the batch runs the plain causal path.
    model.hidden_states(ids, state, pad_mask=None if not any(pads) else pad_mask, capture=capture)

    mixers = model.linear_mixers()
    for r, i in enumerate(rows):
        entry, rest = SegmentEntry(tuple(segments[i])), None
        if splits[r]:
            rest = RemainderEntry(entry.token_ids, splits[r])
        for layer in state.linear_layer_ids:
            lin, ops = state.linear(layer), capture.operators[layer]
            entry.linear[layer] = LinearEntry(
                _unpadded(mixers[layer], lin.recurrent[r], pads[r], model), ops.p[r].clone(), lin.conv[r].clone()
            )
            if rest is not None:
                rest_state = _unpadded(mixers[layer], ops.rest_state[r], pads[r], model)
                rest.linear[layer] = LinearRemainder(rest_state, ops.rest_p[r].clone())
        for layer in state.attention_layer_ids:
            kv = state.attention(layer)
            keys = kv.keys[r, :, pads[r] :]
            # Store keys rotated at 0..L-1: free of the padding this batch happened to need.
            shift = torch.full((keys.shape[1],), -pads[r], device=device)
            entry.attention[layer] = AttentionEntry(
                rerotate(keys, shift, model.inv_freq) if pads[r] else keys.clone(),
                kv.values[r, :, pads[r] :].clone(),
            )
        out[i] = FreshEntry(entry, rest)
