"""KDA (Kimi Delta Attention: Kimi Linear, Ling 3.0): the gated delta rule with a decay per key channel
(``kernels.kda``), so its operator is dense, as Gated DeltaNet's is.

``DeltaAttentionBase`` is the body both families share; ``KimiDeltaAttention`` and ``BailingDeltaAttention``
give the decay, the read-out gate and the output projection under their checkpoints' names.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hypic_rag.kernels.algebra import DENSE, kda_split_transition
from hypic_rag.kernels.delta_rule import l2norm
from hypic_rag.kernels.kda import kda_scan

from ..config import HybridConfig
from ..context import Forward
from ..layers import PlainRMSNorm
from ..linear import Linear
from .conv import request_conv
from .recurrence import run_recurrence


class ForgetGate(nn.Module):
    """The per-channel log-decay ``-exp(A_log[h]) * softplus(f_b(f_a(x)) + dt_bias)``."""

    def __init__(self, hidden: int, heads: int, dim: int) -> None:
        super().__init__()
        self.heads, self.dim = heads, dim
        self.f_a_proj = Linear(hidden, dim, bias=False)
        self.f_b_proj = Linear(dim, heads * dim, bias=False)
        self.dt_bias = nn.Parameter(torch.zeros(heads * dim))
        self.A_log = nn.Parameter(torch.zeros(1, 1, heads, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        z = self.f_b_proj(self.f_a_proj(x)).float() + self.dt_bias.float()
        return -self.A_log.float().exp() * F.softplus(z).view(b, t, self.heads, self.dim)


class DeltaAttentionBase(nn.Module):
    """KDA's shared body (q/k/v projections, their short conv, beta, the scan, the per-head read-out norm);
    subclasses give the per-channel decay (``decay``), the read-out gate (``output_gate``) and the output
    projection (``project``), each under its checkpoint's names."""

    operator_form = DENSE

    def __init__(self, config: HybridConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        h = config.hidden_size
        self.heads, self.dim = config.linear_num_value_heads, config.linear_value_head_dim
        self.inner = inner = self.heads * self.dim
        self.kernel = config.linear_conv_kernel_dim
        self.q_proj = Linear(h, inner, bias=False)
        self.k_proj = Linear(h, inner, bias=False)
        self.v_proj = Linear(h, inner, bias=False)
        self.conv1d = nn.Conv1d(3 * inner, 3 * inner, self.kernel, groups=3 * inner, bias=False)
        self.b_proj = Linear(h, self.heads, bias=False)
        self.o_norm = PlainRMSNorm(self.dim, config.rms_norm_eps)

    def decay(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def output_gate(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def project(self, out: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        d = self.dim
        return {"b": (self.heads, d, d), "p": (self.heads, d, d), "conv_tail": (3 * self.heads * d, self.kernel - 1)}

    def forward(self, x: torch.Tensor, ctx: Forward) -> torch.Tensor:
        """Padding is an exact identity (zero conv input, ``g = beta = 0``)."""
        state, pad_mask, capture, jumps = ctx.state, ctx.pad_mask, ctx.capture, ctx.jumps
        b, t, _ = x.shape
        if pad_mask is not None:
            x = torch.where(pad_mask[..., None], x, 0.0)
        layer = state.linear(self.layer_idx) if state is not None else None
        mixed = torch.cat((self.q_proj(x), self.k_proj(x), self.v_proj(x)), dim=-1)
        tail = layer.conv if layer else None
        mixed, tail = request_conv(mixed, tail, self.conv1d.weight[:, 0, :], None, jumps, self.layer_idx, ctx.marks)
        q, k, v = (y.reshape(b, t, self.heads, self.dim) for y in F.silu(mixed).chunk(3, dim=-1))
        g = self.decay(x)
        beta = torch.sigmoid(self.b_proj(x).float())
        if pad_mask is not None:
            g, beta = g * pad_mask[..., None, None], beta * pad_mask[..., None]
        q = l2norm(q.float()) * self.dim**-0.5
        k = l2norm(k.float())
        y, s_end = run_recurrence(
            self.layer_idx,
            DENSE,
            t,
            layer.recurrent if layer is not None else None,
            lambda: q.new_zeros(b, self.heads, self.dim, self.dim),
            lambda sl, start: kda_scan(q[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl], start),
            lambda rest_start: kda_split_transition(q, k, v, g, beta, rest_start),
            capture,
            jumps,
            ctx.marks,
        )
        if state is not None:
            state.set_linear(self.layer_idx, tail, s_end)
        gate = self.output_gate(x).view(b, t, self.heads, self.dim)
        out = self.o_norm(y.to(x.dtype)) * torch.sigmoid(gate.float()).to(x.dtype)
        return self.project(out.reshape(b, t, -1))


class KimiDeltaAttention(DeltaAttentionBase):
    def __init__(self, config: HybridConfig, layer_idx: int) -> None:
        super().__init__(config, layer_idx)
        h = config.hidden_size
        self.forget_gate = ForgetGate(h, self.heads, self.dim)
        self.g_a_proj = Linear(h, self.dim, bias=False)
        self.g_b_proj = Linear(self.dim, self.inner, bias=False)
        self.o_proj = Linear(self.inner, h, bias=False)

    def decay(self, x: torch.Tensor) -> torch.Tensor:
        return self.forget_gate(x)

    def output_gate(self, x: torch.Tensor) -> torch.Tensor:
        return self.g_b_proj(self.g_a_proj(x))

    def project(self, out: torch.Tensor) -> torch.Tensor:
        return self.o_proj(out)


class BailingDeltaAttention(DeltaAttentionBase):
    """Ling 3.0's KDA (``bailing_hybrid``): the decay from one projection, ``f_proj``, bounded below by
    ``kda_lower_bound`` when ``kda_safe_gate`` (``lower * sigmoid(exp(A_log) * (f + dt_bias))``, else Kimi's
    ``-exp(A_log) * softplus(f + dt_bias)``); read-out gated by ``g_proj``; output ``dense``. Checkpoint names."""

    def __init__(self, config: HybridConfig, layer_idx: int) -> None:
        super().__init__(config, layer_idx)
        h = config.hidden_size
        self.A_log = nn.Parameter(torch.zeros(self.heads))
        self.dt_bias = nn.Parameter(torch.zeros(self.inner))
        self.f_proj = Linear(h, self.inner, bias=False)
        self.g_proj = Linear(h, self.inner, bias=False)
        self.dense = Linear(self.inner, h, bias=False)
        self.safe_gate, self.lower_bound = config.kda_safe_gate, config.kda_lower_bound

    def decay(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        z = (self.f_proj(x).float() + self.dt_bias.float()).view(b, t, self.heads, self.dim)
        rate = self.A_log.float().exp()[:, None]
        if self.safe_gate:
            return self.lower_bound * torch.sigmoid(rate * z)
        return -rate * F.softplus(z)

    def output_gate(self, x: torch.Tensor) -> torch.Tensor:
        return self.g_proj(x)

    def project(self, out: torch.Tensor) -> torch.Tensor:
        return self.dense(out)
