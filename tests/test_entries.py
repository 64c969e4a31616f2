"""Segment-parallel prefill (``hypic_rag.entries``): one left-padded batch must equal each segment
prefilled alone, and an entry must hold what the model's own request state holds."""

from __future__ import annotations

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
            for name in ("b", "p", "conv_tail"):
                x, y = getattr(a.entry.linear[i], name), getattr(b.entry.linear[i], name)
                assert (x - y).abs().max() < 1e-5, name
        assert (a.remainder is None) == (b.remainder is None)
        if a.remainder is not None:
            assert a.remainder.seam == b.remainder.seam == 8
            for i in a.remainder.linear:
                for name in ("b", "p"):
                    x, y = getattr(a.remainder.linear[i], name), getattr(b.remainder.linear[i], name)
                    assert (x - y).abs().max() < 1e-5, name
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


def test_wy_entries_give_the_dense_entries_logits_in_fewer_bytes(tmp_path):
    from hypic_rag import Engine, Segment
    from hypic_rag.assembly import assemble_fused
    from hypic_rag.cache import CachedSegment
    from hypic_rag.testing.synthetic import build_checkpoint

    path = build_checkpoint("qwen3_5_text", tmp_path, {"linear_key_head_dim": 64, "linear_value_head_dim": 32})
    engine = Engine.from_pretrained(path, min_cached_tokens=1, seam=4)
    segs = [Segment(token_ids=ids) for ids in _segments([9, 30, 17, 40], seed=4)]  # 40: dense (2 L + 1 >= 64)
    plan = engine.plan(engine.build_prompt(segs, Segment(token_ids=[5, 6, 7], kind="query")), "hypic")
    ids, widths = [list(s.ids) for s in plan.segments], [s.record_remainder for s in plan.segments]
    logits, held = {}, {}
    for wy in (True, False):
        made = prefill_isolated(engine.model, ids, widths, wy=wy)
        pairs = zip(made, plan.segments, strict=True)
        cached = [CachedSegment(m.entry, m.remainder if s.remainder else None) for m, s in pairs]
        logits[wy] = assemble_fused(engine.model, engine.model.new_state(), plan, cached)[0]
        held[wy] = [m.nbytes for m in made]
        shapes = [(m.entry.linear[0].p.shape[-1], tuple(m.entry.linear[0].b.shape)) for m in made]
        dense_b = (4, 64, 32)  # [H, K, V]; under 22 tokens the two factors [H, K + V, L] are smaller
        packed = [(19, (4, 96, 9)), (61, dense_b), (35, (4, 96, 17)), (64, dense_b)]
        assert shapes == (packed if wy else [(64, dense_b)] * 4)
        for m in made:
            engine.segment_store.layout.check(m.entry)  # a packed operator fits the layout
            if m.remainder is not None:
                engine.segment_store.layout.check(m.remainder)
    assert float((logits[True] - logits[False]).abs().max()) <= 1e-5
    assert held[True][0] < held[False][0] / 2 and held[True][3] == held[False][3]
