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
    decay = (g.unsqueeze(-1) - g.unsqueeze(-2)).masked_fill(~causal, float("-inf")).exp()
    k_beta = k * beta
    # (I + strict_lower(diag(beta) K K^T ⊙ decay))^-1 applied to [beta v | beta exp(G) k], one solve.
    system = (k_beta @ k.transpose(-1, -2)) * decay
    rhs = torch.cat((v * beta, k_beta * g.exp().unsqueeze(-1)), dim=-1)
    solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    u, w = solved[..., :dv], solved[..., dv:]
    intra = (q @ k.transpose(-1, -2)) * decay
    q_decayed = q * g.exp().unsqueeze(-1)
    g_last = g[..., -1:]
    k_to_end = k * (g_last - g).exp().unsqueeze(-1)
    chunk_decay = g_last.exp().unsqueeze(-1)

    if initial_state is None:
        state = q.new_zeros(b, h, dk, dv)
    else:
        state = initial_state.to(q)
    out = torch.empty_like(u)
    for i in range(n):
        v_new = u[:, :, i] - w[:, :, i] @ state
        out[:, :, i] = q_decayed[:, :, i] @ state + intra[:, :, i] @ v_new
        state = state * chunk_decay[:, :, i] + k_to_end[:, :, i].transpose(-1, -2) @ v_new
    out = out.reshape(b, h, n * chunk_size, dv)[:, :, :t]
    return out, state


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
