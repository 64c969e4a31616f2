"""Segment-parallel prefill (``hypic_rag.entries``): one left-padded batch must equal each segment
prefilled alone, and an entry must hold what the model's own request state holds."""

from __future__ import annotations

import pytest
import torch

from hypic_rag.entries import prefill_isolated
from hypic_rag.kernels.algebra import compose
from hypic_rag.model import load_model


def _segments(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 320, (n,), generator=gen).tolist() for n in lengths]


def test_batched_entries_equal_single_segment_runs(checkpoint):
    model = load_model(checkpoint("qwen3_next_moe"))
    segs = _segments([37, 64, 5, 20])
    widths = [8, 8, 8, 0]
    batched = prefill_isolated(model, segs, widths)
    alone = [prefill_isolated(model, [s], [w])[0] for s, w in zip(segs, widths, strict=True)]
    for b, a, ids in zip(batched, alone, segs, strict=True):
        assert b.entry.token_ids == tuple(ids)
        for i in a.entry.linear:
            assert type(a.entry.linear[i]) is type(b.entry.linear[i])
            for name, x in vars(a.entry.linear[i]).items():
                assert (x - getattr(b.entry.linear[i], name)).abs().max() < 1e-5, name
        assert (a.remainder is None) == (b.remainder is None)
        if a.remainder is not None:
            assert a.remainder.seam == b.remainder.seam == 8
            for i in a.remainder.linear:
                for name, x in vars(a.remainder.linear[i]).items():
                    assert (x - getattr(b.remainder.linear[i], name)).abs().max() < 1e-5, name
        for i in a.entry.attention:
            assert (a.entry.attention[i].keys - b.entry.attention[i].keys).abs().max() < 1e-5
            assert (a.entry.attention[i].values - b.entry.attention[i].values).abs().max() < 1e-5
    assert batched[2].remainder is None and batched[3].remainder is None  # the seam covers all 5 tokens; no seam asked


def test_entry_states_match_the_model_state(checkpoint):
    """B is the zero-start end state, P composes it, K sits at positions 0..L-1, the tail is the conv's."""
    model = load_model(checkpoint("qwen3_5_text"))
    ids = _segments([45])[0]
    made = prefill_isolated(model, [ids], [8])[0]
    state, head = model.new_state(), model.new_state()
    with torch.inference_mode():
        model.hidden_states(torch.tensor([ids]), state)
        model.hidden_states(torch.tensor([ids[:8]]), head)
    for i, lin in made.entry.linear.items():
        layer = state.linear(i)
        assert (lin.b - layer.recurrent[0]).abs().max() < 1e-5
        assert (lin.conv_tail - layer.conv[0]).abs().max() < 1e-5
        # The remainder's operator carries the state after the 8 seam tokens to the segment's end.
        after_seam = head.linear(i).recurrent[0]
        remainder = made.remainder.linear[i]
        assert (compose(remainder.p[None], remainder.b[None], after_seam)[0] - lin.b).abs().max() < 1e-5
    for i, att in made.entry.attention.items():
        kv = state.attention(i)
        assert torch.equal(kv.positions, torch.arange(45))
        assert (att.keys - kv.keys[0]).abs().max() < 1e-5
        assert (att.values - kv.values[0]).abs().max() < 1e-5


def _linear_bytes(cached) -> int:
    """What a segment's linear layers keep beside their conv tails: states and operators, or tokens."""
    layers = [*cached.entry.linear.values()]
    if cached.remainder is not None and not cached.remainder.derived:
        layers += cached.remainder.linear.values()
    return sum(t.nbytes for e in layers for name, t in vars(e).items() if name != "conv_tail")


def _logits(model, plan, cached, fused: bool) -> torch.Tensor:
    from hypic_rag.assembly import assemble, assemble_fused

    state = model.new_state()
    if fused:
        return assemble_fused(model, state, plan, cached)[0]
    assemble(model, state, plan, cached)
    with torch.inference_mode():
        return model(torch.tensor([plan.query]), state=state, logits_to_keep=1)[0, -1].float()


@pytest.mark.parametrize("variant", ["A", "B"])
def test_short_segments_keep_their_tokens_and_give_the_dense_entries_logits(checkpoint, variant):
    """Tiny Qwen3.5 (2 key heads, 4 value heads, K = 16, V = 8): a layer kept as its tokens takes 2 * 16 + 4 * 10
    numbers a token against 4 * 16 * 24 dense, so segments under 22 tokens keep their tokens, and every remainder
    is a view of the entry; composed with the factors, they give dense entries' logits, fused and per segment."""
    from hypic_rag import Engine, Segment
    from hypic_rag.cache import CachedSegment, LinearEntry, LinearTokens

    engine = Engine.from_pretrained(checkpoint("qwen3_5_text"), min_cached_tokens=1, seam_variant=variant)
    lengths = [9, 30, 17, 40, 21, 22]
    segs = [Segment(token_ids=ids) for ids in _segments(lengths, seed=4)]
    query = Segment(token_ids=[5, 6, 7], kind="query")
    layout = engine.segment_store.layout
    for seam in (1, 4, 8):
        plan = engine.plan(engine.build_prompt(segs, query), "hypic", seam)
        ids, widths = [list(s.ids) for s in plan.segments], [s.record_remainder for s in plan.segments]
        compact = prefill_isolated(engine.model, ids, widths)
        dense = prefill_isolated(engine.model, ids, widths, compact=False)
        for n, w, c, d in zip(lengths, widths, compact, dense, strict=True):
            form = LinearTokens if n < 22 else LinearEntry
            assert all(type(e) is form for e in c.entry.linear.values())
            assert all(type(e) is LinearEntry for e in d.entry.linear.values())
            layout.check(c.entry)
            assert (c.remainder is None) == (d.remainder is None) == (w == 0)
            if form is LinearTokens:  # its remainder holds no bytes of its own
                assert _linear_bytes(c) < _linear_bytes(d) / (2 if n < 11 else 1)
                assert w == 0 or (c.remainder.derived and c.remainder.seam == w)
            else:
                assert c.nbytes == d.nbytes
        for fused in (True, False):
            got = {}
            for name, made in (("compact", compact), ("dense", dense)):
                pairs = zip(made, plan.segments, strict=True)
                cached = [CachedSegment(m.entry, m.remainder if s.remainder else None) for m, s in pairs]
                got[name] = _logits(engine.model, plan, cached, fused)
            assert float((got["compact"] - got["dense"]).abs().max()) <= 1e-5, (seam, fused)


def test_a_remainder_derived_from_tokens_is_the_stored_remainder(checkpoint):
    """The remainder after ``w`` tokens, taken from the entry's tokens, maps any state as the dense remainder
    the prefill records does, for every seam width."""
    model = load_model(checkpoint("qwen3_5_text"))
    ids = _segments([19])[0]
    gen = torch.Generator().manual_seed(1)
    for w in (1, 3, 8, 18):
        compact = prefill_isolated(model, [ids], [w])[0]
        dense = prefill_isolated(model, [ids], [w], compact=False)[0]
        for i, lin in dense.remainder.linear.items():
            start = torch.randn(lin.b.shape, generator=gen)
            derived = compact.remainder.linear[i].operator()
            assert (derived.apply(start) - (lin.p @ start + lin.b)).abs().max() < 1e-5
            p, b = derived.dense()
            assert (p - lin.p).abs().max() < 1e-5 and (b - lin.b).abs().max() < 1e-5
