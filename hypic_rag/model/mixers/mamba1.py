"""The Mamba1 token mixer (Jamba): projections, causal conv with a carried tail, the selective scan with dt,
B and C RMS-normed, the D skip and a SiLU gate.

Mamba1's decay differs per channel and state index, so its operator is diagonal (``kernels.algebra.
DIAGONAL``): the state is held as ``[D, S, 1]`` and a segment's operator is ``exp(A * sum dt)`` ``[D, S]``.
Weight names are transformers' ``JambaMambaMixer``'s.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hypic_rag.kernels.algebra import DIAGONAL, selective_split_transition
from hypic_rag.kernels.selective_scan import selective_scan

from ..config import HybridConfig
from ..context import Forward
from ..layers import PlainRMSNorm
from ..linear import Linear
from .conv import request_conv
from .recurrence import run_recurrence


class Mamba1Mixer(nn.Module):
    operator_form = DIAGONAL

    def __init__(self, config: HybridConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        h, inner, s, rank = config.hidden_size, config.mamba1_inner, config.ssm_state_size, config.mamba_dt_rank
        self.inner, self.state_size, self.rank, self.kernel = inner, s, rank, config.mamba_conv_kernel
        self.in_proj = Linear(h, 2 * inner, bias=config.mamba_proj_bias)
        self.conv1d = nn.Conv1d(inner, inner, self.kernel, groups=inner, bias=config.mamba_conv_bias)
        self.x_proj = Linear(inner, rank + 2 * s, bias=False)
        self.dt_proj = Linear(rank, inner, bias=True)
        self.A_log = nn.Parameter(torch.zeros(inner, s))
        self.D = nn.Parameter(torch.ones(inner))
        self.out_proj = Linear(inner, h, bias=config.mamba_proj_bias)
        self.dt_layernorm = PlainRMSNorm(rank, config.rms_norm_eps)
        self.b_layernorm = PlainRMSNorm(s, config.rms_norm_eps)
        self.c_layernorm = PlainRMSNorm(s, config.rms_norm_eps)

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        return {
            "b": (self.inner, self.state_size, 1),
            "p": (self.inner, self.state_size),
            "conv_tail": (self.inner, self.kernel - 1),
        }

    def forward(self, x: torch.Tensor, ctx: Forward) -> torch.Tensor:
        """Padding is an exact identity (zero conv input, ``dt = 0``)."""
        state, pad_mask, capture, jumps = ctx.state, ctx.pad_mask, ctx.capture, ctx.jumps
        b, t, _ = x.shape
        if pad_mask is not None:
            x = torch.where(pad_mask[..., None], x, 0.0)
        layer = state.linear(self.layer_idx) if state is not None else None
        xs, gate = self.in_proj(x).chunk(2, dim=-1)
        if pad_mask is not None:
            xs = torch.where(pad_mask[..., None], xs, 0.0)
        tail = layer.conv if layer else None
        xs, tail = request_conv(
            xs, tail, self.conv1d.weight[:, 0, :], self.conv1d.bias, jumps, self.layer_idx, ctx.marks
        )
        xs = F.silu(xs)
        dt, bm, cm = self.x_proj(xs).split((self.rank, self.state_size, self.state_size), dim=-1)
        dt = F.softplus(F.linear(self.dt_layernorm(dt), self.dt_proj.weight).float() + self.dt_proj.bias.float())
        if pad_mask is not None:
            dt = dt * pad_mask[..., None]
        bm, cm = self.b_layernorm(bm), self.c_layernorm(cm)
        a = -self.A_log.float().exp()

        def scan(sl: slice, start: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
            held = start[..., 0] if start is not None else None  # the state is kept as [B, D, S, 1]
            out, end = selective_scan(xs[:, sl], dt[:, sl], a, bm[:, sl], cm[:, sl], held)
            return out, end[..., None]

        y, s_end = run_recurrence(
            self.layer_idx,
            DIAGONAL,
            t,
            layer.recurrent if layer is not None else None,
            lambda: xs.new_zeros(b, self.inner, self.state_size, 1, dtype=torch.float32),
            scan,
            lambda rest_start: selective_split_transition(xs, dt, a, bm, cm, rest_start),
            capture,
            jumps,
            ctx.marks,
        )
        if state is not None:
            state.set_linear(self.layer_idx, tail, s_end)
        y = (y + xs.float() * self.D.float()) * F.silu(gate.float())
        return self.out_proj(y.to(x.dtype))
