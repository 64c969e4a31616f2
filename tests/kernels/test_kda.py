"""KDA's chunked scan and its dense operators against the token-by-token recurrence."""

from __future__ import annotations

import pytest
import torch

from hypic_rag.kernels.algebra import DENSE, apply_operator, kda_split_transition
from hypic_rag.kernels.backend import HAS_TRITON
from hypic_rag.kernels.kda import kda_recurrent, kda_scan

H, K, V = 3, 8, 5


def _inputs(n: int, t: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(n, t, H, K, generator=g)
    k = torch.nn.functional.normalize(torch.randn(n, t, H, K, generator=g), dim=-1)
    v = torch.randn(n, t, H, V, generator=g)
    decay = -torch.rand(n, t, H, K, generator=g) * 2  # per key channel
    beta = torch.rand(n, t, H, generator=g)
    return q, k, v, decay, beta


@pytest.mark.parametrize("t,chunk", [(1, 32), (9, 4), (32, 32), (77, 16), (100, 64)])
def test_chunked_scan_equals_recurrence(t, chunk):
    q, k, v, g, beta = _inputs(2, t)
    s0 = torch.randn(2, H, K, V, generator=torch.Generator().manual_seed(7))
    for start in (None, s0):
        out, state = kda_scan(q, k, v, g, beta, start, chunk_size=chunk)
        out_ref, state_ref = kda_recurrent(q, k, v, g, beta, start)
        assert (out - out_ref).abs().max() < 1e-5 and (state - state_ref).abs().max() < 1e-5


def test_strong_decays_do_not_overflow():
    """Decay gaps are formed pairwise: exp(+sum g) never appears, even at -30 per token."""
    q, k, v, g, beta = _inputs(1, 64)
    out, state = kda_scan(q, k, v, g * 15, beta, chunk_size=64)
    out_ref, _ = kda_recurrent(q, k, v, g * 15, beta)
    assert torch.isfinite(out).all() and (out - out_ref).abs().max() < 5e-5


def test_dense_operators_move_segments_and_remainders_to_any_start():
    q, k, v, g, beta = _inputs(3, 24)
    rest_start = torch.tensor([6, 24, 0])
    split = kda_split_transition(q, k, v, g, beta, rest_start)
    assert split.p.shape == (3, H, K, K)
    s0 = torch.randn(H, K, V, generator=torch.Generator().manual_seed(3))
    for r, cut in enumerate(rest_start.tolist()):
        _, whole = kda_recurrent(q[r : r + 1], k[r : r + 1], v[r : r + 1], g[r : r + 1], beta[r : r + 1], s0[None])
        assert (apply_operator(DENSE, split.p[r], s0, split.state[r]) - whole[0]).abs().max() < 1e-5
        sl = slice(cut, None)
        _, rest = kda_recurrent(q[r : r + 1, sl], k[r : r + 1, sl], v[r : r + 1, sl], g[r : r + 1, sl],
                                beta[r : r + 1, sl], s0[None])  # fmt: skip
        assert (apply_operator(DENSE, split.rest_p[r], s0, split.rest_state[r]) - rest[0]).abs().max() < 1e-5
    out_ref, _ = kda_recurrent(q, k, v, g, beta)
    assert (split.out - out_ref).abs().max() < 1e-5


TRITON = pytest.mark.skipif(not HAS_TRITON, reason="needs triton")


@TRITON
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("n,t,h,dk,dv", [(2, 37, 2, 16, 8), (1, 16, 1, 20, 12), (1, 5, 3, 16, 16)])
def test_triton_kda_agrees_with_torch(dtype, n, t, h, dk, dv):
    """Under TRITON_INTERPRET=1 (conftest); inputs in ``dtype``, arithmetic in fp32 after loading."""
    g = torch.Generator().manual_seed(t)
    q = torch.randn(n, t, h, dk, generator=g).to(dtype)
    k = torch.nn.functional.normalize(torch.randn(n, t, h, dk, generator=g), dim=-1).to(dtype)
    v = torch.randn(n, t, h, dv, generator=g).to(dtype)
    decay = (-torch.rand(n, t, h, dk, generator=g) * 2).to(dtype)
    beta = torch.rand(n, t, h, generator=g).to(dtype)
    s0 = torch.randn(n, h, dk, dv, generator=g)
    for start in (None, s0):
        ref = kda_scan(q, k, v, decay, beta, start, backend="torch")
        tri = kda_scan(q, k, v, decay, beta, start, backend="triton")
        for a, b in zip(ref, tri, strict=True):
            assert b.dtype == torch.float32 and (a - b).abs().max() < 1e-5


def test_kda_scan_refuses_mismatched_shapes():
    q, k, v, g, beta = _inputs(1, 8)
    with pytest.raises(ValueError, match="must be"):
        kda_scan(q, k, v, g[..., :4], beta)
    with pytest.raises(ValueError, match="initial_state"):
        kda_scan(q, k, v, g, beta, torch.zeros(1, H, K, K))
