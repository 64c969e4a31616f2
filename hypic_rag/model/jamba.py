"""Jamba (``jamba``): Mamba1 and attention layers (no position encoding), each followed by a SwiGLU or, every
``expert_layer_period``-th layer, a softmax-routed MoE.

Mamba1's decay differs per channel and state index, so its operator is diagonal (``kernels.algebra.
DIAGONAL``): the state is held as ``[D, S, 1]`` and a segment's operator is ``exp(A * sum dt)`` ``[D, S]``.
Module names follow transformers' ``JambaForCausalLM``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hypic_rag.kernels.algebra import DIAGONAL, selective_split_transition
from hypic_rag.kernels.selective_scan import selective_scan

from .attention import PlainAttention
from .block import PreNormLayer
from .config import LINEAR, HybridConfig
from .conv import request_conv
from .layers import MLP, Experts, PlainRMSNorm, Router
from .recurrence import run_recurrence
from .state import RequestState, SegmentJumps, TransitionCapture


class Mamba1Mixer(nn.Module):
    operator_form = DIAGONAL

    def __init__(self, config: HybridConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        h, inner, s, rank = config.hidden_size, config.mamba1_inner, config.ssm_state_size, config.mamba_dt_rank
        self.inner, self.state_size, self.rank, self.kernel = inner, s, rank, config.mamba_conv_kernel
        self.in_proj = nn.Linear(h, 2 * inner, bias=config.mamba_proj_bias)
        self.conv1d = nn.Conv1d(inner, inner, self.kernel, groups=inner, bias=config.mamba_conv_bias)
        self.x_proj = nn.Linear(inner, rank + 2 * s, bias=False)
        self.dt_proj = nn.Linear(rank, inner, bias=True)
        self.A_log = nn.Parameter(torch.zeros(inner, s))
        self.D = nn.Parameter(torch.ones(inner))
        self.out_proj = nn.Linear(inner, h, bias=config.mamba_proj_bias)
        self.dt_layernorm = PlainRMSNorm(rank, config.rms_norm_eps)
        self.b_layernorm = PlainRMSNorm(s, config.rms_norm_eps)
        self.c_layernorm = PlainRMSNorm(s, config.rms_norm_eps)

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        return {
            "b": (self.inner, self.state_size, 1),
            "p": (self.inner, self.state_size),
            "conv_tail": (self.inner, self.kernel - 1),
        }

    def forward(
        self,
        x: torch.Tensor,
        state: RequestState | None,
        pad_mask: torch.Tensor | None = None,
        capture: TransitionCapture | None = None,
        jumps: SegmentJumps | None = None,
        rope: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Padding is an exact identity (zero conv input, ``dt = 0``)."""
        b, t, _ = x.shape
        if pad_mask is not None:
            x = torch.where(pad_mask[..., None], x, 0.0)
        layer = state.linear(self.layer_idx) if state is not None else None
        xs, gate = self.in_proj(x).chunk(2, dim=-1)
        if pad_mask is not None:
            xs = torch.where(pad_mask[..., None], xs, 0.0)
        tail = layer.conv if layer else None
        xs, tail = request_conv(xs, tail, self.conv1d.weight[:, 0, :], self.conv1d.bias, jumps, self.layer_idx)
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
        )
        if state is not None:
            state.set_linear(self.layer_idx, tail, s_end)
        y = (y + xs.float() * self.D.float()) * F.silu(gate.float())
        return self.out_proj(y.to(x.dtype))


class JambaMoE(nn.Module):
    """Softmax router whose top-k weights are not renormalised; gated experts."""

    def __init__(self, config: HybridConfig) -> None:
        super().__init__()
        self.router = Router(config)
        self.experts = Experts(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights, idx = self.router(flat)
        return self.experts(flat, weights, idx).reshape(x.shape)


class JambaLayer(PreNormLayer):
    def __init__(self, config: HybridConfig, idx: int) -> None:
        linear = config.layer_types[idx] == LINEAR
        dense = idx in config.mlp_only_layers
        super().__init__(
            linear,
            ("mamba", Mamba1Mixer(config, idx)) if linear else ("self_attn", PlainAttention(config, idx)),
            ("feed_forward", MLP(config.hidden_size, config.intermediate_size) if dense else JambaMoE(config)),
            ("input_layernorm", PlainRMSNorm(config.hidden_size, config.rms_norm_eps)),
            ("pre_ff_layernorm", PlainRMSNorm(config.hidden_size, config.rms_norm_eps)),
        )


class JambaBackbone(nn.Module):
    def __init__(self, config: HybridConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(JambaLayer(config, i) for i in range(config.num_hidden_layers))
        self.final_layernorm = PlainRMSNorm(config.hidden_size, config.rms_norm_eps)
