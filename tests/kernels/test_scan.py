"""The scan with jumps against the token recurrence it stands for, on both backends.

Triton runs under TRITON_INTERPRET=1 on CPU tensors (set in conftest before the kernels load), so the
cases stay small."""

from __future__ import annotations

import pytest
import torch

from hypic_rag.kernels.algebra import transition
from hypic_rag.kernels.backend import HAS_TRITON
from hypic_rag.kernels.delta_rule import chunk_gated_delta_rule, l2norm, recurrent_gated_delta_rule
from hypic_rag.kernels.scan import Jumps, _chunk_for, _plan, scan_marked, scan_with_jumps, scan_with_jumps_reference

BACKENDS = ["torch", pytest.param("triton", marks=pytest.mark.skipif(not HAS_TRITON, reason="needs triton"))]
TOL = 1e-4


def _tokens(t: int, seed: int, h: int = 2, dk: int = 16, dv: int = 8, dtype=torch.float32):
    """fla layout: q, k [1, T, H, K], v [1, T, H, V], g and beta [1, T, H]."""
    gen = torch.Generator().manual_seed(seed)
    q = l2norm(torch.randn(1, t, h, dk, generator=gen)) * dk**-0.5
    k = l2norm(torch.randn(1, t, h, dk, generator=gen))
    v = torch.randn(1, t, h, dv, generator=gen)
    g = -torch.rand(1, t, h, generator=gen) * 0.3
    beta = torch.rand(1, t, h, generator=gen)
    return tuple(x.to(dtype) for x in (q, k, v, g, beta))


def _jumps(at: list[int], src: list[int], h: int = 2, dk: int = 16, dv: int = 8, seed: int = 0) -> Jumps:
    gen = torch.Generator().manual_seed(seed)
    n = len(at)
    p = torch.randn(n, h, dk, dk, generator=gen) * 0.9 / dk**0.5
    b = torch.randn(n, h, dk, dv, generator=gen) * 0.5
    return Jumps(torch.tensor(at, dtype=torch.int64), torch.tensor(src, dtype=torch.int64), p, b)


def _oracle(q, k, v, g, beta, s0=None, jumps: Jumps | None = None):
    """The documented semantics, literally: token by token, and at each index its jumps in order, each
    onto the state after the first ``src`` tokens as it is at that moment."""
    qt, kt, vt, gt, bt = (x.transpose(1, 2).float() for x in (q, k, v, g, beta))
    _, h, t, dk = kt.shape
    state = torch.zeros(1, h, dk, vt.shape[-1]) if s0 is None else s0.float()
    at = jumps.at.tolist() if jumps is not None else []
    src = jumps.src.tolist() if jumps is not None else []
    seen: dict[int, torch.Tensor] = {}
    outs = []
    for i in range(t + 1):
        seen[i] = state
        for j in (j for j, a in enumerate(at) if a == i):
            state = jumps.p[j] @ seen[src[j]] + jumps.b[j]
            seen[i] = state
        if i < t:
            one = (x[:, :, i : i + 1] for x in (qt, kt, vt, gt, bt))
            o, state = recurrent_gated_delta_rule(*one, state)
            outs.append(o)
    return torch.cat(outs, dim=2).transpose(1, 2), state


def _assert_close(got, want):
    out, state = got
    assert out.dtype == state.dtype == torch.float32
    assert out.shape == want[0].shape and state.shape == want[1].shape
    assert (out - want[0]).abs().max() < TOL
    assert (state - want[1]).abs().max() < TOL


@pytest.mark.parametrize("backend", BACKENDS)
def test_without_jumps_it_is_the_chunked_rule(backend):
    x = _tokens(70, seed=1)
    s0 = torch.randn(1, 2, 16, 8, generator=torch.Generator().manual_seed(2))
    none = scan_with_jumps(*x, s0, backend=backend)
    empty = scan_with_jumps(*x, s0, _jumps([], []), backend=backend)
    o, s = chunk_gated_delta_rule(*(t.transpose(1, 2) for t in x), s0)
    for got in (none, empty):
        _assert_close(got, (o.transpose(1, 2), s))
        _assert_close(got, _oracle(*x, s0))


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_jump_onto_the_current_state(backend):
    """Two pieces of 64: the Triton kernel streams them in chunks of 64."""
    x = _tokens(128, seed=3)
    jumps = _jumps([64], [64])
    _assert_close(scan_with_jumps(*x, None, jumps, backend=backend), _oracle(*x, None, jumps))


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_jump_recomposes_a_seam(backend):
    """A-variant: the 8 tokens before the jump run for their outputs, then the jump replaces their
    effect on the state, composing onto the state before them."""
    x = _tokens(40, seed=4)
    jumps = _jumps([24], [16])
    got = scan_with_jumps(*x, None, jumps, backend=backend)
    _assert_close(got, _oracle(*x, None, jumps))
    plain = scan_with_jumps(*x, backend=backend)
    assert (got[0][:, :24] - plain[0][:, :24]).abs().max() < TOL  # outputs before the jump do not see it


# Pieces of 1, 3, 8, 17, 64 and 70 tokens. Jumps: at 0; at 1; two at 4 (a seam from 1, then one onto
# the state the first left); at 12 from 4 (after both jumps there); at 29 and 93 onto the current
# state; at T = 163 from 93 (after the jump at 93), which changes only the final state.
SEVERAL = ([0, 1, 4, 4, 12, 29, 93, 163], [0, 1, 1, 4, 4, 29, 93, 93])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("chunk_size", [16, 64])
def test_several_jumps_over_pieces_of_every_length(backend, dtype, chunk_size):
    x = _tokens(163, seed=5, dtype=dtype)
    s0 = torch.randn(1, 2, 16, 8, generator=torch.Generator().manual_seed(6))
    jumps = _jumps(*SEVERAL)
    got = scan_with_jumps(*x, s0, jumps, chunk_size=chunk_size, backend=backend)
    _assert_close(got, _oracle(*x, s0, jumps))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("h,dk,dv", [(3, 20, 12), (1, 16, 40), (2, 32, 16)])
def test_head_and_state_shapes(backend, h, dk, dv):
    """Several heads, dk != dv, widths that are not powers of two, several blocks of value columns."""
    x = _tokens(30, seed=h + dk + dv, h=h, dk=dk, dv=dv)
    jumps = _jumps([0, 9, 21, 30], [0, 5, 21, 21], h=h, dk=dk, dv=dv, seed=7)
    _assert_close(scan_with_jumps(*x, None, jumps, backend=backend), _oracle(*x, None, jumps))


def _random_jumps(t: int, seed: int) -> Jumps:
    """Valid jumps at random: shared indices, sources at either end of their window or inside it."""
    gen = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 7, (1,), generator=gen))
    at = sorted(torch.randint(0, t + 1, (n,), generator=gen).tolist())
    src = []
    for j, a in enumerate(at):
        low = at[j - 1] if j else 0
        pick = int(torch.randint(0, 3, (1,), generator=gen))
        src.append((a, low, int(torch.randint(low, a + 1, (1,), generator=gen)))[pick])
    return _jumps(at, src, seed=seed)


TRITON = BACKENDS[1].marks


@pytest.mark.parametrize(
    "backend,seed", [("torch", s) for s in range(12)] + [pytest.param("triton", s, marks=TRITON) for s in (0, 1)]
)
def test_random_jump_layouts(backend, seed):
    x = _tokens(37, seed=100 + seed)
    jumps = _random_jumps(37, seed)
    _assert_close(scan_with_jumps(*x, None, jumps, backend=backend), _oracle(*x, None, jumps))


def _layout(segments, seed: int):
    """Fresh tokens with jumps standing for cached segments, and the full sequence they stand for.

    ``segments``: ``("fresh", n)`` or ``("cached", n, w)``, a cached segment of ``n`` tokens whose
    first ``w`` are recomputed (a seam, A-variant). Returns the fresh inputs, their jumps, the full
    inputs and, for each fresh token, its position in the full sequence."""
    total = sum(seg[1] for seg in segments)
    full = _tokens(total, seed=seed)
    keep, at, src, ps, bs = [], [], [], [], []
    pos = 0
    for kind, n, *rest in segments:
        if kind == "fresh":
            keep.extend(range(pos, pos + n))
        else:
            w = rest[0]
            before = len(keep)
            keep.extend(range(pos, pos + w))
            cached = transition(*(x[:, pos : pos + n] for x in full[1:]))
            at.append(len(keep))
            src.append(before)
            ps.append(cached.p)
            bs.append(cached.state)
        pos += n
    idx = torch.tensor(keep, dtype=torch.int64)
    fresh = tuple(x[:, idx] for x in full)
    at_, src_ = torch.tensor(at, dtype=torch.int64), torch.tensor(src, dtype=torch.int64)
    return fresh, Jumps(at_, src_, torch.cat(ps), torch.cat(bs)), full, idx


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "segments",
    [
        [("fresh", 11), ("cached", 37, 0), ("fresh", 15)],
        [("fresh", 11), ("cached", 37, 5), ("fresh", 15)],
        [("cached", 20, 0), ("cached", 33, 3), ("fresh", 9), ("cached", 25, 0)],
    ],
    ids=["cached-between", "seam", "cached-at-0-and-T"],
)
def test_jumps_equal_the_cached_tokens_present(backend, segments):
    """Scanning fresh tokens with jumps built by ``transition`` over cached segments equals scanning
    the whole sequence, on the fresh tokens' outputs and on the final state."""
    fresh, jumps, full, idx = _layout(segments, seed=len(segments) * 10 + sum(s[-1] for s in segments))
    s0 = torch.randn(1, 2, 16, 8, generator=torch.Generator().manual_seed(8))
    out, state = scan_with_jumps(*fresh, s0, jumps, backend=backend)
    o, s = chunk_gated_delta_rule(*(x.transpose(1, 2) for x in full), s0)
    assert (out - o.transpose(1, 2)[:, idx]).abs().max() < TOL
    assert (state - s).abs().max() < TOL


def test_plan_steps():
    """Pieces end at every ``at`` and ``src``; jumps at one index keep their order; a seam's source is
    saved after every jump at its index."""
    assert _plan(*SEVERAL, 163) == [
        (0, 0, 0, 0),
        (0, 1, 1, 2),
        (1, 4, 2, 1),
        (4, 4, 3, 2),
        (4, 12, 4, 1),
        (12, 29, 5, 0),
        (29, 93, 6, 2),
        (93, 163, 7, 1),
    ]
    assert _plan([], [], 5) == [(0, 5, -1, 0)]
    assert _plan([3], [1], 5) == [(0, 1, -1, 2), (1, 3, 0, 1), (3, 5, -1, 0)]


def test_chunk_follows_the_pieces():
    assert _chunk_for([(0, 8, 0, 0), (8, 16, 1, 0)], 64) == 16
    assert _chunk_for([(0, 64, 0, 0), (64, 128, -1, 0)], 64) == 64
    assert _chunk_for([(0, 64, 0, 0)], 32) == 32
    assert _chunk_for([(0, 0, 0, 0)], 64) == 16


def test_auto_runs_torch_on_cpu_and_the_reference_agrees():
    x = _tokens(20, seed=9)
    jumps = _jumps([7], [3])
    auto = scan_with_jumps(*x, None, jumps)
    ref = scan_with_jumps_reference(*x, None, jumps)
    assert torch.equal(auto[0], ref[0]) and torch.equal(auto[1], ref[1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_tokens_only_jumps(backend):
    x = _tokens(0, seed=0)
    jumps = _jumps([0, 0], [0, 0])
    out, state = scan_with_jumps(*x, None, jumps, backend=backend)
    assert out.shape == (1, 0, 2, 8)
    assert (state - (jumps.p[1] @ jumps.b[0] + jumps.b[1])).abs().max() < 1e-6


def _replace(jumps: Jumps, **kw) -> Jumps:
    fields = {"at": jumps.at, "src": jumps.src, "p": jumps.p, "b": jumps.b, **kw}
    return Jumps(**fields)


def test_malformed_inputs_raise():
    q, k, v, g, beta = _tokens(10, seed=0)
    ok = _jumps([2, 6], [2, 4])
    scan_with_jumps(q, k, v, g, beta, None, ok)

    def bad(match, *args, jumps=ok, **kw):
        args = args or (q, k, v, g, beta, None)
        with pytest.raises(ValueError, match=match):
            scan_with_jumps(*args, jumps, **kw)

    two = _tokens(10, seed=0)
    bad("batch 1 only", *(torch.cat((x, x)) for x in two), None)
    bad(r"q, k must be \[1, T, H, K\]", q, k[..., :8], v, g, beta, None)
    bad(r"q, k must be \[1, T, H, K\]", q[0], k, v, g, beta, None)
    bad(r"g and beta must be \[1, T, H\]", q, k, v, g[:, :5], beta, None)
    bad("initial_state must be", q, k, v, g, beta, torch.zeros(1, 2, 16, 16))
    bad("k must be a float16", q, k.long(), v, g, beta, None)
    bad("chunk_size must be", chunk_size=48)
    bad("unknown backend", backend="cuda")
    bad("jumps must be a Jumps", jumps=(ok.at, ok.src, ok.p, ok.b))
    bad("must be int64", jumps=_replace(ok, at=ok.at.int()))
    bad(r"must be \[J\]", jumps=_replace(ok, src=ok.src[:1]))
    bad(r"jumps.p must be \[J, H, K, K\]", jumps=_replace(ok, p=ok.p[:, :, :8]))
    bad(r"jumps.p must be \[J, H, K, K\]", jumps=_replace(ok, b=ok.b[:1]))
    bad("must be float32", jumps=_replace(ok, p=ok.p.half()))
    bad("sorted ascending", jumps=_replace(ok, at=torch.tensor([6, 2]), src=torch.tensor([0, 2])))
    bad(r"outside \[0, 10\]", jumps=_replace(ok, at=torch.tensor([2, 11])))
    bad(r"outside \[0, 10\]", jumps=_replace(ok, at=torch.tensor([-1, 6]), src=torch.tensor([-1, 4])))
    bad(r"jumps.src\[1\] = 7 must lie in \[2, 6\]", jumps=_replace(ok, src=torch.tensor([2, 7])))
    bad(r"jumps.src\[1\] = 1 must lie in \[2, 6\]", jumps=_replace(ok, src=torch.tensor([2, 1])))
    bad(r"jumps.src\[0\] = -1 must lie in \[0, 2\]", jumps=_replace(ok, src=torch.tensor([-1, 4])))


@pytest.mark.parametrize("backend", BACKENDS)
def test_segments_kept_as_their_tokens_jump_as_their_dense_operators(backend):
    """Jumps over segments kept as their tokens (applied without forming ``P``; the Triton kernel gets them
    formed) beside dense ones, one taking its source before its seam: the all-dense scan's outputs and state."""
    from hypic_rag.kernels.algebra import DeltaTokens

    x = _tokens(30, seed=5)
    at, src = [4, 12, 12, 30], [4, 9, 12, 30]
    kept = []
    for j, n in enumerate((7, 0, 19, 3)):
        if not n:
            kept.append(None)
            continue
        _, k, v, g, beta = _tokens(n, seed=20 + j)
        kept.append(DeltaTokens(*(y[0].transpose(0, 1) for y in (k, v, g, beta))))
    dense = _jumps(at, src, seed=3)
    made = [t.dense() if t is not None else (dense.p[j], dense.b[j]) for j, t in enumerate(kept)]
    all_dense = Jumps(dense.at, dense.src, torch.stack([p for p, _ in made]), torch.stack([b for _, b in made]))
    mixed = Jumps(dense.at, dense.src, dense.p[1:2], dense.b[1:2], tuple(kept))
    s0 = torch.randn(1, 2, 16, 8, generator=torch.Generator().manual_seed(6))
    _assert_close(scan_with_jumps(*x, s0, mixed, backend=backend), _oracle(*x, s0, all_dense))
    with pytest.raises(ValueError, match="jumps.p must be"):
        scan_with_jumps(*x, s0, Jumps(dense.at, dense.src, dense.p, dense.b, tuple(kept)), backend=backend)


@pytest.mark.parametrize("at", [[0], [5], [1, 70, 71], [0, 33, 99]])
def test_marks_record_the_state_the_recurrence_has_there(at):
    """One pass over the pieces between the marks: the outputs and end state of the plain rule, and at each
    mark the state after that many tokens."""
    q, k, v, g, beta = _tokens(100, seed=3)
    s0 = torch.randn(1, 2, 16, 8, generator=torch.Generator().manual_seed(4))
    out, end, states = scan_marked(q, k, v, g, beta, s0, at)
    want_out, want_end = _oracle(q, k, v, g, beta, s0)
    assert (out - want_out).abs().max() < TOL and (end - want_end).abs().max() < TOL
    for m, state in zip(at, states, strict=True):
        there = _oracle(*(x[:, :m] for x in (q, k, v, g, beta)), s0)[1] if m else s0
        assert state.shape == (1, 2, 16, 8) and (state - there).abs().max() < TOL, m
    for bad in ([100], [7, 7], [9, 3], [-1]):
        with pytest.raises(ValueError, match="must be ascending"):
            scan_marked(q, k, v, g, beta, s0, bad)
