"""The Mamba2 token mixer (Nemotron-H, Granite-4.0-H, Falcon-H1, Bamba): projections, causal conv with a
carried tail, the selective scan, the D skip and the grouped gated RMSNorm.

Its state is the conv tail and the SSM state ``[H, P, N]``; a segment's operator is one number per head
(``kernels.algebra.SCALAR``), so it crosses a boundary at the cost of a multiply. Weight names are
transformers' (``in_proj``, ``conv1d``, ``dt_bias``, ``A_log``, ``D``, ``norm``, ``out_proj``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hypic_rag.kernels.algebra import SCALAR, ssd_split_transition
from hypic_rag.kernels.ssd import ssd_scan

from ..config import HybridConfig
from ..context import Forward
from ..linear import Linear
from .conv import request_conv
from .recurrence import run_recurrence


class GroupedGatedRMSNorm(nn.Module):
    """RMSNorm per group of channels, times the weight, in fp32, with the ``silu(gate)`` before it (the
    default, Nemotron/Granite/Bamba) or after it (Falcon-H1's ``mamba_norm_before_gate``)."""

    def __init__(self, dim: int, groups: int, eps: float, gate_first: bool = True) -> None:
        super().__init__()
        self.eps, self.groups, self.gate_first = eps, groups, gate_first
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float() * F.silu(gate.float()) if self.gate_first else x.float()
        g = h.view(*h.shape[:-1], self.groups, -1)
        g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + self.eps)
        out = self.weight * g.view(h.shape).to(dtype)
        return out if self.gate_first else (out.float() * F.silu(gate.float())).to(dtype)


class Mamba2Mixer(nn.Module):
    operator_form = SCALAR

    def __init__(self, config: HybridConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.heads = config.mamba_num_heads
        self.head_dim = config.mamba_head_dim
        self.state_size = config.ssm_state_size
        self.groups = config.mamba_n_groups
        self.inner = config.mamba_intermediate
        self.conv_dim = config.mamba_conv_dim
        self.kernel = config.mamba_conv_kernel
        self.dt_min, self.dt_max = config.time_step_limit
        h = config.hidden_size
        self.in_proj = Linear(h, self.inner + self.conv_dim + self.heads, bias=config.mamba_proj_bias)
        self.conv1d = nn.Conv1d(
            self.conv_dim, self.conv_dim, self.kernel, groups=self.conv_dim, bias=config.mamba_conv_bias
        )
        self.dt_bias = nn.Parameter(torch.ones(self.heads))
        self.A_log = nn.Parameter(torch.zeros(self.heads))
        self.D = nn.Parameter(torch.ones(self.heads))
        # Falcon-H1 may have no norm (only the gate) or norm before the gate; its out_proj has its own bias flag.
        if config.mamba_norm != "none":
            gate_first = config.mamba_norm == "gate_then_norm"
            self.norm = GroupedGatedRMSNorm(self.inner, self.groups, config.rms_norm_eps, gate_first)
        out_bias = config.mamba_proj_bias if config.mamba_out_bias is None else config.mamba_out_bias
        self.out_proj = Linear(self.inner, h, bias=out_bias)

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        """Shapes of one segment's cached state: end state ``b``, operator ``p``, conv tail."""
        return {
            "b": (self.heads, self.head_dim, self.state_size),
            "p": (self.heads,),
            "conv_tail": (self.conv_dim, self.kernel - 1),
        }

    def forward(self, x: torch.Tensor, ctx: Forward) -> torch.Tensor:
        """As ``GatedDeltaNet.forward``: padding is an exact identity (zero conv input, ``dt = 0``)."""
        state, pad_mask, capture, jumps = ctx.state, ctx.pad_mask, ctx.capture, ctx.jumps
        b, t, _ = x.shape
        if pad_mask is not None:
            x = torch.where(pad_mask[..., None], x, 0.0)
        layer = state.linear(self.layer_idx) if state is not None else None
        gate, xbc, dt = self.in_proj(x).split((self.inner, self.conv_dim, self.heads), dim=-1)
        if pad_mask is not None:  # a projection bias must not reach the conv from padding
            xbc = torch.where(pad_mask[..., None], xbc, 0.0)
        tail = layer.conv if layer else None
        xbc, tail = request_conv(
            xbc, tail, self.conv1d.weight[:, 0, :], self.conv1d.bias, jumps, self.layer_idx, ctx.marks
        )
        xbc = F.silu(xbc)
        xs, bm, cm = xbc.split((self.inner, self.groups * self.state_size, self.groups * self.state_size), dim=-1)
        dt = F.softplus(dt.float() + self.dt_bias.float()).clamp(min=self.dt_min, max=self.dt_max)
        if pad_mask is not None:
            dt = dt * pad_mask[..., None]
        rep = self.heads // self.groups
        xs = xs.reshape(b, t, self.heads, self.head_dim)
        bm = bm.reshape(b, t, self.groups, self.state_size).repeat_interleave(rep, dim=2)
        cm = cm.reshape(b, t, self.groups, self.state_size).repeat_interleave(rep, dim=2)
        a = -self.A_log.float().exp()
        s0 = layer.recurrent if layer is not None else None
        y, s_end = run_recurrence(
            self.layer_idx,
            SCALAR,
            t,
            s0,
            lambda: xs.new_zeros(b, self.heads, self.head_dim, self.state_size, dtype=torch.float32),
            lambda sl, start: ssd_scan(xs[:, sl], dt[:, sl], a, bm[:, sl], cm[:, sl], start),
            lambda rest_start: ssd_split_transition(xs, dt, a, bm, cm, rest_start),
            capture,
            jumps,
            ctx.marks,
        )
        if state is not None:
            state.set_linear(self.layer_idx, tail, s_end)
        y = (y + xs.float() * self.D.float()[:, None]).reshape(b, t, self.inner)
        if hasattr(self, "norm"):
            out = self.norm(y.to(x.dtype), gate)
        else:
            out = (y * F.silu(gate.float())).to(x.dtype)
        return self.out_proj(out)
