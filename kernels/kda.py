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
) -> tuple[torch.Tensor, torch.Tensor]:
    """Outputs ``[N, T, H, V]`` and the end state, fp32, from ``initial_state`` (zero when None)."""
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
        gap = (cum[:, :, :, None] - cum[:, :, None, :]).masked_fill(~lower[..., None], float("-inf")).exp()
        a = torch.einsum("nhic,nhjc,nhijc->nhij", kc, kc, gap).tril(-1) * bc
        kq = torch.einsum("nhic,nhjc,nhijc->nhij", qc, kc, gap)  # j <= i, zero above
        rhs = torch.cat((vc * bc, kc * cum.exp() * bc), dim=-1)
        solved = torch.linalg.solve_triangular(a + torch.eye(c, device=k.device), rhs, upper=False, unitriangular=True)
        u = solved[..., :dv] - solved[..., dv:] @ state
        out[:, :, lo:hi] = (qc * cum.exp()) @ state + kq @ u
        to_end = (cum[:, :, -1:] - cum).exp()  # [N, H, C, K]
        state = cum[:, :, -1, :, None].exp() * state + (kc * to_end).transpose(-1, -2) @ u
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
