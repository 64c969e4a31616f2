"""The gated delta rule in torch: a chunked (UT/WY) path for prefill and a token recurrence for decode.

Convention (transformers' and fla's): per value head the state S is ``[K, V]`` and

    S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,    o_t = S_t^T q_t

Inputs are ``[B, H, T, D]`` in fp32, with q and k already L2-normalised and q already scaled:
the layer owns those steps, so this module holds only the recurrence. We write it ourselves
because the torch path must run without flash-linear-attention and because HYPIC's transition
operator is this same computation run with ``v = 0`` and ``S_0 = I`` (``chunk_gated_transition``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .decay import decay_exp, masked_decay_exp

# Chunks handled per block, as many as keep ``B·H·chunks·C·max(K, V)`` within BLOCK_ELEMENTS (at most
# MAX_BLOCK_CHUNKS): a block's slices of q, k, v made contiguous and its other temporaries then stay
# about a MB, in cache, and the allocator reuses them; a whole sequence's copies would fault in fresh
# pages on every call. At Qwen3.5-0.8B's shapes (16 heads of 128, chunks of 64) a block is one chunk.
BLOCK_ELEMENTS = 1 << 17
MAX_BLOCK_CHUNKS = 16
# The chunk of a long piece, and the granule a short piece's chunk is rounded up to (the Triton
# kernels' smallest block, ``tl.dot``'s minimum).
MAX_CHUNK = 64
MIN_CHUNK = 16


def chunk_size_for(t: int, chunk_size: int | None = None) -> int:
    """The chunk for a ``t``-token piece: ``chunk_size`` when given, else ``min(64, t)`` rounded up to a
    multiple of 16. An 8-token seam then pads to 16 tokens, not 64. The chunked form is exact for any
    chunk, so the choice changes the cost, not the result (beyond fp32 rounding)."""
    if chunk_size is not None:
        return chunk_size
    return min(MAX_CHUNK, -(-max(t, 1) // MIN_CHUNK) * MIN_CHUNK)


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
    chunk_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Outputs ``[B, H, T, V]`` and the final state ``[B, H, K, V]``, in O(T·C·d + T·d²), with chunks of
    ``chunk_size_for(T, chunk_size)``."""
    out, state, _, _ = _chunked(q, k, v, g, beta, initial_state, chunk_size, outputs=True, operator=False)
    return out, state


def chunk_gated_transition(
    q: torch.Tensor | None,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    chunk_size: int | None = None,
    *,
    q_tilde: bool = True,
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The delta rule with the piece's transition operator: ``(out, state, P, q_tilde)``.

    It is the delta rule run on values ``[v | 0]`` from ``[S0 | I]``, whose end state is ``[state | P]``
    (``P [B, H, K, K]``, with ``state = P S0 + B``), without materialising either: the operator's
    columns ride along in their own ``[K, K]`` state, whose values, hence whose u, are zero. Outputs
    ``out [B, H, T, V]`` need ``q`` (None skips them); with them come the operator columns' outputs
    ``q_tilde = P_t^T q_t`` ``[B, H, T, K]`` unless ``q_tilde=False``: as costly as the outputs, they
    are needed only to move zero-start outputs to another start."""
    out, state, p, q_tilde_out = _chunked(
        q, k, v, g, beta, initial_state, chunk_size, outputs=q is not None, operator=True, q_tilde=q_tilde
    )
    return out, state, p, q_tilde_out


def chunk_gated_delta_rule_hooked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None,
    chunk_size: int,
    hook,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``chunk_gated_delta_rule`` with ``hook(c, state)`` run before chunk ``c`` and after the last
    (``c = n``) on the live state ``[B·H, K, V]``, which it may change in place: where
    ``scan_with_jumps`` applies its jumps, all pieces then sharing one batched pass."""
    out, state, _, _ = _chunked(q, k, v, g, beta, initial_state, chunk_size, outputs=True, operator=False, hook=hook)
    return out, state


def _chunked(
    q, k, v, g, beta, initial_state, chunk_size, *, outputs: bool, operator: bool, q_tilde: bool = False, hook=None
):
    """``hook(c, state)``, when given, runs before chunk ``c`` and after the last (``c = n``) with the live
    state ``[B·H, K, V]``, which it may change in place (``scan_with_jumps`` applies its jumps there)."""
    b, h, t, dk = k.shape
    dv = v.shape[-1]
    size = chunk_size_for(t, chunk_size)
    n = -(-t // size)
    bh = b * h
    per_block = max(1, min(MAX_BLOCK_CHUNKS, BLOCK_ELEMENTS // (bh * size * max(dk, dv))))
    causal = torch.ones(size, size, dtype=torch.bool, device=k.device).tril()

    # States are ours to update in place, as [B·H, K, ·]: the values' and, apart, the operator's.
    state = k.new_zeros(bh, dk, dv)
    if initial_state is not None:
        state.view(b, h, dk, dv).copy_(initial_state)
    p = torch.eye(dk, dtype=k.dtype, device=k.device).repeat(bh, 1, 1) if operator else None
    out = k.new_empty(b, h, n * size, dv) if outputs else None
    out_p = k.new_empty(b, h, n * size, dk) if outputs and operator and q_tilde else None
    for first in range(0, n, per_block):
        nb = min(per_block, n - first)
        span = (first * size, min((first + nb) * size, t), nb, size)
        kb, vb = _chunks(k, *span), _chunks(v, *span)
        gb, betab = _chunks(g, *span).cumsum(-1), _chunks(beta, *span).unsqueeze(-1)
        decay = masked_decay_exp(gb.unsqueeze(-1) - gb.unsqueeze(-2), causal)
        k_beta = kb * betab
        # (I + strict_lower(diag(beta) K K^T ⊙ decay))^-1 applied to [beta v | beta exp(G) k], one solve.
        system = (k_beta @ kb.transpose(-1, -2)) * decay
        rhs = torch.cat((vb * betab, k_beta * decay_exp(gb).unsqueeze(-1)), dim=-1)
        solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
        u, w = solved[..., :dv], solved[..., dv:]
        if outputs:
            qb = _chunks(q, *span)
            intra = (qb @ kb.transpose(-1, -2)) * decay
            q_decayed = qb * decay_exp(gb).unsqueeze(-1)
        g_last = gb[..., -1:]
        k_to_end = (kb * decay_exp(g_last - gb).unsqueeze(-1)).transpose(-1, -2)
        chunk_decay = decay_exp(g_last).unsqueeze(-1)
        for i in range(nb):
            if hook is not None:
                hook(first + i, state)
            rows = slice((first + i) * size, (first + i + 1) * size)
            v_new = torch.baddbmm(u[:, i], w[:, i], state, alpha=-1)
            if out is not None:
                out.view(bh, n * size, dv)[:, rows] = torch.baddbmm(q_decayed[:, i] @ state, intra[:, i], v_new)
            if p is not None:
                p_neg = w[:, i] @ p  # minus the operator columns' v_new: their u is zero
                if out_p is not None:
                    o = torch.baddbmm(q_decayed[:, i] @ p, intra[:, i], p_neg, alpha=-1)
                    out_p.view(bh, n * size, dk)[:, rows] = o
                p.mul_(chunk_decay[:, i]).baddbmm_(k_to_end[:, i], p_neg, alpha=-1)
            state.mul_(chunk_decay[:, i]).baddbmm_(k_to_end[:, i], v_new)
    if hook is not None:
        hook(n, state)
    return (
        out[:, :, :t] if out is not None else None,
        state.view(b, h, dk, dv),
        p.view(b, h, dk, dk) if p is not None else None,
        out_p[:, :, :t] if out_p is not None else None,
    )


def _chunks(x: torch.Tensor, start: int, stop: int, nb: int, size: int) -> torch.Tensor:
    """Tokens ``[start, stop)`` of ``x [B, H, T, ...]`` as ``nb`` chunks of ``size``: ``[B·H, nb, size, ...]``,
    zero-padded at the end."""
    x = x[:, :, start:stop]
    pad = nb * size - (stop - start)
    if pad:
        x = F.pad(x, (0, 0, 0, pad) if x.dim() == 4 else (0, pad))
    return x.reshape(x.shape[0] * x.shape[1], nb, size, *x.shape[3:])


def recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    overwrite: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The token-by-token recurrence: the decode step, and the reference the chunked path must match.
    ``overwrite``: the initial state is the caller's scratch copy, updated in place (outside autograd)."""
    b, h, t, dk = k.shape
    dv = v.shape[-1]
    state = q.new_zeros(b, h, dk, dv) if initial_state is None else initial_state.to(q)
    out = q.new_empty(b, h, t, dv)
    # The state decays first, as the reference writes it, so that the one pass reading both k^T S and q^T S finds
    # it in cache; the output is then taken through the update algebraically (q^T S' = q^T aS + (q.k) delta),
    # and the update is a rank-1 add into the decayed state: three passes over [dk, dv] a token. The caller's
    # initial state is written only when it says so (a fresh decayed copy costs more than the rest of the step
    # at a batch's sizes); under autograd every update is out of place.
    grad = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v, g, beta, state))
    owned = not grad and (overwrite or state is not initial_state)  # a state this call may write
    for i in range(t):
        decay = g[:, :, i].exp().reshape(b * h, 1, 1)
        flat = state.reshape(b * h, dk, dv)
        flat = flat.mul_(decay) if owned else flat * decay
        kq = torch.stack((k[:, :, i], q[:, :, i]), dim=2).reshape(b * h, 2, dk)
        read = torch.bmm(kq, flat)  # [BH, 2, dv]: k^T aS, q^T aS
        delta = (v[:, :, i].reshape(b * h, 1, dv) - read[:, :1]) * beta[:, :, i].reshape(b * h, 1, 1)
        qk = (kq[:, 1:] * kq[:, :1]).sum(-1, keepdim=True)
        out[:, :, i] = (read[:, 1:] + qk * delta).view(b, h, dv)
        kcol = kq[:, :1].transpose(1, 2)
        flat = torch.baddbmm(flat, kcol, delta) if grad else flat.baddbmm_(kcol, delta)
        owned = not grad
        state = flat.view(b, h, dk, dv)
    return out, state
