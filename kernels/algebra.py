"""The state algebra of HYPIC (docs/design.md §3): each operation's torch reference with its Triton kernel.

- ``transition``: a segment's end state and transition operator ``P`` per value head, with
  ``state = P @ S0 + B`` (``B`` the zero-start end state). One pass of the chunked (UT/WY) delta rule
  gives both: run it with values ``[v | 0]`` from the initial state ``[S0 | I]``; the end state is
  ``[P S0 + B | P]``. Per chunk it solves one C x C triangular system; no d x d matrix per token.
- ``split_transition``: the same for a batch of zero-start segments, with the operator of each
  row's remainder after its seam as well (seam variant B), for the cost of one pass.
- ``compose``: chain cached segments left to right, ``S <- P_i S + B_i``.
- ``rerotate``: move RoPE-rotated keys to new positions, ``R(p + d) = R(d) R(p)``.
- Operator forms: every linear mixer's segment map is ``S <- P S + B``, but ``P`` takes the
  form its recurrence allows — ``dense`` (``[H, K, K]``: Gated DeltaNet, KDA), ``diagonal`` (``[H, K]``:
  per-channel decay without a delta rule), ``scalar`` (``[H]``: Mamba2, Lightning) or ``none`` (a conv-only
  mixer, whose only carried state is its conv tail). ``apply_operator`` and ``compose_forms`` take each
  natively, so a scalar entry stores one number per head; ``ssd_split_transition`` captures Mamba2's.
  A short Gated DeltaNet segment's map is kept as its own tokens (``DeltaTokens``), smaller than dense.

Convention (transformers' and fla's): ``S_t = exp(g_t)(I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T``.
Public shapes follow fla: ``k [N, T, H, K]``, ``v [N, T, H, V]``, ``g, beta [N, T, H]``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .backend import HAS_TRITON, resolve
from .decay import decay_exp, masked_decay_exp
from .delta_rule import chunk_gated_transition, chunk_size_for
from .rope import apply_rope, rope_cos_sin


@dataclass(frozen=True)
class Transition:
    """What a pass over a segment yields: ``state = P @ S0 + B`` ``[N, H, K, V]`` and ``p`` ``[N, H, K, K]``,
    fp32; with queries, also the outputs ``out [N, T, H, V]`` and the vectors ``q_tilde = P_t^T q_t``
    ``[N, T, H, K]``, which move zero-start outputs to any start: ``o_t(S) = o_t(0) + S^T q~_t`` (None
    when not asked for: they are the outputs of the identity columns, as costly as the outputs)."""

    state: torch.Tensor
    p: torch.Tensor
    out: torch.Tensor | None = None
    q_tilde: torch.Tensor | None = None


@dataclass(frozen=True)
class SplitTransition:
    """A zero-start batch's end states, operators and outputs, and each row's remainder operator
    (``rest_state``, ``rest_p``: tokens from the row's ``rest_start`` on; identity for a row whose
    remainder is empty). The rest fields are None when no row has a remainder."""

    state: torch.Tensor
    p: torch.Tensor
    out: torch.Tensor | None
    rest_state: torch.Tensor | None = None
    rest_p: torch.Tensor | None = None


# -- transition ---------------------------------------------------------------------------------

# split_transition's rest pass starts at column 0 when every row's split is at most this far in.
REST_FROM_ZERO = 64


def _check_transition(k, v, g, beta, initial_state, q) -> None:
    if k.dim() != 4 or v.dim() != 4 or k.shape[:3] != v.shape[:3]:
        raise ValueError(f"k and v must be [N, T, H, D] with matching N, T, H; got {tuple(k.shape)}, {tuple(v.shape)}")
    if g.shape != k.shape[:3] or beta.shape != k.shape[:3]:
        raise ValueError(f"g and beta must be [N, T, H] = {tuple(k.shape[:3])}")
    n, _, h, dk = k.shape
    if initial_state is not None and initial_state.shape != (n, h, dk, v.shape[-1]):
        raise ValueError(f"initial_state must be [N, H, K, V] = {(n, h, dk, v.shape[-1])}")
    if q is not None and q.shape != k.shape:
        raise ValueError("q must have k's shape")


def transition_reference(
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    *,
    q: torch.Tensor | None = None,
    q_tilde: bool = True,
    chunk_size: int | None = None,
) -> Transition:
    """Torch reference of ``transition``; same arguments and result."""
    k_, v_, g_, b_ = (x.transpose(1, 2).float() for x in (k, v, g, beta))
    q_ = q.transpose(1, 2).float() if q is not None else None
    s0 = initial_state.float() if initial_state is not None else None
    out, state, p, q_tilde_ = chunk_gated_transition(q_, k_, v_, g_, b_, s0, chunk_size, q_tilde=q_tilde)
    if out is None:
        return Transition(state, p)
    return Transition(state, p, out.transpose(1, 2), q_tilde_.transpose(1, 2) if q_tilde_ is not None else None)


def transition(
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    *,
    chunk_size: int | None = None,
    backend: str = "auto",
    q: torch.Tensor | None = None,
    q_tilde: bool = True,
) -> Transition:
    """The segment's ``Transition`` from ``initial_state`` (zero when None); with ``q [N, T, H, K]``
    (scaled, L2-normalised) its outputs and, unless ``q_tilde=False``, its correction vectors too.
    ``chunk_size`` None fits the chunk to the segment (``chunk_size_for``: 64, or T rounded up to 16)."""
    _check_transition(k, v, g, beta, initial_state, q)
    if resolve(backend, k) == "triton":
        return _transition_triton(k, v, g, beta, initial_state, q, chunk_size, q_tilde)
    return transition_reference(k, v, g, beta, initial_state, q=q, q_tilde=q_tilde, chunk_size=chunk_size)


def split_transition(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    rest_start: torch.Tensor,
    **kw,
) -> SplitTransition:
    """Zero-start rows with the operator of each row's tokens ``[rest_start[n], T)`` as well.

    One masked path for every batch: a head pass over ``[0, max(rest_start))`` in which each row's
    tokens from its split on are identities (g = beta = 0), then a rest pass to ``T`` in which its
    tokens before the split are, started from the head's end state ``[B_head | I]``. The rest pass's
    value columns are then the row's own outputs and end state, its identity columns the remainder's
    operator, and the remainder's zero-start state is ``state - rest_p @ B_head``; neither pass
    computes outputs for its identity columns. The rest pass starts at ``min(rest_start)``, or at 0
    when that is at most ``REST_FROM_ZERO`` columns in: a few more identity tokens cost less than
    concatenating the two passes' outputs. When every row splits at one column the passes cost about
    one pass in all. ``rest_start[n] = T`` asks for no remainder in row ``n``; such rows run whole in
    the rest pass when other rows have one. ``kw`` goes to ``transition`` (``chunk_size``, ``backend``)."""
    n, t, h, dk = k.shape
    if rest_start.shape != (n,):
        raise ValueError(f"rest_start must be [N] = [{n}], got {tuple(rest_start.shape)}")
    lo, hi = int(rest_start.min()), int(rest_start.max())
    if lo < 0 or hi > t:
        raise ValueError(f"rest_start must lie in [0, {t}], got {rest_start.tolist()}")
    whole = rest_start >= t
    if lo < t and hi == t and not bool(whole.all()):
        # Rows without a remainder run whole in the rest pass, from a head of nothing, rather than
        # stretch the head pass to T; their remainder is then set to the empty one.
        got = split_transition(q, k, v, g, beta, torch.where(whole, 0, rest_start), **kw)
        none = whole.to(got.rest_p.device)[:, None, None, None]
        eye = torch.eye(dk, dtype=got.rest_p.dtype, device=got.rest_p.device)
        rest_state = torch.where(none, 0.0, got.rest_state)
        return replace(got, rest_state=rest_state, rest_p=torch.where(none, eye, got.rest_p))
    col = torch.arange(t, device=k.device)[None, :]
    in_rest = col >= rest_start.to(k.device)[:, None]  # [N, T]

    def piece(keep: torch.Tensor, cols: slice, mask: bool) -> tuple[torch.Tensor, ...]:
        """Columns ``cols``; a token not kept becomes an identity through ``g = beta = 0`` alone (its k
        and v then add nothing), so only the small ``[N, T, H]`` tensors are masked."""
        if not mask:
            return q[:, cols], k[:, cols], v[:, cols], g[:, cols], beta[:, cols]
        m = keep[:, cols, None].to(g.dtype)
        return q[:, cols], k[:, cols], v[:, cols], g[:, cols] * m, beta[:, cols] * m

    head = None
    if hi > 0:
        hq, hk, hv, hg, hb = piece(~in_rest, slice(0, hi), lo < hi)
        head = transition(hk, hv, hg, hb, q=hq, q_tilde=False, **kw)
    if lo >= t:  # no row has a remainder: the head pass was the whole pass
        return SplitTransition(head.state, head.p, head.out)
    first = 0 if lo <= REST_FROM_ZERO else lo
    rq, rk, rv, rg, rb = piece(in_rest, slice(first, t), first < hi)
    rest = transition(rk, rv, rg, rb, head.state if head is not None else None, q=rq, q_tilde=False, **kw)
    if head is None:  # every row is all remainder
        return SplitTransition(rest.state, rest.p, rest.out, rest.state, rest.p)
    if first == 0:  # the rest pass's outputs before each row's split are the head pass's
        out = rest.out
        out[:, :hi] = head.out if lo == hi else torch.where(in_rest[:, :hi, None, None], out[:, :hi], head.out)
    else:
        out = torch.cat((head.out[:, :lo], rest.out), dim=1)
        if hi > lo:  # columns both passes covered: each row takes the pass its own split assigns them
            overlap = in_rest[:, lo:hi, None, None]
            out[:, lo:hi] = torch.where(overlap, rest.out[:, : hi - lo], head.out[:, lo:hi])
    return SplitTransition(rest.state, rest.p @ head.p, out, rest.state - rest.p @ head.state, rest.p)


# -- compose ------------------------------------------------------------------------------------


def compose_reference(p: torch.Tensor, b: torch.Tensor, s0: torch.Tensor | None = None) -> torch.Tensor:
    """Torch reference of ``compose``."""
    state = torch.zeros_like(b[0], dtype=torch.float32) if s0 is None else s0.float()
    outs = []
    for i in range(p.shape[0]):
        state = p[i].float() @ state + b[i].float()
        outs.append(state)
    return torch.stack(outs)


def compose(p: torch.Tensor, b: torch.Tensor, s0: torch.Tensor | None = None, *, backend: str = "auto") -> torch.Tensor:
    """States after each segment, ``[S, H, K, V]`` fp32: ``out[i] = P[i] @ out[i-1] + B[i]``, from ``s0``
    ``[H, K, V]`` or zero. ``P`` is ``[S, H, K, K]``, ``B`` is ``[S, H, K, V]``."""
    if p.dim() != 4 or b.dim() != 4 or p.shape[:3] != b.shape[:3] or p.shape[-1] != p.shape[-2]:
        raise ValueError(f"P must be [S, H, K, K] and B [S, H, K, V]; got {tuple(p.shape)}, {tuple(b.shape)}")
    if s0 is not None and s0.shape != b.shape[1:]:
        raise ValueError(f"s0 must be [H, K, V] = {tuple(b.shape[1:])}")
    if resolve(backend, p) == "triton":
        return _compose_triton(p, b, s0)
    return compose_reference(p, b, s0)


# -- operator forms ------------------------------------------------------------------------------

DENSE, DIAGONAL, SCALAR, NONE = "dense", "diagonal", "scalar", "none"
FORMS = (DENSE, DIAGONAL, SCALAR, NONE)


def operator_shape(form: str, state_shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of one segment's ``P`` in ``form`` for states of ``state_shape`` (``[H, K, ...]``)."""
    if form == DENSE:
        return (state_shape[0], state_shape[1], state_shape[1])
    if form == DIAGONAL:
        return (state_shape[0], state_shape[1])
    if form == SCALAR:
        return (state_shape[0],)
    if form == NONE:
        return (0,)
    raise ValueError(f"unknown operator form {form!r}; expected one of {', '.join(FORMS)}")


def apply_operator(form: str, p: torch.Tensor, s: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``P S + B`` in fp32 for states ``s [..., H, K, V]`` (any leading batch dims) and ``p`` in ``form``
    without them (one segment's operator)."""
    s = s.float()
    if form == DENSE:
        return torch.matmul(p.float(), s) + b.float()
    if form == DIAGONAL:
        return p.float()[..., None] * s + b.float()
    if form == SCALAR:
        return p.float().reshape(*p.shape, *([1] * (b.dim() - 1))) * s + b.float()
    if form == NONE:
        return b.float().expand_as(s).clone()
    raise ValueError(f"unknown operator form {form!r}; expected one of {', '.join(FORMS)}")


def compose_forms(form: str, p: torch.Tensor, b: torch.Tensor, s0: torch.Tensor | None = None) -> torch.Tensor:
    """``compose`` for any operator form: states after each of the ``S`` segments, ``[S, *state]`` fp32.
    Dense chains go to ``compose`` (with its Triton kernel); the other forms are elementwise."""
    if form == DENSE:
        return compose(p, b, s0)
    state = torch.zeros_like(b[0], dtype=torch.float32) if s0 is None else s0.float()
    outs = []
    for i in range(b.shape[0]):
        state = apply_operator(form, p[i], state, b[i])
        outs.append(state)
    return torch.stack(outs)


@dataclass(frozen=True)
class DeltaTokens:
    """A short Gated DeltaNet segment's map ``S <- P S + B`` kept as the delta rule's own inputs over its ``L``
    tokens: ``k [H, L, K]`` (L2-normalised, as the rule sees them), ``v [H, L, V]``, log gates ``g`` and ``beta``
    ``[H, L]``, all fp32.

    Why this form: ``P = gamma (I - Y T Y^T)`` (``Y`` the keys, ``T`` the ``L x L`` triangle of the UT
    transform) and ``B``, of rank at most ``L``, lies in ``span(Y)``, so operator and state are both functions of
    these ``L (K + V + 2)`` numbers per head (against ``K (K + V)`` dense); and the remainder after a seam of
    ``w`` tokens is the same rule over tokens ``[w, L)`` (``suffix``), so no entry per seam width is needed.
    ``apply`` carries a state past the segment without forming ``P``, in the UT form of one chunk:
    ``S' = e^{G_L} S + K~^T T (beta v - beta e^{G} k S)``, ``T`` the unit-lower triangle solved once, so
    ``2 K L V + L^2 V`` (and ``L^2 K`` for ``T``'s system) against the dense ``K^2 V``; every exponent is
    ``<= 0``. An entry keeps this form only while it is smaller than dense (``L < K (K + V) / (K + V + 2)`` at
    equal head counts), so ``L`` stays one chunk's size."""

    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor

    def __len__(self) -> int:
        return self.k.shape[1]

    def suffix(self, start: int) -> DeltaTokens:
        """The map of tokens ``[start, L)``: the remainder after a seam of ``start`` tokens."""
        return DeltaTokens(self.k[:, start:], self.v[:, start:], self.g[:, start:], self.beta[:, start:])

    def apply(self, s: torch.Tensor | None) -> torch.Tensor:
        """``P S + B`` ``[H, K, V]`` fp32 from ``s [H, K, V]`` (None: zero, giving ``B``)."""
        k, v, beta = self.k.float(), self.v.float(), self.beta.float()
        cum = self.g.float().cumsum(-1)  # [H, L]
        n = k.shape[1]
        causal = torch.ones(n, n, dtype=torch.bool, device=k.device).tril()
        k_beta = k * beta[..., None]
        decay = masked_decay_exp(cum[..., :, None] - cum[..., None, :], causal)
        system = torch.matmul(k_beta, k.transpose(-1, -2)) * decay
        rhs = v * beta[..., None]
        if s is not None:
            rhs = rhs - torch.matmul(k_beta * decay_exp(cum)[..., None], s.float())
        v_new = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
        k_to_end = k * decay_exp(cum[:, -1:] - cum)[..., None]
        out = torch.matmul(k_to_end.transpose(-1, -2), v_new)
        return out if s is None else out + decay_exp(cum[:, -1])[:, None, None] * s.float()

    def dense(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(P [H, K, K], B [H, K, V])``: for a kernel that takes dense operators only, and for checking."""
        _, state, p, _ = chunk_gated_transition(None, self.k[None], self.v[None], self.g[None], self.beta[None])
        return p[0], state[0]


def ssd_split_transition(
    x: torch.Tensor,
    dt: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    rest_start: torch.Tensor,
) -> SplitTransition:
    """``split_transition`` for Mamba2 (``kernels.ssd``'s shapes): zero-start rows' outputs and end states,
    their scalar operators ``p [N, H] = exp(a sum dt)``, and each row's remainder from ``rest_start[n]``
    (``T``: none, the identity). A scalar decay commutes with everything, so the remainder's zero-start
    state is one weighted sum over its tokens, ``sum_t exp(a (cum_T - cum_t)) dt_t x_t b_t^T``, with no
    second scan."""
    from .ssd import ssd_scan

    n, t = x.shape[:2]
    if rest_start.shape != (n,):
        raise ValueError(f"rest_start must be [N] = [{n}], got {tuple(rest_start.shape)}")
    out, state = ssd_scan(x, dt, a, b, c)
    log_decay = dt.float() * a.float()  # [N, T, H]
    p = decay_exp(log_decay.sum(1))
    if bool((rest_start >= t).all()):
        return SplitTransition(state, p, out)
    in_rest = (torch.arange(t, device=x.device)[None, :] >= rest_start.to(x.device)[:, None])[..., None]
    cum = log_decay.cumsum(1)
    weight = decay_exp(cum[:, -1:] - cum) * dt.float() * in_rest
    rest_state = torch.einsum("nsh,nshp,nshk->nhpk", weight, x.float(), b.float())
    rest_p = decay_exp((log_decay * in_rest).sum(1))
    return SplitTransition(state, p, out, rest_state, rest_p)


def selective_split_transition(
    x: torch.Tensor,
    dt: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    rest_start: torch.Tensor,
) -> SplitTransition:
    """``split_transition`` for Mamba1 (``kernels.selective_scan``'s shapes), its state held as ``[N, D, S, 1]``
    so the diagonal operator ``p [N, D, S] = exp(a sum dt)`` applies as ``DIAGONAL``; each row's remainder
    from ``rest_start[n]`` by a second scan in which the tokens before it are identities (``dt = 0``)."""
    from .selective_scan import selective_scan

    n, t = x.shape[:2]
    if rest_start.shape != (n,):
        raise ValueError(f"rest_start must be [N] = [{n}], got {tuple(rest_start.shape)}")
    out, state = selective_scan(x, dt, a, b, c)
    p = decay_exp(a.float() * dt.float().sum(1)[..., None])
    if bool((rest_start >= t).all()):
        return SplitTransition(state[..., None], p, out)
    keep = torch.arange(t, device=x.device)[None, :] >= rest_start.to(x.device)[:, None]
    rest_dt = dt.float() * keep[..., None]
    _, rest = selective_scan(x, rest_dt, a, b, c)
    rest_p = decay_exp(a.float() * rest_dt.sum(1)[..., None])
    return SplitTransition(state[..., None], p, out, rest[..., None], rest_p)


def kda_split_transition(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    rest_start: torch.Tensor,
) -> SplitTransition:
    """``split_transition`` for KDA (``kernels.kda``'s shapes; per-channel ``g [N, T, H, K]``): one pass with
    identity columns beside the values from ``[0 | I]`` gives the outputs, the end state and ``P``; where
    rows have a remainder, a second such pass in which each row's tokens before ``rest_start[n]`` are
    identities (``g = beta = 0``) gives the remainder's operator and zero-start state."""
    from .kda import kda_scan

    n, t, h, dk = k.shape
    dv = v.shape[-1]
    if rest_start.shape != (n,):
        raise ValueError(f"rest_start must be [N] = [{n}], got {tuple(rest_start.shape)}")
    wide = torch.cat((v.float(), v.new_zeros(n, t, h, dk, dtype=torch.float32)), dim=-1)
    eye = torch.eye(dk, device=k.device).expand(n, h, dk, dk)
    start = torch.cat((k.new_zeros(n, h, dk, dv, dtype=torch.float32), eye), dim=-1)
    out, state = kda_scan(q, k, wide, g, beta, start)
    if bool((rest_start >= t).all()):
        return SplitTransition(state[..., :dv], state[..., dv:], out[..., :dv])
    keep = (torch.arange(t, device=k.device)[None, :] >= rest_start.to(k.device)[:, None])[..., None]
    _, rest = kda_scan(q, k, wide, g * keep[..., None], beta * keep, start)
    return SplitTransition(state[..., :dv], state[..., dv:], out[..., :dv], rest[..., :dv], rest[..., dv:])


# -- rerotate -----------------------------------------------------------------------------------


def rerotate(keys: torch.Tensor, delta: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Keys ``[..., T, D]`` rotated at positions ``p`` become keys rotated at ``p + delta`` (``delta [T]``)."""
    cos, sin = rope_cos_sin(inv_freq, delta)
    return apply_rope(keys.float(), cos, sin).to(keys.dtype)


# -- Triton -------------------------------------------------------------------------------------

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def wy_chunk(kc, vc, gc, bc, BT: tl.constexpr):
        """One chunk of the delta rule in UT/WY form, shared by the kernels that stream chunks: from the
        chunk's keys ``kc [BT, K]``, values ``vc [BT, V]``, gates and betas, the ``u`` and ``w`` with
        ``v_new = u - w @ S`` for the state ``S`` before the chunk, the decay matrix and the gate's cumsum."""
        rt = tl.arange(0, BT)
        lower = rt[:, None] >= rt[None, :]
        gcum = tl.cumsum(gc, axis=0)
        decay = tl.where(lower, tl.exp(tl.where(lower, gcum[:, None] - gcum[None, :], 0.0)), 0.0)
        kb = kc * bc[:, None]
        a = tl.where(rt[:, None] > rt[None, :], tl.dot(kb, tl.trans(kc), input_precision="ieee") * decay, 0.0)
        # (I + A)^-1 by forward substitution, a row at a time: rows above i are final.
        tinv = tl.where(rt[:, None] == rt[None, :], 1.0, 0.0)
        for i in range(1, BT):
            a_i = tl.sum(tl.where(rt[:, None] == i, a, 0.0), axis=0)
            row = -tl.sum(a_i[:, None] * tinv, axis=0)
            tinv = tl.where(rt[:, None] == i, tinv + row[None, :], tinv)
        u = tl.dot(tinv, vc * bc[:, None], input_precision="ieee")
        w = tl.dot(tinv, kb * tl.exp(gcum)[:, None], input_precision="ieee")
        return u, w, decay, gcum

    @triton.jit
    def _transition_kernel(
        Q, K, V, G, BETA, S0, STATE, P, O,
        T, H: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
        BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
        HAS_S0: tl.constexpr, HAS_Q: tl.constexpr, O_COLS: tl.constexpr,
    ):  # fmt: skip
        """One (sequence, head) and one block of BV augmented columns ``[v | 0]`` per program; the
        state block ``[BK, BV]`` stays in registers while the chunks stream past. Outputs cover the
        first ``O_COLS`` columns (``DV``, or ``DV + DK`` with ``q_tilde``); a block past them skips
        the query's dots and stores."""
        nh = tl.program_id(0)
        n = nh // H
        h = nh % H
        rt = tl.arange(0, BT)
        rk = tl.arange(0, BK)
        cols = tl.program_id(1) * BV + tl.arange(0, BV)
        mk = rk < DK
        is_val = cols < DV
        is_id = (cols >= DV) & (cols < DV + DK)
        eye_cols = (rk[:, None] == (cols - DV)[None, :]) & is_id[None, :]
        has_out = tl.program_id(1) * BV < O_COLS
        state = tl.where(eye_cols, 1.0, 0.0)
        if HAS_S0:
            s0_ptr = S0 + ((n * H + h) * DK + rk[:, None]) * DV + cols[None, :]
            state += tl.load(s0_ptr, mask=mk[:, None] & is_val[None, :], other=0.0).to(tl.float32)
        for c in range(0, T, BT):
            t_idx = c + rt
            mt = t_idx < T
            tok = (n * T + t_idx) * H + h
            kc = tl.load(K + tok[:, None] * DK + rk[None, :], mask=mt[:, None] & mk[None, :], other=0.0).to(tl.float32)
            vc = tl.load(V + tok[:, None] * DV + cols[None, :], mask=mt[:, None] & is_val[None, :], other=0.0)
            vc = vc.to(tl.float32)
            gc = tl.load(G + tok, mask=mt, other=0.0).to(tl.float32)
            bc = tl.load(BETA + tok, mask=mt, other=0.0).to(tl.float32)
            u, w, decay, gcum = wy_chunk(kc, vc, gc, bc, BT)
            v_new = u - tl.dot(w, state, input_precision="ieee")
            if HAS_Q:
                if has_out:
                    q_ptr = Q + tok[:, None] * DK + rk[None, :]
                    qc = tl.load(q_ptr, mask=mt[:, None] & mk[None, :], other=0.0).to(tl.float32)
                    intra = tl.dot(qc, tl.trans(kc), input_precision="ieee") * decay
                    o = tl.dot(qc * tl.exp(gcum)[:, None], state, input_precision="ieee")
                    o += tl.dot(intra, v_new, input_precision="ieee")
                    o_mask = mt[:, None] & (cols < O_COLS)[None, :]
                    tl.store(O + tok[:, None] * O_COLS + cols[None, :], o, mask=o_mask)
            g_last = tl.sum(tl.where(rt == BT - 1, gcum, 0.0), axis=0)
            k_end = kc * tl.exp(g_last - gcum)[:, None]
            state = state * tl.exp(g_last) + tl.dot(tl.trans(k_end), v_new, input_precision="ieee")
        base = (n * H + h) * DK + rk[:, None]
        tl.store(STATE + base * DV + cols[None, :], state, mask=mk[:, None] & is_val[None, :])
        tl.store(P + base * DK + (cols - DV)[None, :], state, mask=mk[:, None] & is_id[None, :])

    @triton.jit
    def _compose_kernel(
        P, B, S0, OUT, S, H: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
        BK: tl.constexpr, BV: tl.constexpr, HAS_S0: tl.constexpr,
    ):  # fmt: skip
        h = tl.program_id(0)
        rk = tl.arange(0, BK)
        rv = tl.program_id(1) * BV + tl.arange(0, BV)
        mk = rk < DK
        mv = rv < DV
        kv_mask = mk[:, None] & mv[None, :]
        kv_off = (h * DK + rk[:, None]) * DV + rv[None, :]
        if HAS_S0:
            state = tl.load(S0 + kv_off, mask=kv_mask, other=0.0).to(tl.float32)
        else:
            state = tl.zeros([BK, BV], dtype=tl.float32)
        for i in range(S):
            p_off = ((i * H + h) * DK + rk[:, None]) * DK + rk[None, :]
            p = tl.load(P + p_off, mask=mk[:, None] & mk[None, :], other=0.0).to(tl.float32)
            b = tl.load(B + i * H * DK * DV + kv_off, mask=kv_mask, other=0.0).to(tl.float32)
            state = tl.dot(p, state, input_precision="ieee") + b
            tl.store(OUT + i * H * DK * DV + kv_off, state, mask=kv_mask)


def block_size(dim: int) -> int:
    """A Triton block covering ``dim``: a power of two, at least 16 (``tl.dot``'s minimum)."""
    return max(16, triton.next_power_of_2(dim))


def _transition_triton(k, v, g, beta, initial_state, q, chunk_size, q_tilde=True):
    n, t, h, dk = k.shape
    dv = v.shape[-1]
    k, v, g, beta = (x.contiguous() for x in (k, v, g, beta))
    state = torch.empty(n, h, dk, dv, dtype=torch.float32, device=k.device)
    p = torch.empty(n, h, dk, dk, dtype=torch.float32, device=k.device)
    o_cols = 0 if q is None else dv + dk if q_tilde else dv
    out = torch.empty(n, t, h, o_cols, dtype=torch.float32, device=k.device) if q is not None else state
    bv = min(64, block_size(dv + dk))
    grid = (n * h, triton.cdiv(dv + dk, bv))
    s0 = initial_state.float().contiguous() if initial_state is not None else state
    bt = block_size(chunk_size_for(t, chunk_size))  # a power of two: 48 becomes 64
    _transition_kernel[grid](
        q.contiguous() if q is not None else k, k, v, g, beta, s0, state, p, out,
        t, h, dk, dv, bt, block_size(dk), bv, initial_state is not None, q is not None, o_cols,
    )  # fmt: skip
    if q is None:
        return Transition(state, p)
    return Transition(state, p, out[..., :dv], out[..., dv:] if q_tilde else None)


def _compose_triton(p, b, s0):
    s, h, dk, dv = b.shape
    out = torch.empty(s, h, dk, dv, dtype=torch.float32, device=b.device)
    bv = min(64, block_size(dv))
    p, b = p.contiguous(), b.contiguous()
    start = s0.contiguous() if s0 is not None else out
    _compose_kernel[(h, triton.cdiv(dv, bv))](p, b, start, out, s, h, dk, dv, block_size(dk), bv, s0 is not None)
    return out
