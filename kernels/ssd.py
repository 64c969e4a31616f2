"""Mamba2's selective state space scan (SSD), chunked, in torch: the scalar-decay member of the state algebra.

Per head ``h`` the state ``S [P, N]`` follows

    S_t = exp(a_h dt_t) S_{t-1} + dt_t x_t B_t^T,        y_t = S_t C_t

(transformers' ``mamba2_chunk_scan`` convention; the ``D`` skip and the gate are the mixer's). The decay is
one number per head and token, so a segment's transition operator is the scalar ``exp(a_h sum dt)``
(docs/design.md §3 with ``P = p I``): a cached entry keeps one number per head where Gated DeltaNet keeps a
``K x K`` matrix.

Written here rather than taken from transformers: its torch path has no initial-state-per-row split, no
way to stop at a segment boundary, and no operator. Shapes: ``x [N, T, H, P]``, ``dt [N, T, H]`` (already
``softplus``-ed and clamped), ``a [H]`` (negative), ``b, c [N, T, H, N_s]`` (groups already repeated to
heads), states ``[N, H, P, N_s]`` fp32.
"""

from __future__ import annotations

import torch

from .decay import decay_exp, masked_decay_exp

CHUNK = 64


def ssd_scan(
    x: torch.Tensor,
    dt: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    *,
    chunk_size: int = CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Outputs ``y [N, T, H, P]`` (without the ``D`` skip) and the end state, fp32, from ``initial_state``
    (zero when None). Within a chunk the outputs are one masked matmul; chunks pass the state along."""
    n, t, h, p = x.shape
    ns = b.shape[-1]
    x, dt, b, c = x.float(), dt.float(), b.float(), c.float()
    log_decay = dt * a.float()  # [N, T, H], <= 0
    xdt = x * dt[..., None]
    state = x.new_zeros(n, h, p, ns) if initial_state is None else initial_state.float().clone()
    out = x.new_empty(n, t, h, p)
    for lo in range(0, t, chunk_size):
        hi = min(t, lo + chunk_size)
        cs = log_decay[:, lo:hi].cumsum(1)  # [N, L, H]
        gap = cs[:, :, None, :] - cs[:, None, :, :]  # [N, L(t), L(s), H]
        causal = torch.ones(hi - lo, hi - lo, dtype=torch.bool, device=x.device).tril()[None, :, :, None]
        decay = masked_decay_exp(gap, causal)
        scores = torch.einsum("nthk,nshk->ntsh", c[:, lo:hi], b[:, lo:hi]) * decay
        y = torch.einsum("ntsh,nshp->nthp", scores, xdt[:, lo:hi])
        y += torch.einsum("nthk,nhpk->nthp", c[:, lo:hi], state) * decay_exp(cs)[..., None]
        out[:, lo:hi] = y
        to_end = decay_exp(cs[:, -1:] - cs)  # [N, L, H]
        state = state * decay_exp(cs[:, -1])[..., None, None] + torch.einsum(
            "nsh,nshp,nshk->nhpk", to_end, xdt[:, lo:hi], b[:, lo:hi]
        )
    return out, state


def ssd_recurrent(
    x: torch.Tensor,
    dt: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The token-by-token recurrence: the decode step, and the oracle the chunked scan must match."""
    n, t, h, p = x.shape
    state = x.new_zeros(n, h, p, b.shape[-1]).float() if initial_state is None else initial_state.float().clone()
    out = x.new_empty(n, t, h, p, dtype=torch.float32)
    for i in range(t):
        decay = (dt[:, i].float() * a.float()).exp()[..., None, None]
        state = state * decay + (dt[:, i, :, None, None] * x[:, i, :, :, None] * b[:, i, :, None, :]).float()
        out[:, i] = (state * c[:, i, :, None, :].float()).sum(-1)
    return out, state
