"""The state algebra of HYPIC (HYPIC.md §3), in torch: the reference every faster kernel must match.

- ``transition``: a segment's zero-start end state ``B`` and transition operator ``P`` per value
  head, so that ``S_end = P @ S_start + B``. One pass of the chunked delta rule computes both: run
  it with values ``[v | 0]`` from the initial state ``[S0 | I]``; the end state is ``[P S0 + B | P]``.
- ``compose``: chain cached segments left to right, ``S <- P_i S + B_i``.
- ``rerotate``: move RoPE-rotated keys to new positions, ``R(p + d) = R(d) R(p)``.
"""

from __future__ import annotations

import torch

from .delta_rule import chunk_gated_delta_rule
from .rope import apply_rope, rope_cos_sin


def transition(
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    *,
    q: torch.Tensor | None = None,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """End state ``[B, H, K, V]`` (``P @ S0 + B``; ``B`` when ``initial_state`` is None), ``P [B, H, K, K]``,
    and, with ``q``, the ordinary outputs ``[B, H, T, V]`` and the correction vectors ``P_t^T q_t``
    ``[B, H, T, K]`` that turn zero-start outputs into outputs from any start: ``o_t(S) = o_t(0) + S^T q~_t``.

    Inputs are ``[B, H, T, D]`` fp32, k L2-normalised, as for ``chunk_gated_delta_rule``."""
    b, h, t, dk = k.shape
    dv = v.shape[-1]
    values = torch.cat((v, v.new_zeros(b, h, t, dk)), dim=-1)
    eye = torch.eye(dk, dtype=k.dtype, device=k.device).expand(b, h, dk, dk)
    s0 = k.new_zeros(b, h, dk, dv) if initial_state is None else initial_state.to(k)
    q_in = q if q is not None else k.new_zeros(b, h, t, dk)
    out, state = chunk_gated_delta_rule(q_in, k, values, g, beta, torch.cat((s0, eye), dim=-1), chunk_size)
    if q is None:
        return state[..., :dv], state[..., dv:], None, None
    return state[..., :dv], state[..., dv:], out[..., :dv], out[..., dv:]


def split_transition(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, split: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A zero-start segment's ``(B, P, outputs, B_rest, P_rest)`` with the operator of tokens ``[split, T)``
    too, in one augmented pass: the head and the rest run separately and compose, and the rest's
    outputs are corrected to start from the head's end state."""
    sl_h, sl_r = slice(None, split), slice(split, None)
    b_head, p_head, o_head, _ = transition(
        k[:, :, sl_h], v[:, :, sl_h], g[:, :, sl_h], beta[:, :, sl_h], q=q[:, :, sl_h]
    )
    b_rest, p_rest, o_rest, q_tilde = transition(
        k[:, :, sl_r], v[:, :, sl_r], g[:, :, sl_r], beta[:, :, sl_r], q=q[:, :, sl_r]
    )
    assert o_head is not None and o_rest is not None and q_tilde is not None
    out = torch.cat((o_head, o_rest + q_tilde @ b_head), dim=2)
    return p_rest @ b_head + b_rest, p_rest @ p_head, out, b_rest, p_rest


def compose(p: torch.Tensor, b: torch.Tensor, s0: torch.Tensor | None = None) -> torch.Tensor:
    """States after each segment ``[S, ..., K, V]``: ``out[i] = P[i] @ out[i-1] + B[i]`` from ``s0`` or zero."""
    state = torch.zeros_like(b[0]) if s0 is None else s0.to(b)
    outs = []
    for i in range(p.shape[0]):
        state = p[i] @ state + b[i]
        outs.append(state)
    return torch.stack(outs)


def rerotate(keys: torch.Tensor, delta: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Keys ``[..., T, D]`` rotated at positions ``p`` become keys rotated at ``p + delta`` (``delta [T]``)."""
    cos, sin = rope_cos_sin(inv_freq, delta)
    return apply_rope(keys.float(), cos, sin).to(keys.dtype)
