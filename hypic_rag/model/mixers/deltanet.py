"""The Gated DeltaNet token mixer: projections, causal conv1d with a carried tail, the delta rule,
and the gated RMSNorm read-out.

Weights use Qwen3.5's split layout (``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``, ``in_proj_a``);
the loader converts Qwen3-Next's fused, interleaved ``in_proj_qkvz``/``in_proj_ba`` into it.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from hypic_rag.kernels.algebra import DENSE, split_transition
from hypic_rag.kernels.delta_rule import chunk_gated_delta_rule, l2norm, recurrent_gated_delta_rule
from hypic_rag.kernels.scan import Jumps, scan_marked, scan_with_jumps

from ..config import HybridConfig
from ..context import Forward
from ..layers import GatedRMSNorm
from ..linear import Linear
from ..state import StateMarks
from .conv import request_conv


class GatedDeltaNet(nn.Module):
    operator_form = DENSE

    def __init__(self, config: HybridConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_k_heads = config.linear_num_key_heads
        self.num_v_heads = config.linear_num_value_heads
        self.dk = config.linear_key_head_dim
        self.dv = config.linear_value_head_dim
        self.key_dim = config.linear_key_dim
        self.value_dim = config.linear_value_dim
        self.kernel = config.linear_conv_kernel_dim
        self.conv_dim = config.conv_dim
        h = config.hidden_size
        self.in_proj_qkv = Linear(h, self.conv_dim, bias=False)
        self.in_proj_z = Linear(h, self.value_dim, bias=False)
        self.in_proj_b = Linear(h, self.num_v_heads, bias=False)
        self.in_proj_a = Linear(h, self.num_v_heads, bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, self.kernel, groups=self.conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.num_v_heads))
        self.A_log = nn.Parameter(torch.zeros(self.num_v_heads))
        self.norm = GatedRMSNorm(self.dv, config.linear_norm_eps or config.rms_norm_eps)
        self.beta_scale = config.linear_beta_scale  # OLMo hybrid's 2: negative eigenvalues allowed
        self.out_proj = Linear(self.value_dim, h, bias=False)

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        """Shapes of one segment's cached state: end state ``b``, operator ``p``, conv tail."""
        return {
            "b": (self.num_v_heads, self.dk, self.dv),
            "p": (self.num_v_heads, self.dk, self.dk),
            "conv_tail": (self.conv_dim, self.kernel - 1),
        }

    def token_shapes(self) -> dict[str, tuple[int, int]]:
        """Per token, the shapes ``(heads, width)`` of a segment kept as its delta-rule inputs
        (``cache.entry.LinearTokens``): keys per key head, values and (log gate, beta) per value head."""
        heads = self.num_v_heads
        return {"keys": (self.num_k_heads, self.dk), "values": (heads, self.dv), "gates": (heads, 2)}

    def _marked(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        s0: torch.Tensor | None,
        marks: StateMarks,
        start: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The rule over the tokens from ``start`` (``s0`` the state there) in one chunked pass that records the
        state at each of ``marks``."""
        cuts = [hi - start for _, hi in marks.pieces(q.shape[1], start)[:-1]]
        out, state, states = scan_marked(*(y[:, start:] for y in (q, k, v, g, beta)), s0, cuts)
        marks.recurrent[self.layer_idx] = states
        return out, state

    def forward(self, x: torch.Tensor, ctx: Forward) -> torch.Tensor:
        """``pad_mask [B, T]`` is True for real tokens. Padding is made an exact identity for the state
        (zero input and zero decay), so left-padded rows end in the state of their real tokens.
        ``capture`` records this layer's segment operators (zero start only); ``jumps`` skips the
        state over cached segments between the tokens of a fused forward."""
        state, pad_mask, capture, jumps = ctx.state, ctx.pad_mask, ctx.capture, ctx.jumps
        b, t, _ = x.shape
        if pad_mask is not None:
            x = torch.where(pad_mask[..., None], x, 0.0)
        layer = state.linear(self.layer_idx) if state is not None else None
        ops = jumps.linear[self.layer_idx] if jumps is not None else None
        tail = layer.conv if layer else None
        mixed, tail = request_conv(
            self.in_proj_qkv(x), tail, self.conv1d.weight[:, 0, :], None, jumps, self.layer_idx, ctx.marks
        )
        mixed = F.silu(mixed)
        q, k, v = mixed.split((self.key_dim, self.key_dim, self.value_dim), dim=-1)
        z = self.in_proj_z(x)
        beta = torch.sigmoid(self.in_proj_b(x))
        if self.beta_scale != 1.0:
            beta = beta * self.beta_scale
        g = -self.A_log.float().exp() * F.softplus(self.in_proj_a(x).float() + self.dt_bias)
        if pad_mask is not None:
            g = g * pad_mask[..., None]

        rep = self.num_v_heads // self.num_k_heads
        q = q.reshape(b, t, self.num_k_heads, self.dk)
        k = k.reshape(b, t, self.num_k_heads, self.dk)
        if rep > 1:
            q, k = q.repeat_interleave(rep, dim=2), k.repeat_interleave(rep, dim=2)
        v = v.reshape(b, t, self.num_v_heads, self.dv)
        q = l2norm(q.float()) * self.dk**-0.5
        k = l2norm(k.float())
        v, g, beta = v.float(), g.float(), beta.float()
        s0 = layer.recurrent if layer is not None else None
        if ops is not None:
            kept = jumps.tokens.get(self.layer_idx)
            upto = ctx.marks.after(jumps.at) if ctx.marks is not None else t
            ahead = (y[:, :upto] for y in (q, k, v, g, beta))
            out, s_end = scan_with_jumps(*ahead, s0, Jumps(jumps.at, jumps.src, *ops[:2], kept))
            if ctx.marks is not None:  # the query after the jumps, cut at the marks
                rest, s_end = self._marked(q, k, v, g, beta, s_end, ctx.marks, upto)
                out = torch.cat((out, rest), dim=1)
        elif capture is not None:
            if s0 is not None:
                raise ValueError("transitions are captured from a zero start only")
            split = split_transition(q, k, v, g, beta, capture.rest_start)
            out, s_end = split.out, split.state
            capture.operators[self.layer_idx] = replace(split, out=None)
            capture.inputs[self.layer_idx] = (k[:, :, ::rep], v, g, beta)  # keys per key head, as kept
        elif ctx.marks is not None:
            out, s_end = self._marked(q, k, v, g, beta, s0, ctx.marks)
        else:
            q, k, v, g, beta = (y.transpose(1, 2) for y in (q, k, v, g, beta))
            if s0 is not None and t == 1:
                out, s_end = recurrent_gated_delta_rule(q, k, v, g, beta, s0, overwrite=layer.scratch)
            else:
                out, s_end = chunk_gated_delta_rule(q, k, v, g, beta, s0)
            out = out.transpose(1, 2)
        if state is not None:
            state.set_linear(self.layer_idx, tail, s_end)
        out = out.to(x.dtype)
        out = self.norm(out, z.view(b, t, self.num_v_heads, self.dv))
        return self.out_proj(out.reshape(b, t, -1))
