"""The state algebra against the token recurrence it stands for (docs/design.md §3), on both backends.

Triton runs under TRITON_INTERPRET=1 on CPU tensors (set in conftest before the kernels load)."""

from __future__ import annotations

import pytest
import torch

from hypic_rag.kernels import algebra
from hypic_rag.kernels.algebra import compose, compose_reference, rerotate, split_transition, transition
from hypic_rag.kernels.backend import HAS_TRITON
from hypic_rag.kernels.delta_rule import chunk_gated_delta_rule, l2norm, recurrent_gated_delta_rule
from hypic_rag.kernels.rope import apply_rope, rope_cos_sin, rope_inv_freq

BACKENDS = ["torch", pytest.param("triton", marks=pytest.mark.skipif(not HAS_TRITON, reason="needs triton"))]


def _inputs(t: int, seed: int, h: int = 2, dk: int = 16, dv: int = 8, dtype=torch.float32):
    """fla layout: k [N, T, H, K], v [N, T, H, V], g and beta [N, T, H]."""
    gen = torch.Generator().manual_seed(seed)
    k = l2norm(torch.randn(1, t, h, dk, generator=gen))
    v = torch.randn(1, t, h, dv, generator=gen)
    g = -torch.rand(1, t, h, generator=gen) * 0.3
    beta = torch.rand(1, t, h, generator=gen)
    return tuple(x.to(dtype) for x in (k, v, g, beta))


def _token_recurrence(k, v, g, beta, s0=None):
    """The documented update, token by token, in the [N, H, T, D] layout the recurrence uses."""
    k_, v_, g_, b_ = (x.transpose(1, 2).float() for x in (k, v, g, beta))
    return recurrent_gated_delta_rule(torch.zeros_like(k_), k_, v_, g_, b_, s0)[1]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("t,chunk", [(1, 16), (50, 16), (64, 64), (130, 64)])
def test_transition_is_affine_in_the_start_state(backend, t, chunk):
    k, v, g, beta = _inputs(t, seed=t)
    s0 = torch.randn(1, 2, 16, 8, generator=torch.Generator().manual_seed(99))
    zero_start = transition(k, v, g, beta, chunk_size=chunk, backend=backend)
    end, p = zero_start.state, zero_start.p
    assert (p @ s0 + end - _token_recurrence(k, v, g, beta, s0)).abs().max() < 1e-5
    started = transition(k, v, g, beta, s0, chunk_size=chunk, backend=backend)
    assert (started.state - _token_recurrence(k, v, g, beta, s0)).abs().max() < 1e-5
    assert (p - started.p).abs().max() < 1e-6
    assert zero_start.out is None and zero_start.q_tilde is None


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("h,dk,dv,t", [(3, 16, 32, 77), (1, 32, 16, 40), (2, 20, 12, 33)])
def test_triton_transition_agrees_with_torch(dtype, h, dk, dv, t):
    k, v, g, beta = _inputs(t, seed=h * t, h=h, dk=dk, dv=dv, dtype=dtype)
    q = (l2norm(torch.randn(1, t, h, dk, generator=torch.Generator().manual_seed(1))) * dk**-0.5).to(dtype)
    s0 = torch.randn(1, h, dk, dv, generator=torch.Generator().manual_seed(2))
    ref = transition(k, v, g, beta, s0, q=q, chunk_size=32, backend="torch")
    tri = transition(k, v, g, beta, s0, q=q, chunk_size=32, backend="triton")
    for field in ("state", "p", "out", "q_tilde"):
        a, b = getattr(ref, field), getattr(tri, field)
        assert a.dtype == b.dtype == torch.float32
        assert (a - b).abs().max() < 1e-4


@pytest.mark.parametrize("backend", BACKENDS)
def test_transition_with_queries_returns_the_ordinary_outputs(backend):
    k, v, g, beta = _inputs(70, seed=3)
    q = l2norm(torch.randn(k.shape, generator=torch.Generator().manual_seed(4))) * 0.25
    result = transition(k, v, g, beta, q=q, chunk_size=32, backend=backend)
    out, q_tilde = result.out, result.q_tilde
    qt, kt, vt, gt, bt = (x.transpose(1, 2) for x in (q, k, v, g, beta))
    expected, _ = chunk_gated_delta_rule(qt, kt, vt, gt, bt)
    assert (out - expected.transpose(1, 2)).abs().max() < 1e-5
    # The correction vectors move zero-start outputs to any start state.
    s0 = torch.randn(1, 2, 16, 8, generator=torch.Generator().manual_seed(5))
    from_s0, _ = chunk_gated_delta_rule(qt, kt, vt, gt, bt, s0)
    moved = out + torch.einsum("nthk,nhkv->nthv", q_tilde, s0)
    assert (moved - from_s0.transpose(1, 2)).abs().max() < 1e-5


def _split_case(t: int, seed: int, rows: int = 1):
    parts = [_inputs(t, seed=seed + r) for r in range(rows)]
    k, v, g, beta = (torch.cat(xs) for xs in zip(*parts, strict=True))
    q = l2norm(torch.randn(k.shape, generator=torch.Generator().manual_seed(6))) * 0.25
    return q, k, v, g, beta


@pytest.mark.parametrize("t,split", [(70, 8), (64, 63), (130, 64)])
def test_split_transition_equals_a_whole_pass_and_a_rest_pass(t, split):
    q, k, v, g, beta = _split_case(t, seed=t + split)
    got = split_transition(q, k, v, g, beta, torch.tensor([split]))
    whole = transition(k, v, g, beta, q=q)
    rest = transition(k[:, split:], v[:, split:], g[:, split:], beta[:, split:])
    pairs = ((got.state, whole.state), (got.p, whole.p), (got.out, whole.out))
    for a, b in (*pairs, (got.rest_state, rest.state), (got.rest_p, rest.p)):
        assert (a - b).abs().max() < 1e-5


def test_split_transition_rows_split_at_their_own_columns():
    """One masked path serves a batch whose rows split at different columns, at none (T) or at 0."""
    t, splits = 50, [8, 31, 50, 0]
    q, k, v, g, beta = _split_case(t, seed=3, rows=len(splits))
    got = split_transition(q, k, v, g, beta, torch.tensor(splits))
    for r, s in enumerate(splits):
        row = (x[r : r + 1] for x in (q, k, v, g, beta))
        qr, kr, vr, gr, br = row
        whole = transition(kr, vr, gr, br, q=qr)
        assert (got.state[r] - whole.state[0]).abs().max() < 1e-5
        assert (got.p[r] - whole.p[0]).abs().max() < 1e-5
        assert (got.out[r] - whole.out[0]).abs().max() < 1e-5
        if s < t:
            rest = transition(kr[:, s:], vr[:, s:], gr[:, s:], br[:, s:])
            assert (got.rest_state[r] - rest.state[0]).abs().max() < 1e-5
            assert (got.rest_p[r] - rest.p[0]).abs().max() < 1e-5
        else:  # no remainder: identity operator, zero state
            assert torch.equal(got.rest_state[r], torch.zeros_like(got.rest_state[r]))
            assert (got.rest_p[r] - torch.eye(16)).abs().max() < 1e-6


def test_split_transition_without_any_remainder_is_the_whole_pass():
    q, k, v, g, beta = _split_case(40, seed=9, rows=2)
    got = split_transition(q, k, v, g, beta, torch.tensor([40, 40]))
    whole = transition(k, v, g, beta, q=q)
    assert got.rest_state is None and got.rest_p is None
    assert torch.equal(got.state, whole.state) and torch.equal(got.out, whole.out)
    with pytest.raises(ValueError, match="rest_start must lie in"):
        split_transition(q, k, v, g, beta, torch.tensor([41, 3]))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("t", [1, 7, 8, 16, 33, 64, 100])
def test_the_fitted_chunk_gives_what_chunk_64_gives(backend, t):
    """``chunk_size`` None fits the chunk to the segment (16 for up to 16 tokens); nothing else changes."""
    k, v, g, beta = _inputs(t, seed=t)
    q = l2norm(torch.randn(k.shape, generator=torch.Generator().manual_seed(t))) * 0.25
    s0 = torch.randn(1, 2, 16, 8, generator=torch.Generator().manual_seed(7))
    fitted = transition(k, v, g, beta, s0, q=q, backend=backend)
    full = transition(k, v, g, beta, s0, q=q, chunk_size=64, backend=backend)
    for field in ("state", "p", "out", "q_tilde"):
        assert (getattr(fitted, field) - getattr(full, field)).abs().max() <= 1e-5


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("t,chunk", [(8, None), (77, 32)])
def test_outputs_for_the_value_columns_only(backend, t, chunk):
    """``q_tilde=False`` skips the identity columns' outputs; the value columns' equal the full computation's."""
    k, v, g, beta = _inputs(t, seed=5)
    q = l2norm(torch.randn(k.shape, generator=torch.Generator().manual_seed(8))) * 0.25
    s0 = torch.randn(1, 2, 16, 8, generator=torch.Generator().manual_seed(9))
    full = transition(k, v, g, beta, s0, q=q, chunk_size=chunk, backend=backend)
    values = transition(k, v, g, beta, s0, q=q, q_tilde=False, chunk_size=chunk, backend=backend)
    assert values.q_tilde is None and values.out.shape == v.shape
    for field in ("state", "p", "out"):
        assert (getattr(values, field) - getattr(full, field)).abs().max() <= 1e-6
    reference = transition(k, v, g, beta, s0, q=q, chunk_size=chunk, backend="torch")
    assert (values.out - reference.out).abs().max() < 1e-5


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rest_from_zero", [0, 100])
@pytest.mark.parametrize("splits", [[8, 8], [8, 31, 100, 0], [70, 90]])
def test_split_transition_on_both_backends(backend, rest_from_zero, splits, monkeypatch):
    """Each row against its own whole pass and rest pass, with the rest pass starting at the earliest
    split (the two passes' outputs concatenated) or at column 0 (the head's outputs written over it)."""
    monkeypatch.setattr(algebra, "REST_FROM_ZERO", rest_from_zero)
    t = 100
    q, k, v, g, beta = _split_case(t, seed=11, rows=len(splits))
    got = split_transition(q, k, v, g, beta, torch.tensor(splits), backend=backend)
    for r, s in enumerate(splits):
        qr, kr, vr, gr, br = (x[r : r + 1] for x in (q, k, v, g, beta))
        whole = transition(kr, vr, gr, br, q=qr, backend="torch")
        for a, b in ((got.state, whole.state), (got.p, whole.p), (got.out, whole.out)):
            assert (a[r] - b[0]).abs().max() < 1e-5
        if s < t:
            rest = transition(kr[:, s:], vr[:, s:], gr[:, s:], br[:, s:], backend="torch")
            assert (got.rest_state[r] - rest.state[0]).abs().max() < 1e-5
            assert (got.rest_p[r] - rest.p[0]).abs().max() < 1e-5
        else:
            assert torch.equal(got.rest_state[r], torch.zeros_like(got.rest_state[r]))
            assert (got.rest_p[r] - torch.eye(16)).abs().max() < 1e-6


@pytest.mark.parametrize("backend", BACKENDS)
def test_composed_segments_equal_one_run_over_their_concatenation(backend):
    parts = [_inputs(t, seed=10 + t) for t in (23, 64, 41)]
    results = [transition(*x, backend=backend) for x in parts]
    ends, ps = [r.state for r in results], [r.p for r in results]
    states = compose(torch.cat(ps), torch.cat(ends), backend=backend)
    whole = _token_recurrence(*(torch.cat(xs, dim=1) for xs in zip(*parts, strict=True)))
    assert states.shape == (3, 2, 16, 8)
    assert (states[-1] - whole[0]).abs().max() < 1e-5


@pytest.mark.parametrize("backend", BACKENDS)
def test_compose_from_a_start_state(backend):
    gen = torch.Generator().manual_seed(0)
    p = torch.randn(3, 2, 20, 20, generator=gen) * 0.3
    b = torch.randn(3, 2, 20, 12, generator=gen)
    s0 = torch.randn(2, 20, 12, generator=gen)
    out = compose(p, b, s0, backend=backend)
    assert torch.allclose(out[1], p[1] @ (p[0] @ s0 + b[0]) + b[1], atol=1e-5)
    assert (out - compose_reference(p, b, s0)).abs().max() < 1e-5


def test_bad_shapes_and_backends():
    k, v, g, beta = _inputs(10, seed=0)
    with pytest.raises(ValueError, match=r"g and beta must be \[N, T, H\]"):
        transition(k, v, g[:, :5], beta)
    with pytest.raises(ValueError, match="initial_state must be"):
        transition(k, v, g, beta, torch.zeros(1, 2, 16, 16))
    with pytest.raises(ValueError, match="unknown backend 'cuda'"):
        transition(k, v, g, beta, backend="cuda")
    with pytest.raises(ValueError, match=r"P must be \[S, H, K, K\]"):
        compose(torch.zeros(2, 3, 4, 5), torch.zeros(2, 3, 4, 5))


def test_rerotation_moves_keys_to_new_positions():
    inv = rope_inv_freq(8, 10000.0)
    keys = torch.randn(2, 5, 32)
    at = torch.arange(5)
    cos, sin = rope_cos_sin(inv, at)
    moved = rerotate(apply_rope(keys, cos, sin), torch.full((5,), 1000), inv)
    cos2, sin2 = rope_cos_sin(inv, at + 1000)
    assert (moved - apply_rope(keys, cos2, sin2)).abs().max() < 1e-4
    assert torch.equal(moved[..., 8:], keys[..., 8:])  # only the rotary dims move


def _kept(k, v, g, beta) -> algebra.DeltaTokens:
    """The fla-layout inputs of one sequence as a segment kept as its tokens (``[H, L, ...]``)."""
    return algebra.DeltaTokens(*(x[0].transpose(0, 1) for x in (k, v, g, beta)))


@pytest.mark.parametrize("t", [1, 5, 16, 40, 130])
def test_a_segment_kept_as_its_tokens_maps_a_state_as_its_dense_operator_does(t):
    k, v, g, beta = _inputs(t, seed=3 * t, h=2, dk=64, dv=8)
    g = g * 20  # long decays too: every exponent the form takes stays <= 0
    dense = transition(k, v, g, beta, backend="torch")
    kept = _kept(k, v, g, beta)
    s = torch.randn(2, 64, 8, generator=torch.Generator().manual_seed(t))
    assert (kept.apply(s) - (dense.p[0] @ s + dense.state[0])).abs().max() < 1e-5
    assert (kept.apply(s) - _token_recurrence(k, v, g, beta, s[None])[0]).abs().max() < 1e-5
    assert (kept.apply(None) - dense.state[0]).abs().max() < 1e-5
    p, b = kept.dense()
    assert (p - dense.p[0]).abs().max() < 1e-5 and (b - dense.state[0]).abs().max() < 1e-5


@pytest.mark.parametrize("w", [1, 8, 39])
def test_the_suffix_of_a_segments_tokens_is_its_remainder(w):
    k, v, g, beta = _inputs(40, seed=w, h=2, dk=32, dv=8)
    split = split_transition(torch.zeros_like(k), k, v, g, beta, torch.tensor([w]))
    rest = _kept(k, v, g, beta).suffix(w)
    assert len(rest) == 40 - w
    p, b = rest.dense()
    assert (p - split.rest_p[0]).abs().max() < 1e-5 and (b - split.rest_state[0]).abs().max() < 1e-5
