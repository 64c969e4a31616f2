"""Mamba2's scan and its scalar operators, Mamba1's selective scan and its diagonal ones, against the
token-by-token recurrences, and the operator forms."""

from __future__ import annotations

import pytest
import torch

from hypic_rag.kernels.algebra import (
    DENSE,
    DIAGONAL,
    NONE,
    SCALAR,
    apply_operator,
    compose_forms,
    operator_shape,
    selective_split_transition,
    ssd_split_transition,
    transition,
)
from hypic_rag.kernels.selective_scan import selective_scan
from hypic_rag.kernels.ssd import ssd_recurrent, ssd_scan

H, P, NS = 3, 4, 5


def _inputs(n: int, t: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, t, H, P, generator=g)
    dt = torch.rand(n, t, H, generator=g) * 0.2 + 0.01
    a = -torch.rand(H, generator=g) * 2 - 0.1
    b = torch.randn(n, t, H, NS, generator=g)
    c = torch.randn(n, t, H, NS, generator=g)
    return x, dt, a, b, c


@pytest.mark.parametrize("t,chunk", [(1, 64), (7, 4), (64, 64), (100, 32), (130, 64)])
def test_chunked_scan_equals_recurrence(t, chunk):
    x, dt, a, b, c = _inputs(2, t)
    s0 = torch.randn(2, H, P, NS, generator=torch.Generator().manual_seed(9))
    for start in (None, s0):
        y, s = ssd_scan(x, dt, a, b, c, start, chunk_size=chunk)
        y_ref, s_ref = ssd_recurrent(x, dt, a, b, c, start)
        assert (y - y_ref).abs().max() < 1e-5
        assert (s - s_ref).abs().max() < 1e-5


def test_scalar_operator_moves_a_segment_to_any_start():
    """docs/design.md §3 with P = p I: the state from S0 is p S0 + B, B the zero-start end state."""
    x, dt, a, b, c = _inputs(2, 40)
    split = ssd_split_transition(x, dt, a, b, c, torch.tensor([40, 40]))
    assert split.p.shape == (2, H) and split.rest_p is None
    s0 = torch.randn(2, H, P, NS, generator=torch.Generator().manual_seed(3))
    _, s_ref = ssd_recurrent(x, dt, a, b, c, s0)
    for r in range(2):
        moved = apply_operator(SCALAR, split.p[r], s0[r], split.state[r])
        assert (moved - s_ref[r]).abs().max() < 1e-5


def test_remainder_operator_is_the_recurrence_after_the_split():
    x, dt, a, b, c = _inputs(3, 30)
    rest_start = torch.tensor([5, 30, 0])
    split = ssd_split_transition(x, dt, a, b, c, rest_start)
    s_mid = torch.randn(H, P, NS, generator=torch.Generator().manual_seed(4))
    for r, k in enumerate(rest_start.tolist()):
        _, want = ssd_recurrent(x[r : r + 1, k:], dt[r : r + 1, k:], a, b[r : r + 1, k:], c[r : r + 1, k:], s_mid[None])
        got = apply_operator(SCALAR, split.rest_p[r], s_mid, split.rest_state[r])
        assert (got - want[0]).abs().max() < 1e-5, r
    assert torch.allclose(split.rest_p[1], torch.ones(H)) and split.rest_state[1].abs().max() == 0


def test_every_form_equals_its_token_recurrence():
    """Each form's P and B, applied to a start state, equal the recurrence run from it."""
    g = torch.Generator().manual_seed(5)
    t, k, v = 12, 4, 3
    s0 = torch.randn(H, k, v, generator=g)
    keys, vals = torch.randn(t, H, k, generator=g), torch.randn(t, H, v, generator=g)
    # diagonal: a per-channel decay without a delta rule, S_t = diag(alpha_t) S + k_t v_t^T
    alpha = torch.rand(t, H, k, generator=g) * 0.5 + 0.5
    state, p, b = s0.clone(), torch.ones(H, k), torch.zeros(H, k, v)
    for i in range(t):
        step = keys[i][..., None] * vals[i][:, None, :]
        state, p, b = alpha[i][..., None] * state + step, alpha[i] * p, alpha[i][..., None] * b + step
    assert p.shape == operator_shape(DIAGONAL, tuple(s0.shape))
    assert (apply_operator(DIAGONAL, p, s0, b) - state).abs().max() < 1e-5
    # dense: the gated delta rule's transition
    kn = torch.nn.functional.normalize(keys, dim=-1)
    gates, betas = -torch.rand(t, H, generator=g) * 0.3, torch.rand(t, H, generator=g)
    tr = transition(kn[None], vals[None], gates[None], betas[None])
    state = s0.clone()
    for i in range(t):
        kk = kn[i][..., None]
        state = gates[i].exp()[:, None, None] * (state - betas[i][:, None, None] * kk * (kk.transpose(-1, -2) @ state))
        state = state + betas[i][:, None, None] * kk * vals[i][:, None, :]
    assert tr.p[0].shape == operator_shape(DENSE, tuple(s0.shape))
    assert (apply_operator(DENSE, tr.p[0], s0, tr.state[0]) - state).abs().max() < 1e-5
    # none: a conv-only mixer carries no recurrent state; its "state" is what the segment left
    empty = torch.zeros(0)
    assert operator_shape(NONE, (0,)) == (0,) and apply_operator(NONE, empty, empty, empty).numel() == 0


@pytest.mark.parametrize("form", [SCALAR, DIAGONAL, DENSE])
def test_compose_forms_chains_segments(form):
    g = torch.Generator().manual_seed(6)
    shape = (H, 4, 3)
    p = torch.rand(5, *operator_shape(form, shape), generator=g)
    b = torch.randn(5, *shape, generator=g)
    s0 = torch.randn(*shape, generator=g)
    out = compose_forms(form, p, b, s0)
    state = s0
    for i in range(5):
        state = apply_operator(form, p[i], state, b[i])
    assert (out[-1] - state).abs().max() < 1e-5 and out.shape == (5, *shape)


def test_unknown_form_is_a_value_error():
    with pytest.raises(ValueError, match="unknown operator form"):
        operator_shape("triangular", (2, 3, 3))
    with pytest.raises(ValueError, match="rest_start must be"):
        ssd_split_transition(*_inputs(2, 4), torch.tensor([1]))


def _mamba1(n: int, t: int, d: int = 6, s: int = 4, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, t, d, generator=g)
    dt = torch.rand(n, t, d, generator=g) * 0.3
    a = -torch.rand(d, s, generator=g) * 2 - 0.1
    return x, dt, a, torch.randn(n, t, s, generator=g), torch.randn(n, t, s, generator=g)


def test_selective_scan_is_the_mamba1_recurrence():
    """Mamba1 (Jamba): h = exp(dt A) h + dt B x per channel and state index, y = C h."""
    x, dt, a, b, c = _mamba1(2, 17)
    s0 = torch.randn(2, 6, 4, generator=torch.Generator().manual_seed(8))
    y, end = selective_scan(x, dt, a, b, c, s0)
    h = s0.clone()
    for i in range(17):
        h = torch.exp(dt[:, i, :, None] * a) * h + (dt[:, i] * x[:, i])[..., None] * b[:, i, None, :]
        assert (y[:, i] - (h * c[:, i, None, :]).sum(-1)).abs().max() < 1e-5
    assert (end - h).abs().max() < 1e-5


def test_diagonal_operators_move_mamba1_segments_and_remainders():
    x, dt, a, b, c = _mamba1(3, 20)
    rest_start = torch.tensor([7, 20, 0])
    split = selective_split_transition(x, dt, a, b, c, rest_start)
    assert split.p.shape[1:] == operator_shape(DIAGONAL, (6, 4, 1))  # one number per state entry
    s0 = torch.randn(6, 4, 1, generator=torch.Generator().manual_seed(9))
    for r, cut in enumerate(rest_start.tolist()):
        row = (x[r : r + 1], dt[r : r + 1], a, b[r : r + 1], c[r : r + 1])
        _, whole = selective_scan(*row, s0[None, ..., 0])
        assert (apply_operator(DIAGONAL, split.p[r], s0, split.state[r])[..., 0] - whole[0]).abs().max() < 1e-5
        _, rest = selective_scan(x[r : r + 1, cut:], dt[r : r + 1, cut:], a, b[r : r + 1, cut:], c[r : r + 1, cut:],
                                 s0[None, ..., 0])  # fmt: skip
        got = apply_operator(DIAGONAL, split.rest_p[r], s0, split.rest_state[r])[..., 0]
        assert (got - rest[0]).abs().max() < 1e-5
