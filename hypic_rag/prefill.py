"""Cold segments prefilled in isolation, all at once (HYPIC.md §5): one left-padded batched forward
from the zero state, whose per-row states, transition operators and KV become cache entries."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .cache.entry import AttentionEntry, LinearEntry, SegmentEntry
from .kernels.algebra import rerotate
from .model import HybridModel
from .model.cache import AttentionLayerKV, LinearLayerState


@torch.inference_mode()
def prefill_isolated(
    model: HybridModel, segments: Sequence[Sequence[int]], seams: Sequence[int], *, max_batch_tokens: int = 1 << 15
) -> list[SegmentEntry]:
    """One entry per segment. ``seams[i] > 0`` also records the operator of tokens ``[seams[i], L)``
    (seam variant B). Segments go longest first in batches of at most ``max_batch_tokens`` padded
    tokens, so padding stays small."""
    order = sorted(range(len(segments)), key=lambda i: -len(segments[i]))
    entries: list[SegmentEntry | None] = [None] * len(segments)
    batch: list[int] = []
    for i in order:
        if batch and len(segments[batch[0]]) * (len(batch) + 1) > max_batch_tokens:
            _prefill_batch(model, segments, seams, batch, entries)
            batch = []
        batch.append(i)
    if batch:
        _prefill_batch(model, segments, seams, batch, entries)
    return [e for e in entries if e is not None]


def _prefill_batch(
    model: HybridModel,
    segments: Sequence[Sequence[int]],
    seams: Sequence[int],
    rows: list[int],
    out: list[SegmentEntry | None],
) -> None:
    device = model.device
    width = max(len(segments[i]) for i in rows)
    pads = [width - len(segments[i]) for i in rows]
    ids = torch.zeros(len(rows), width, dtype=torch.long, device=device)
    pad_mask = torch.zeros(len(rows), width, dtype=torch.bool, device=device)
    for r, i in enumerate(rows):
        ids[r, pads[r] :] = torch.tensor(segments[i], dtype=torch.long, device=device)
        pad_mask[r, pads[r] :] = True
    cache = model.new_cache()
    cache.capture_transitions = True
    splits = [seams[i] if 0 < seams[i] < len(segments[i]) else 0 for i in rows]
    starts = [pads[r] + splits[r] for r in range(len(rows))]
    if all(splits) and len(set(starts)) == 1:
        cache.rest_split = starts[0]
    elif any(splits):
        col = torch.arange(width, device=device)[None, :]
        first = torch.tensor([s if sp else width for s, sp in zip(starts, splits, strict=True)], device=device)
        cache.rest_mask = col >= first[:, None]
    # Without padding the batch runs the plain causal path.
    model.hidden_states(ids, cache, pad_mask=None if not any(pads) else pad_mask)

    for r, i in enumerate(rows):
        entry = SegmentEntry(tuple(segments[i]), splits[r])
        for layer, state in enumerate(cache.layers):
            if isinstance(state, LinearLayerState):
                tr = cache.transitions[layer]
                rest = splits[r] > 0
                entry.linear[layer] = LinearEntry(
                    b=state.recurrent[r].clone(),
                    p=tr.p[r].clone(),
                    conv_tail=state.conv[r].clone(),
                    p_rest=tr.p_rest[r].clone() if rest and tr.p_rest is not None else None,
                    b_rest=tr.b_rest[r].clone() if rest and tr.b_rest is not None else None,
                )
            elif isinstance(state, AttentionLayerKV):
                keys = state.keys[r, :, pads[r] :]
                # Store keys rotated at 0..L-1: free of the padding this batch happened to need.
                shift = torch.full((keys.shape[1],), -pads[r], device=device)
                entry.attention[layer] = AttentionEntry(
                    rerotate(keys, shift, model.inv_freq) if pads[r] else keys.clone(),
                    state.values[r, :, pads[r] :].clone(),
                )
        out[i] = entry
