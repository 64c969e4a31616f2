"""Mamba1's selective scan (Jamba), in torch: the diagonal member of the state algebra.

Per channel ``d`` and state index ``n``:

    h_t[d, n] = exp(dt_t[d] A[d, n]) h_{t-1}[d, n] + dt_t[d] B_t[n] x_t[d],        y_t[d] = sum_n C_t[n] h_t[d, n]

(transformers' ``mamba_selective_scan``; the ``D`` skip and the gate are the mixer's). The decay differs
per channel and state index, so a segment's operator is diagonal: ``P = exp(A * sum dt)``, one number per
state entry (``kernels.algebra.DIAGONAL`` with the state as ``[D, N, 1]``).

A plain token loop, vectorised over channels: the reference the algebra is checked against, and the
runtime's path (a chunked form would build ``[C, C, D, N]`` decay blocks). Written here because
transformers' torch path starts from zero only. Shapes: ``x, dt [N, T, D]``, ``a [D, N]`` (negative),
``b, c [N, T, S]``; states ``[N, D, S]`` fp32.
"""

from __future__ import annotations

import torch


def selective_scan(
    x: torch.Tensor,
    dt: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Outputs ``y [N, T, D]`` (without the ``D`` skip) and the end state, fp32."""
    n, t, d = x.shape
    x, dt, b, c, a = x.float(), dt.float(), b.float(), c.float(), a.float()
    state = x.new_zeros(n, d, a.shape[-1]) if initial_state is None else initial_state.float().clone()
    dtx = dt * x
    out = x.new_empty(n, t, d)
    for i in range(t):  # a step's decay and input are formed in the step: [N, D, S], never [N, T, D, S]
        state = torch.exp(dt[:, i, :, None] * a) * state + dtx[:, i, :, None] * b[:, i, None, :]
        out[:, i] = torch.einsum("nds,ns->nd", state, c[:, i])
    return out, state
