"""The fused path (one forward per request) against the per-segment reference path (a forward per
stretch and seam, then the query): equal logits up to rounding, in every shape of request."""

from __future__ import annotations

import pytest
import torch

from hypic_rag import Engine, Segment
from hypic_rag.testing.parity import rounding_bound

KINDS = [
    "qwen3_next",
    "qwen3_5_text",
    "nemotron_h_moe",
    "granitemoehybrid",
    "lfm2",
    "minimax",
    "kimi_linear",
    "olmo_hybrid",
    "falcon_h1",
    "bailing_moe_linear",
    "jamba",
    "bailing_hybrid",
]
TOL = 1e-5


def _segments(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [Segment(token_ids=torch.randint(3, 320, (n,), generator=gen).tolist()) for n in lengths]


def _query(n: int = 9, seed: int = 50) -> Segment:
    ids = torch.randint(3, 320, (n,), generator=torch.Generator().manual_seed(seed)).tolist()
    return Segment(token_ids=ids, kind="query")


def _pair(path, **options) -> tuple[Engine, Engine]:
    options = {"min_cached_tokens": 0, **options}
    return Engine.from_pretrained(path, **options), Engine.from_pretrained(path, fuse_forwards=False, **options)


def _both(fused: Engine, reference: Engine, segs, q, **kw) -> tuple[torch.Tensor, torch.Tensor, dict, dict]:
    a = fused.generate(segs, q, max_new_tokens=1, **kw)
    b = reference.generate(segs, q, max_new_tokens=1, **kw)
    return a.prompt_logits, b.prompt_logits, a.stats, b.stats


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("variant", ["A", "B"])
@pytest.mark.parametrize("count", [1, 2, 8, 33])
def test_fused_equals_per_segment_warm_and_reordered(checkpoint, kind, variant, count):
    fused, reference = _pair(checkpoint(kind), seam_variant=variant)
    lengths = [9 + (7 * i) % 23 for i in range(count)]
    segs, q = _segments(lengths, seed=count), _query()
    for engine in (fused, reference):
        engine.generate(segs[::-1], q, max_new_tokens=1)  # warm, in another order
    # The two paths run the same operations in other groupings: TOL, or this CPU's measured fp32 rounding on the
    # same prompt where its kernels round more (an AVX-512 machine's blocking differs by the rows it is given).
    prompt = torch.tensor([[t for s in (*segs, q) for t in s.token_ids]])
    bound = rounding_bound(fused.model, prompt)
    for seam in (0, 1, 3, 8):
        a, b, sa, sb = _both(fused, reference, segs, q, seam=seam)
        assert (a - b).abs().max() < max(TOL, bound), (seam, float((a - b).abs().max()))
        assert sa == sb
    # A whole seam recomputes everything: the fused forward is then `full`'s one forward, and the
    # reference path a split prefill (stretch, then query), bounded as the model tests bound one.
    a, b, sa, sb = _both(fused, reference, segs, q, seam=1.0)
    full = fused.prompt_logits(segs, q, mode="full")
    assert (a - full).abs().max() < max(TOL, bound) and sa == sb
    assert (b - full).abs().max() <= bound


@pytest.mark.parametrize("kind", KINDS)
def test_the_state_a_fused_forward_marks_is_the_one_the_reference_path_keeps(checkpoint, kind):
    """A composed request keeps the state where its query begins, recorded inside its one forward: a later
    request over the same segments restores it and answers as from the per-segment path's kept state."""
    fused, reference = _pair(checkpoint(kind))
    segs = _segments([30, 25, 40], seed=11)
    for engine in (fused, reference):
        engine.generate(segs[::-1], _query(), max_new_tokens=1)  # an entry for every segment
        engine.generate(segs, _query(), max_new_tokens=1, seam=8)  # composed: keeps where its query begins
    a, b, sa, sb = _both(fused, reference, segs, _query(seed=5), seam=8)
    assert sa["prefix_tokens"] == sb["prefix_tokens"] == 95
    assert (a - b).abs().max() < TOL


@pytest.mark.parametrize("kind", ["qwen3_5_text", "nemotron_h"])
@pytest.mark.parametrize("variant", ["A", "B"])
def test_fused_with_misses_and_in_context_stretches_between_cached_segments(checkpoint, kind, variant):
    """Cached segments, misses filled cold, and segments too short to cache (run in context) mixed."""
    fused, reference = _pair(checkpoint(kind), seam_variant=variant, min_cached_tokens=12)
    segs = _segments([30, 5, 4, 25, 40, 3, 18], seed=7)
    q = _query()
    for engine in (fused, reference):
        engine.generate([segs[0], segs[4]], q, max_new_tokens=1)  # two of them cached beforehand
    a, b, sa, sb = _both(fused, reference, segs, q, seam=8)
    assert (a - b).abs().max() < TOL
    assert sa == sb and sa["hit_segments"] == 2
    # The exact cold policy runs its misses in context: in the fused forward too.
    fused.cold_policy = reference.cold_policy = "exact"
    a, b, _, _ = _both(fused, reference, _segments([22, 31, 6], seed=8), q, seam=4)
    assert (a - b).abs().max() < TOL


@pytest.mark.parametrize("kind", ["qwen3_next", "nemotron_h"])
def test_fused_state_continues_decoding_as_the_reference_does(checkpoint, kind):
    fused, reference = _pair(checkpoint(kind))
    segs, q = _segments([40, 52, 36], seed=5), _query()
    for engine in (fused, reference):
        engine.generate(segs[::-1], q, max_new_tokens=1)
    a = fused.generate(segs, q, max_new_tokens=12)
    b = reference.generate(segs, q, max_new_tokens=12)
    assert a.token_ids == b.token_ids
    _, state_a = fused.prefill(segs, q)
    _, state_b = reference.prefill(segs, q)
    assert state_a.seq_len == state_b.seq_len
    for i in state_a.attention_layer_ids:
        ka, kb = state_a.attention(i), state_b.attention(i)
        order_a, order_b = ka.positions.argsort(), kb.positions.argsort()
        assert torch.equal(ka.positions[order_a], kb.positions[order_b])
        # Cached keys were rotated once, on placement: the fused state owes no rotation.
        assert not ka.shift.any() and kb.shift.any()
    for i in state_a.linear_layer_ids:
        assert (state_a.linear(i).recurrent - state_b.linear(i).recurrent).abs().max() < TOL
        assert (state_a.linear(i).conv - state_b.linear(i).conv).abs().max() < TOL


def test_the_fused_path_is_one_forward(checkpoint, monkeypatch):
    fused, _ = _pair(checkpoint("qwen3_5_text"))
    segs, q = _segments([20, 20, 20, 20], seed=9), _query()
    fused.generate(segs[::-1], q, max_new_tokens=1)
    calls = []
    inner = fused.model.hidden_states

    def counted(ids, *args, **kwargs):
        calls.append(ids.shape[1])
        return inner(ids, *args, **kwargs)

    monkeypatch.setattr(fused.model, "hidden_states", counted)
    out = fused.generate(segs, q, max_new_tokens=1, seam=8)
    # the seams and the query together, the forward recording the state where the query begins (kept for a later
    # prompt that begins there)
    assert calls == [3 * 8 + len(q.token_ids)] and out.stats["recomputed_tokens"] == sum(calls)
    calls[:] = []
    again = fused.generate(segs, _query(seed=5), max_new_tokens=1, seam=8)
    assert again.stats["prefix_tokens"] == 4 * 20 and calls == [again.stats["recomputed_tokens"]]
    fused.keep_states, calls[:] = False, []
    out = fused.generate(segs[1:] + segs[:1], q, max_new_tokens=1, seam=8)
    assert calls == [3 * 8 + len(q.token_ids)] and out.stats["recomputed_tokens"] == calls[0]
