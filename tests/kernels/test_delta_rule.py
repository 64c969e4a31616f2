"""The chunked gated delta rule against the token recurrence it must equal."""

from __future__ import annotations

import pytest
import torch

from hypic_rag.kernels.delta_rule import chunk_gated_delta_rule, l2norm, recurrent_gated_delta_rule


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
