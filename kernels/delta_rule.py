"""The gated delta rule in torch: a chunked (UT/WY) path for prefill and a token recurrence for decode.

Convention (transformers' and fla's): per value head the state S is ``[K, V]`` and

    S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,    o_t = S_t^T q_t

Inputs are ``[B, H, T, D]`` in fp32, with q and k already L2-normalised and q already scaled:
the layer owns those steps, so this module holds only the recurrence. We write it ourselves
because the torch path must run without flash-linear-attention and because HYPIC's transition
operator is this same computation run with ``v = 0`` and ``S_0 = I``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Chunks handled per block: the per-chunk temporaries of a block stay a few MB, which keeps them in
# cache and lets the allocator reuse them instead of faulting in fresh pages for the whole sequence.
BLOCK_CHUNKS = 16


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """fla's normalisation: ``x / sqrt(sum x^2 + eps)``."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Outputs ``[B, H, T, V]`` and the final state ``[B, H, K, V]``, in O(T·C·d + T·d²)."""
    b, h, t, dk = k.shape
    dv = v.shape[-1]
    pad = (-t) % chunk_size
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        g, beta = (F.pad(x, (0, pad)) for x in (g, beta))
    n = (t + pad) // chunk_size
    q, k, v = (x.reshape(b, h, n, chunk_size, x.shape[-1]) for x in (q, k, v))
    g = g.reshape(b, h, n, chunk_size).cumsum(-1)
    beta = beta.reshape(b, h, n, chunk_size, 1)
    causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).tril()

    state = q.new_zeros(b, h, dk, dv) if initial_state is None else initial_state.to(q)
    out = q.new_empty(b, h, n, chunk_size, dv)
    for start in range(0, n, BLOCK_CHUNKS):
        blk = slice(start, min(start + BLOCK_CHUNKS, n))
        qb, kb, vb, gb, betab = q[:, :, blk], k[:, :, blk], v[:, :, blk], g[:, :, blk], beta[:, :, blk]
        decay = (gb.unsqueeze(-1) - gb.unsqueeze(-2)).masked_fill(~causal, float("-inf")).exp()
        k_beta = kb * betab
        # (I + strict_lower(diag(beta) K K^T ⊙ decay))^-1 applied to [beta v | beta exp(G) k], one solve.
        system = (k_beta @ kb.transpose(-1, -2)) * decay
        rhs = torch.cat((vb * betab, k_beta * gb.exp().unsqueeze(-1)), dim=-1)
        solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
        u, w = solved[..., :dv], solved[..., dv:]
        intra = (qb @ kb.transpose(-1, -2)) * decay
        q_decayed = qb * gb.exp().unsqueeze(-1)
        g_last = gb[..., -1:]
        k_to_end = (kb * (g_last - gb).exp().unsqueeze(-1)).transpose(-1, -2)
        chunk_decay = g_last.exp().unsqueeze(-1)
        for i in range(u.shape[2]):
            v_new = u[:, :, i] - w[:, :, i] @ state
            out[:, :, blk.start + i] = q_decayed[:, :, i] @ state + intra[:, :, i] @ v_new
            state = state * chunk_decay[:, :, i] + k_to_end[:, :, i] @ v_new
    return out.reshape(b, h, n * chunk_size, dv)[:, :, :t], state


def recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The token-by-token recurrence: the decode step, and the reference the chunked path must match."""
    b, h, t, dk = k.shape
    dv = v.shape[-1]
    state = q.new_zeros(b, h, dk, dv) if initial_state is None else initial_state.to(q)
    out = q.new_empty(b, h, t, dv)
    for i in range(t):
        state = state * g[:, :, i].exp()[..., None, None]
        k_t = k[:, :, i]
        delta = (v[:, :, i] - (state * k_t.unsqueeze(-1)).sum(-2)) * beta[:, :, i].unsqueeze(-1)
        state = state + k_t.unsqueeze(-1) * delta.unsqueeze(-2)
        out[:, :, i] = (state * q[:, :, i].unsqueeze(-1)).sum(-2)
    return out, state
