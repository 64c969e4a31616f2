"""The chunked gated delta rule against the token recurrence it must equal."""

from __future__ import annotations

import pytest
import torch

from hypic_rag.kernels.delta_rule import (
    chunk_gated_delta_rule,
    chunk_gated_transition,
    chunk_size_for,
    l2norm,
    recurrent_gated_delta_rule,
)


def _inputs(t: int, h: int = 3, dk: int = 16, dv: int = 8, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = l2norm(torch.randn(2, h, t, dk, generator=gen)) * dk**-0.5
    k = l2norm(torch.randn(2, h, t, dk, generator=gen))
    v = torch.randn(2, h, t, dv, generator=gen)
    g = -torch.rand(2, h, t, generator=gen) * 0.5
    beta = torch.rand(2, h, t, generator=gen)
    s0 = torch.randn(2, h, dk, dv, generator=gen)
    return q, k, v, g, beta, s0


@pytest.mark.parametrize("t,chunk", [(1, 64), (37, 16), (100, 32), (128, 64)])
def test_chunked_equals_recurrence(t, chunk):
    q, k, v, g, beta, s0 = _inputs(t)
    out_c, s_c = chunk_gated_delta_rule(q, k, v, g, beta, s0, chunk_size=chunk)
    out_r, s_r = recurrent_gated_delta_rule(q, k, v, g, beta, s0)
    assert (out_c - out_r).abs().max() < 1e-5
    assert (s_c - s_r).abs().max() < 1e-5


def test_recurrence_is_the_documented_update():
    """S_t = exp(g_t)(I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T and o_t = S_t^T q_t, written out."""
    q, k, v, g, beta, s0 = _inputs(5, h=1)
    out, state = recurrent_gated_delta_rule(q, k, v, g, beta, s0)
    s = s0[:, 0].double()
    eye = torch.eye(k.shape[-1], dtype=torch.double)
    for t in range(5):
        kt, vt, bt = k[:, 0, t].double(), v[:, 0, t].double(), beta[:, 0, t].double()
        a = torch.exp(g[:, 0, t].double())[:, None, None] * (eye - bt[:, None, None] * kt[:, :, None] * kt[:, None, :])
        s = a @ s + bt[:, None, None] * kt[:, :, None] * vt[:, None, :]
        o_t = (s.transpose(-1, -2) @ q[:, 0, t].double()[..., None])[..., 0]
        assert (out[:, 0, t].double() - o_t).abs().max() < 1e-5
    assert (state[:, 0].double() - s).abs().max() < 1e-5


@pytest.mark.parametrize("t", [1, 4])
def test_the_recurrence_writes_the_initial_state_only_when_told(t):
    """A decode batch's scratch state is updated in place, with the result of the out-of-place update; any
    other caller's state is left as it was handed in."""
    q, k, v, g, beta, s0 = _inputs(t)
    kept = s0.clone()
    out, state = recurrent_gated_delta_rule(q, k, v, g, beta, s0)
    assert torch.equal(s0, kept) and state.data_ptr() != s0.data_ptr()
    scratch = s0.clone()
    out_w, state_w = recurrent_gated_delta_rule(q, k, v, g, beta, scratch, overwrite=True)
    assert state_w.data_ptr() == scratch.data_ptr()
    assert torch.equal(out_w, out) and torch.equal(state_w, state)


def test_the_chunk_fits_the_piece():
    """min(64, T) rounded up to a multiple of 16; an explicit chunk is kept."""
    lengths = (0, 1, 7, 8, 16, 17, 33, 48, 49, 64, 100, 4096)
    assert [chunk_size_for(t) for t in lengths] == [16, 16, 16, 16, 16, 32, 48, 48, 64, 64, 64, 64]
    assert chunk_size_for(8, 64) == 64 and chunk_size_for(100, 32) == 32


@pytest.mark.parametrize("t", [1, 7, 8, 16, 33, 64, 100])
def test_the_fitted_chunk_gives_what_chunk_64_gives(t):
    q, k, v, g, beta, s0 = _inputs(t, seed=t)
    out, state = chunk_gated_delta_rule(q, k, v, g, beta, s0)
    out_64, state_64 = chunk_gated_delta_rule(q, k, v, g, beta, s0, chunk_size=64)
    assert (out - out_64).abs().max() <= 1e-5
    assert (state - state_64).abs().max() <= 1e-5


@pytest.mark.parametrize("t,chunk", [(1, None), (8, None), (50, 16), (100, None)])
def test_transition_outputs_only_for_the_columns_asked(t, chunk):
    """The augmented pass ([v | 0] from [S0 | I]) computes the value columns' outputs alone unless the
    operator columns' (q_tilde) are asked for; what it computes equals the full computation's."""
    q, k, v, g, beta, s0 = _inputs(t, seed=t + 1)
    full_out, full_state, full_p, full_q_tilde = chunk_gated_transition(q, k, v, g, beta, s0, chunk)
    out, state, p, q_tilde = chunk_gated_transition(q, k, v, g, beta, s0, chunk, q_tilde=False)
    assert q_tilde is None and out.shape == full_out.shape == v.shape
    assert (out - full_out).abs().max() <= 1e-6
    bare_out, bare_state, bare_p, _ = chunk_gated_transition(None, k, v, g, beta, s0, chunk)
    assert bare_out is None
    for a in (state, bare_state):
        assert (a - full_state).abs().max() <= 1e-6
    for a in (p, bare_p):
        assert (a - full_p).abs().max() <= 1e-6
    # Against the token recurrence: the value columns are the delta rule's, the operator columns the
    # delta rule's on zero values from the identity.
    out_r, state_r = recurrent_gated_delta_rule(q, k, v, g, beta, s0)
    eye = torch.eye(k.shape[-1]).expand(*k.shape[:2], -1, -1)
    q_tilde_r, p_r = recurrent_gated_delta_rule(q, k, torch.zeros_like(k), g, beta, eye)
    for a, b in ((full_out, out_r), (full_state, state_r), (full_q_tilde, q_tilde_r), (full_p, p_r)):
        assert (a - b).abs().max() < 1e-5


def test_recurrence_keeps_the_callers_state_and_its_gradients():
    q, k, v, g, beta, s0 = _inputs(4)
    permuted = s0.permute(1, 0, 2, 3).contiguous().permute(1, 0, 2, 3)  # same values, heads-major strides
    kept = permuted.clone()
    out, state = recurrent_gated_delta_rule(q, k, v, g, beta, permuted)
    assert torch.equal(permuted, kept)
    torch.testing.assert_close(out, recurrent_gated_delta_rule(q, k, v, g, beta, s0)[0], rtol=0, atol=1e-6)
    leaves = [x.clone().requires_grad_() for x in (q, k, v, s0)]
    out, state = recurrent_gated_delta_rule(leaves[0], leaves[1], leaves[2], g, beta, leaves[3])
    (out.square().sum() + state.sum()).backward()
    assert all(x.grad is not None and torch.isfinite(x.grad).all() for x in leaves)
