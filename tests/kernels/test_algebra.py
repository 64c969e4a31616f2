"""The state algebra against the token recurrence it stands for (HYPIC.md §3), fp32."""

from __future__ import annotations

import pytest
import torch

from hypic_rag.kernels.algebra import compose, rerotate, split_transition, transition
from hypic_rag.kernels.delta_rule import chunk_gated_delta_rule, l2norm, recurrent_gated_delta_rule
from hypic_rag.kernels.rope import apply_rope, rope_cos_sin, rope_inv_freq


def _inputs(t: int, seed: int, h: int = 2, dk: int = 16, dv: int = 8):
    gen = torch.Generator().manual_seed(seed)
    k = l2norm(torch.randn(1, h, t, dk, generator=gen))
    v = torch.randn(1, h, t, dv, generator=gen)
    g = -torch.rand(1, h, t, generator=gen) * 0.3
    beta = torch.rand(1, h, t, generator=gen)
    return k, v, g, beta


@pytest.mark.parametrize("t", [1, 50, 64, 130])
def test_transition_is_affine_in_the_start_state(t):
    k, v, g, beta = _inputs(t, seed=t)
    s0 = torch.randn(1, 2, 16, 8, generator=torch.Generator().manual_seed(99))
    end, p, _, _ = transition(k, v, g, beta)
    _, expected = recurrent_gated_delta_rule(torch.zeros_like(k), k, v, g, beta, s0)
    assert (p @ s0 + end - expected).abs().max() < 1e-5
    started, p_again, _, _ = transition(k, v, g, beta, s0)
    assert (started - expected).abs().max() < 1e-5 and torch.equal(p, p_again)


def test_transition_with_queries_returns_the_ordinary_outputs():
    k, v, g, beta = _inputs(70, seed=3)
    q = l2norm(torch.randn(k.shape, generator=torch.Generator().manual_seed(4))) * 0.25
    _, _, out, q_tilde = transition(k, v, g, beta, q=q)
    expected, _ = chunk_gated_delta_rule(q, k, v, g, beta)
    assert (out - expected).abs().max() < 1e-5
    # The correction vectors move zero-start outputs to any start state.
    s0 = torch.randn(1, 2, 16, 8, generator=torch.Generator().manual_seed(5))
    from_s0, _ = chunk_gated_delta_rule(q, k, v, g, beta, s0)
    assert (out + q_tilde @ s0 - from_s0).abs().max() < 1e-5


@pytest.mark.parametrize("t,split", [(70, 8), (64, 63), (130, 64)])
def test_split_transition_equals_a_whole_pass_and_a_rest_pass(t, split):
    k, v, g, beta = _inputs(t, seed=t + split)
    q = l2norm(torch.randn(k.shape, generator=torch.Generator().manual_seed(6))) * 0.25
    b, p, out, b_rest, p_rest = split_transition(q, k, v, g, beta, split)
    whole_b, whole_p, whole_out, _ = transition(k, v, g, beta, q=q)
    rest = slice(split, None)
    exp_b_rest, exp_p_rest, _, _ = transition(k[:, :, rest], v[:, :, rest], g[:, :, rest], beta[:, :, rest])
    for got, want in ((b, whole_b), (p, whole_p), (out, whole_out), (b_rest, exp_b_rest), (p_rest, exp_p_rest)):
        assert (got - want).abs().max() < 1e-5


def test_composed_segments_equal_one_run_over_their_concatenation():
    parts = [_inputs(t, seed=10 + t) for t in (23, 64, 41)]
    ps, bs = zip(*[transition(*x)[1::-1] for x in parts], strict=True)
    states = compose(torch.stack(ps), torch.stack(bs))
    k, v, g, beta = (torch.cat(xs, dim=2 if xs[0].dim() == 4 else 2) for xs in zip(*parts, strict=True))
    _, whole = recurrent_gated_delta_rule(torch.zeros_like(k), k, v, g, beta)
    assert states.shape[0] == 3
    assert (states[-1] - whole).abs().max() < 1e-5


def test_compose_from_a_start_state():
    p = torch.randn(2, 3, 4, 4) * 0.5
    b = torch.randn(2, 3, 4, 5)
    s0 = torch.randn(3, 4, 5)
    out = compose(p, b, s0)
    assert torch.allclose(out[1], p[1] @ (p[0] @ s0 + b[0]) + b[1], atol=1e-6)


def test_rerotation_moves_keys_to_new_positions():
    inv = rope_inv_freq(8, 10000.0)
    keys = torch.randn(2, 5, 32)
    at = torch.arange(5)
    cos, sin = rope_cos_sin(inv, at)
    moved = rerotate(apply_rope(keys, cos, sin), torch.full((5,), 1000), inv)
    cos2, sin2 = rope_cos_sin(inv, at + 1000)
    assert (moved - apply_rope(keys, cos2, sin2)).abs().max() < 1e-4
    assert torch.equal(moved[..., 8:], keys[..., 8:])  # only the rotary dims move
