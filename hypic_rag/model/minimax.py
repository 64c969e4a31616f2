"""MiniMax (MiniMax-Text-01): Lightning attention and softmax attention layers, each followed by a MoE.

Lightning attention is linear attention with a fixed decay per head: ``S_t = lam S_{t-1} + k_t v_t^T``,
``o_t = q_t S_t``, ``lam = exp(-slope)``, the slopes set by the head and the layer's depth. That is Mamba2's
scan with ``dt = 1``, ``a = -slope``, ``x = v``, ``B = k``, ``C = q`` (``kernels.ssd``), so its operator is
a scalar per head (``lam ** T``) and it shares Mamba2's capture and jumps. The residual is taken after
the input norm (transformers' ``postnorm``), scaled by the alpha/beta factors.

Module names follow transformers' ``MiniMaxForCausalLM``; the decay tables it stores as buffers are
recomputed here, not loaded.
"""

from __future__ import annotations

import torch
from torch import nn

from hypic_rag.kernels.algebra import SCALAR, ssd_split_transition
from hypic_rag.kernels.ssd import ssd_scan

from .attention import PlainAttention
from .config import LINEAR, HybridConfig
from .layers import Experts, PlainRMSNorm, Router
from .recurrence import run_recurrence
from .state import RequestState, SegmentJumps, TransitionCapture


def lightning_slopes(heads: int, layer_idx: int, layers: int) -> torch.Tensor:
    """Per-head decay rates: ``(2^(-8/H))^(h+1)``, scaled down with depth (transformers' ``get_slope_rate``)."""
    base = 1 / (2 ** (8 / heads))
    factor = 1 - layer_idx / (layers - 1 + 1e-5) + 1e-5
    return torch.tensor([base ** (h + 1) * factor for h in range(heads)], dtype=torch.float32)


def lightning(
    layer_idx: int,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pad_mask: torch.Tensor | None,
    log_decay: torch.Tensor,
    state: RequestState | None,
    capture: TransitionCapture | None,
    jumps: SegmentJumps | None,
) -> torch.Tensor:
    """The Lightning recurrence (``q, k, v [B, T, H, D]``) on the SSD scan, in whichever way the forward runs
    it; updates the request's state; returns the outputs fp32. Padding (``pad_mask`` False) is an exact
    identity: zero q, k, v and no decay (``dt`` 0, 1 per real token)."""
    b, t, h, d = v.shape
    dt = v.new_ones(b, t, h, dtype=torch.float32)
    if pad_mask is not None:
        keep = pad_mask[..., None, None]
        q, k, v = (torch.where(keep, y, 0.0) for y in (q, k, v))
        dt = dt * pad_mask[..., None]
    layer = state.linear(layer_idx) if state is not None else None
    y, end = run_recurrence(
        layer_idx,
        SCALAR,
        t,
        layer.recurrent if layer is not None else None,
        lambda: v.new_zeros(b, h, d, d, dtype=torch.float32),
        lambda sl, start: ssd_scan(v[:, sl], dt[:, sl], log_decay, k[:, sl], q[:, sl], start),
        lambda rest_start: ssd_split_transition(v, dt, log_decay, k, q, rest_start),
        capture,
        jumps,
    )
    if state is not None:
        state.set_linear(layer_idx, v.new_zeros(b, 0, 0), end)  # no conv: an empty tail
    return y


class LightningAttention(nn.Module):
    operator_form = SCALAR

    def __init__(self, config: HybridConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.heads, self.head_dim = config.num_attention_heads, config.head_dim
        inner = self.heads * self.head_dim
        self.qkv_proj = nn.Linear(config.hidden_size, 3 * inner, bias=False)
        self.output_gate = nn.Linear(config.hidden_size, inner, bias=False)
        self.out_proj = nn.Linear(inner, config.hidden_size, bias=False)
        self.norm = PlainRMSNorm(inner, 1e-6)  # transformers' MiniMaxRMSNorm default, not rms_norm_eps
        self.layers = config.num_hidden_layers
        self._decay: torch.Tensor | None = None

    def log_decay(self, device: torch.device) -> torch.Tensor:
        """The fixed per-head log-decays on ``device``, made once (not at build, which runs on the meta
        device; not in the state dict, so checkpoints' stored tables are not read)."""
        if self._decay is None or self._decay.device != device:
            self._decay = -lightning_slopes(self.heads, self.layer_idx, self.layers).to(device)
        return self._decay

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"b": (self.heads, self.head_dim, self.head_dim), "p": (self.heads,), "conv_tail": (0, 0)}

    def forward(
        self,
        x: torch.Tensor,
        state: RequestState | None,
        pad_mask: torch.Tensor | None = None,
        capture: TransitionCapture | None = None,
        jumps: SegmentJumps | None = None,
        rope: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Padding is an exact identity (``lightning``)."""
        b, t, _ = x.shape
        qkv = torch.nn.functional.silu(self.qkv_proj(x)).view(b, t, self.heads, 3 * self.head_dim)
        q, k, v = qkv.split(self.head_dim, dim=-1)
        y = lightning(self.layer_idx, q, k, v, pad_mask, self.log_decay(x.device), state, capture, jumps)
        out = self.norm(y.reshape(b, t, -1).to(x.dtype))
        return self.out_proj(torch.sigmoid(self.output_gate(x)) * out)


class MiniMaxMoE(nn.Module):
    """Softmax router, top-k renormalised, no shared expert."""

    def __init__(self, config: HybridConfig) -> None:
        super().__init__()
        self.gate = Router(config)
        self.experts = Experts(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights, idx = self.gate(flat)
        return self.experts(flat, weights, idx).reshape(x.shape)


class MiniMaxLayer(nn.Module):
    def __init__(self, config: HybridConfig, idx: int) -> None:
        super().__init__()
        self.is_linear = config.layer_types[idx] == LINEAR
        self.self_attn: nn.Module = LightningAttention(config, idx) if self.is_linear else PlainAttention(config, idx)
        self.input_layernorm = PlainRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = PlainRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MiniMaxMoE(config)
        alpha, beta = config.residual_factors["linear_attn" if self.is_linear else "full_attn"]
        self.attn_alpha, self.attn_beta = alpha, beta
        self.mlp_alpha, self.mlp_beta = config.residual_factors["mlp"]

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        state: RequestState | None,
        pad_mask: torch.Tensor | None = None,
        capture: TransitionCapture | None = None,
        jumps: SegmentJumps | None = None,
    ) -> torch.Tensor:
        h = self.input_layernorm(x)
        if self.is_linear:
            out = self.self_attn(h, state, pad_mask, capture, jumps)
        else:
            out = self.self_attn(h, positions, rope, state, pad_mask)
        h = self.post_attention_layernorm(h * self.attn_alpha + out * self.attn_beta)
        return h * self.mlp_alpha + self.mlp(h) * self.mlp_beta


class MiniMaxBackbone(nn.Module):
    def __init__(self, config: HybridConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(MiniMaxLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = PlainRMSNorm(config.hidden_size, config.rms_norm_eps)
