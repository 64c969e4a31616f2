"""Kimi Delta Attention (KDA): the gated delta rule with one decay per key channel, chunked, in torch.

    S_t = (I - beta_t k_t k_t^T) diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T,        o_t = S_t^T q_t

(Kimi Linear's convention: decay first, then the delta update). The map ``S_{t-1} -> S_t`` is linear,
so a segment's operator is a dense ``K x K`` matrix (``kernels.algebra.DENSE``), found as Gated
DeltaNet's is: run identity columns beside the values.

Written here rather than taken from fla or transformers: ours must start from any state and stop at any
token. Within a chunk of ``C`` tokens with cumulative log-decays ``G`` (per channel), the updates
``u_t = beta_t (v_t - (D_t S_{t-1})^T k_t)`` solve one unit-lower-triangular system
``(I + A) U = beta V - beta (K * e^G) S`` with ``A_ij = beta_i sum_c k_ic k_jc e^(G_ic - G_jc)`` (j < i);
the decay gaps are formed pairwise, never as ``e^G`` times ``e^-G``, which would overflow.
Shapes (fla's): ``q, k, g [N, T, H, K]``, ``v [N, T, H, V]``, ``beta [N, T, H]``; states ``[N, H, K, V]``.
"""

from __future__ import annotations

import torch

from .backend import HAS_TRITON, resolve
from .decay import decay_exp, masked_decay_exp

CHUNK = 32


def kda_scan(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    *,
    chunk_size: int = CHUNK,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Outputs ``[N, T, H, V]`` and the end state, fp32, from ``initial_state`` (zero when None): the Triton
    kernel on CUDA (or under ``TRITON_INTERPRET=1`` when asked), else the torch reference."""
    n, t, h, dk = k.shape
    if q.shape != k.shape or g.shape != k.shape or v.shape[:3] != k.shape[:3] or beta.shape != k.shape[:3]:
        raise ValueError(
            f"q, k, g must be [N, T, H, K], v [N, T, H, V] and beta [N, T, H]; got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(g.shape)}, {tuple(v.shape)}, {tuple(beta.shape)}"
        )
    if initial_state is not None and initial_state.shape != (n, h, dk, v.shape[-1]):
        raise ValueError(f"initial_state must be [N, H, K, V] = {(n, h, dk, v.shape[-1])}")
    if resolve(backend, k) == "triton":
        return _kda_triton(q, k, v, g, beta, initial_state)
    return kda_scan_reference(q, k, v, g, beta, initial_state, chunk_size=chunk_size)


def kda_scan_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    *,
    chunk_size: int = CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch reference of ``kda_scan``."""
    n, t, h, dk = k.shape
    dv = v.shape[-1]
    q, k, v, g, beta = (x.float().transpose(1, 2) for x in (q, k, v, g, beta))  # [N, H, T, ...]
    state = k.new_zeros(n, h, dk, dv) if initial_state is None else initial_state.float().clone()
    out = k.new_empty(n, h, t, dv)
    for lo in range(0, t, chunk_size):
        hi = min(t, lo + chunk_size)
        c = hi - lo
        qc, kc, vc, bc = q[:, :, lo:hi], k[:, :, lo:hi], v[:, :, lo:hi], beta[:, :, lo:hi, None]
        cum = g[:, :, lo:hi].cumsum(2)  # [N, H, C, K]
        lower = torch.ones(c, c, dtype=torch.bool, device=k.device).tril()
        gap = masked_decay_exp(cum[:, :, :, None] - cum[:, :, None, :], lower[..., None])
        a = torch.einsum("nhic,nhjc,nhijc->nhij", kc, kc, gap).tril(-1) * bc
        kq = torch.einsum("nhic,nhjc,nhijc->nhij", qc, kc, gap)  # j <= i, zero above
        rhs = torch.cat((vc * bc, kc * decay_exp(cum) * bc), dim=-1)
        solved = torch.linalg.solve_triangular(a + torch.eye(c, device=k.device), rhs, upper=False, unitriangular=True)
        u = solved[..., :dv] - solved[..., dv:] @ state
        out[:, :, lo:hi] = (qc * decay_exp(cum)) @ state + kq @ u
        to_end = decay_exp(cum[:, :, -1:] - cum)  # [N, H, C, K]
        state = decay_exp(cum[:, :, -1, :, None]) * state + (kc * to_end).transpose(-1, -2) @ u
    return out.transpose(1, 2), state


def kda_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The token-by-token recurrence: the oracle the chunked scan must match."""
    n, t, h, dk = k.shape
    state = k.new_zeros(n, h, dk, v.shape[-1]).float() if initial_state is None else initial_state.float().clone()
    out = k.new_empty(n, t, h, v.shape[-1], dtype=torch.float32)
    for i in range(t):
        state = state * g[:, i].float().exp()[..., None]
        kt = k[:, i].float()
        delta = beta[:, i, :, None].float() * (v[:, i].float() - torch.einsum("nhk,nhkv->nhv", kt, state))
        state = state + kt[..., None] * delta[..., None, :]
        out[:, i] = torch.einsum("nhk,nhkv->nhv", q[:, i].float(), state)
    return out, state


if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _kda_kernel(
        Q, K, V, G, BETA, S0, O, STATE, T,
        H: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
        BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, HAS_S0: tl.constexpr,
    ):  # fmt: skip
        """One (sequence, head) and one block of BV value columns per program; the state block ``[BK, BV]``
        stays in registers while chunks of BT tokens stream past. Decay gaps are formed pairwise over the
        key channels (a ``[BT, BT, BK]`` block), so no ``exp`` of a positive sum appears."""
        nh = tl.program_id(0)
        n = nh // H
        h = nh % H
        rt = tl.arange(0, BT)
        rk = tl.arange(0, BK)
        cols = tl.program_id(1) * BV + tl.arange(0, BV)
        mk = rk < DK
        mv = cols < DV
        lower = rt[:, None] >= rt[None, :]
        strict = rt[:, None] > rt[None, :]
        state = tl.zeros([BK, BV], dtype=tl.float32)
        if HAS_S0:
            s0_ptr = S0 + ((n * H + h) * DK + rk[:, None]) * DV + cols[None, :]
            state += tl.load(s0_ptr, mask=mk[:, None] & mv[None, :], other=0.0).to(tl.float32)
        for c in range(0, T, BT):
            t_idx = c + rt
            mt = t_idx < T
            tok = (n * T + t_idx) * H + h
            kmask = mt[:, None] & mk[None, :]
            kc = tl.load(K + tok[:, None] * DK + rk[None, :], mask=kmask, other=0.0).to(tl.float32)
            qc = tl.load(Q + tok[:, None] * DK + rk[None, :], mask=kmask, other=0.0).to(tl.float32)
            gc = tl.load(G + tok[:, None] * DK + rk[None, :], mask=kmask, other=0.0).to(tl.float32)
            bc = tl.load(BETA + tok, mask=mt, other=0.0).to(tl.float32)
            vc = tl.load(V + tok[:, None] * DV + cols[None, :], mask=mt[:, None] & mv[None, :], other=0.0)
            vc = vc.to(tl.float32)
            gcum = tl.cumsum(gc, axis=0)  # [BT, BK]
            gap = gcum[:, None, :] - gcum[None, :, :]  # [BT(i), BT(j), BK]
            decay = tl.where(lower[:, :, None], tl.exp(tl.where(lower[:, :, None], gap, 0.0)), 0.0)
            a = tl.sum(kc[:, None, :] * kc[None, :, :] * decay, axis=2) * bc[:, None]
            a = tl.where(strict, a, 0.0)
            kq = tl.sum(qc[:, None, :] * kc[None, :, :] * decay, axis=2)
            # (I + A)^-1 by forward substitution, a row at a time: rows above i are final.
            tinv = tl.where(rt[:, None] == rt[None, :], 1.0, 0.0)
            for i in range(1, BT):
                a_i = tl.sum(tl.where(rt[:, None] == i, a, 0.0), axis=0)
                row = -tl.sum(a_i[:, None] * tinv, axis=0)
                tinv = tl.where(rt[:, None] == i, tinv + row[None, :], tinv)
            egc = tl.exp(gcum)
            u = tl.dot(tinv, vc * bc[:, None], input_precision="ieee")
            w = tl.dot(tinv, kc * egc * bc[:, None], input_precision="ieee")
            u = u - tl.dot(w, state, input_precision="ieee")
            o = tl.dot(qc * egc, state, input_precision="ieee") + tl.dot(kq, u, input_precision="ieee")
            tl.store(O + tok[:, None] * DV + cols[None, :], o, mask=mt[:, None] & mv[None, :])
            last = tl.sum(tl.where(rt[:, None] == BT - 1, gcum, 0.0), axis=0)  # [BK]
            # Padded tokens (past T) have g = 0, so the chunk's last row is the last real token's.
            k_end = kc * tl.exp(last[None, :] - gcum)
            state = state * tl.exp(last)[:, None] + tl.dot(tl.trans(k_end), u, input_precision="ieee")
        base = ((n * H + h) * DK + rk[:, None]) * DV + cols[None, :]
        tl.store(STATE + base, state, mask=mk[:, None] & mv[None, :])


def _kda_triton(q, k, v, g, beta, initial_state):
    n, t, h, dk = k.shape
    dv = v.shape[-1]
    out = torch.empty(n, t, h, dv, dtype=torch.float32, device=k.device)
    state = torch.empty(n, h, dk, dv, dtype=torch.float32, device=k.device)
    bk = max(16, triton.next_power_of_2(dk))
    bv = min(64, max(16, triton.next_power_of_2(dv)))
    s0 = initial_state.float().contiguous() if initial_state is not None else state
    grid = (n * h, triton.cdiv(dv, bv))
    _kda_kernel[grid](
        q.contiguous(), k.contiguous(), v.contiguous(), g.contiguous(), beta.contiguous(), s0, out, state, t,
        h, dk, dv, 16, bk, bv, initial_state is not None,
    )  # fmt: skip
    return out, state
