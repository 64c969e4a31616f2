"""Segment-parallel prefill: one left-padded batch must equal each segment prefilled alone."""

from __future__ import annotations

import torch

from hypic_rag.kernels.algebra import compose
from hypic_rag.model import load_model
from hypic_rag.prefill import prefill_isolated


def _segments(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 320, (n,), generator=gen).tolist() for n in lengths]


def test_batched_entries_equal_single_segment_runs(checkpoint):
    model = load_model(checkpoint("qwen3_next_moe"))
    segs = _segments([37, 64, 5, 20])
    batched = prefill_isolated(model, segs, [8, 8, 8, 0])
    alone = [prefill_isolated(model, [s], [w])[0] for s, w in zip(segs, [8, 8, 8, 0], strict=True)]
    for b, a, ids in zip(batched, alone, segs, strict=True):
        assert b.token_ids == tuple(ids)
        for i in a.linear:
            for name in ("b", "p", "conv_tail", "p_rest", "b_rest"):
                x, y = getattr(a.linear[i], name), getattr(b.linear[i], name)
                assert (x is None) == (y is None), name
                if x is not None:
                    assert (x - y).abs().max() < 1e-5, name
        for i in a.attention:
            assert (a.attention[i].keys - b.attention[i].keys).abs().max() < 1e-5
            assert (a.attention[i].values - b.attention[i].values).abs().max() < 1e-5
    assert batched[2].seam == 0 and batched[2].linear[0].p_rest is None  # the seam covers all 5 tokens


def test_entry_states_match_the_model_cache(checkpoint):
    """B is the zero-start end state, P composes it, K sits at positions 0..L-1, the tail is the conv's."""
    model = load_model(checkpoint("qwen3_5_text"))
    ids = _segments([45])[0]
    entry = prefill_isolated(model, [ids], [8])[0]
    cache, head = model.new_cache(), model.new_cache()
    with torch.inference_mode():
        model.hidden_states(torch.tensor([ids]), cache)
        model.hidden_states(torch.tensor([ids[:8]]), head)
    for i, lin in entry.linear.items():
        state = cache.linear(i)
        assert (lin.b - state.recurrent[0]).abs().max() < 1e-5
        assert (lin.conv_tail - state.conv[0]).abs().max() < 1e-5
        # The remainder's operator carries the state after the 8 seam tokens to the segment's end.
        after_seam = head.linear(i).recurrent[0]
        assert (compose(lin.p_rest[None], lin.b_rest[None], after_seam)[0] - lin.b).abs().max() < 1e-5
    for i, att in entry.attention.items():
        kv = cache.attention(i)
        assert torch.equal(kv.positions, torch.arange(45))
        assert (att.keys - kv.keys[0]).abs().max() < 1e-5
        assert (att.values - kv.values[0]).abs().max() < 1e-5
