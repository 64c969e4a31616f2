"""LFM2 (Liquid): gated short convolutions and attention with q/k RMSNorm, each followed by a SwiGLU.

The short conv is the whole of its linear state: ``y = C * conv(B * x)`` carries only the last
``kernel - 1`` values of ``B * x`` across a boundary, so its operator form is ``none`` — a cached segment
hands over its conv tail and nothing else, and no seam can repair more than that tail's reach.
Module names follow transformers' ``Lfm2ForCausalLM`` (``conv``, ``self_attn.out_proj``,
``q_layernorm``, ``feed_forward.w1/w2/w3``, ``operator_norm``, ``ffn_norm``, ``model.embedding_norm``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hypic_rag.kernels.algebra import NONE, SplitTransition
from hypic_rag.kernels.rope import apply_rope

from .attention import attend
from .block import PreNormLayer
from .config import LINEAR, HybridConfig
from .conv import request_conv
from .layers import PlainRMSNorm
from .state import RequestState, SegmentJumps, TransitionCapture


class ShortConv(nn.Module):
    operator_form = NONE

    def __init__(self, config: HybridConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        h, bias = config.hidden_size, config.short_conv_bias
        self.kernel = config.short_conv_kernel
        self.conv = nn.Conv1d(h, h, self.kernel, groups=h, bias=bias)
        self.in_proj = nn.Linear(h, 3 * h, bias=bias)
        self.out_proj = nn.Linear(h, h, bias=bias)

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"b": (0,), "p": (0,), "conv_tail": (self.conv.weight.shape[0], self.kernel - 1)}

    def forward(
        self,
        x: torch.Tensor,
        state: RequestState | None,
        pad_mask: torch.Tensor | None = None,
        capture: TransitionCapture | None = None,
        jumps: SegmentJumps | None = None,
        rope: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Padding is zero conv input (projection biases too), so a left-padded row is its real tokens alone."""
        b = x.shape[0]
        if pad_mask is not None:
            x = torch.where(pad_mask[..., None], x, 0.0)
        layer = state.linear(self.layer_idx) if state is not None else None
        gate_in, gate_out, inputs = self.in_proj(x).chunk(3, dim=-1)
        u = gate_in * inputs
        if pad_mask is not None:
            u = torch.where(pad_mask[..., None], u, 0.0)
        tail = layer.conv if layer else None
        mixed, tail = request_conv(u, tail, self.conv.weight[:, 0, :], self.conv.bias, jumps, self.layer_idx)
        empty = x.new_zeros(b, 0, dtype=torch.float32)
        if capture is not None:
            rest = empty if bool((capture.rest_start < x.shape[1]).any()) else None
            capture.operators[self.layer_idx] = SplitTransition(empty, empty, None, rest, rest)
        if state is not None:
            state.set_linear(self.layer_idx, tail, empty)
        return self.out_proj(gate_out * mixed)


class Lfm2Attention(nn.Module):
    def __init__(self, config: HybridConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = hd = config.head_dim
        h = config.hidden_size
        self.q_proj = nn.Linear(h, self.num_heads * hd, bias=False)
        self.k_proj = nn.Linear(h, self.num_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(h, self.num_kv_heads * hd, bias=False)
        self.out_proj = nn.Linear(self.num_heads * hd, h, bias=False)
        self.q_layernorm = PlainRMSNorm(hd, config.rms_norm_eps)
        self.k_layernorm = PlainRMSNorm(hd, config.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        state: RequestState | None,
        pad_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        b, t, _ = x.shape
        hd = self.head_dim
        q = self.q_layernorm(self.q_proj(x).view(b, t, self.num_heads, hd)).transpose(1, 2)
        k = self.k_layernorm(self.k_proj(x).view(b, t, self.num_kv_heads, hd)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, hd).transpose(1, 2)
        cos, sin, inv_freq = rope
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = attend(self.layer_idx, q, k, v, positions, inv_freq, state, pad_mask, hd**-0.5)
        return self.out_proj(out.transpose(1, 2).reshape(b, t, -1))


class SwiGLU(nn.Module):
    """``w2(silu(w1 x) * w3 x)``."""

    def __init__(self, hidden: int, size: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(hidden, size, bias=False)
        self.w2 = nn.Linear(size, hidden, bias=False)
        self.w3 = nn.Linear(hidden, size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Lfm2Layer(PreNormLayer):
    def __init__(self, config: HybridConfig, idx: int) -> None:
        linear = config.layer_types[idx] == LINEAR
        super().__init__(
            linear,
            ("conv", ShortConv(config, idx)) if linear else ("self_attn", Lfm2Attention(config, idx)),
            ("feed_forward", SwiGLU(config.hidden_size, config.intermediate_size)),
            ("operator_norm", PlainRMSNorm(config.hidden_size, config.rms_norm_eps)),
            ("ffn_norm", PlainRMSNorm(config.hidden_size, config.rms_norm_eps)),
        )


class Lfm2Backbone(nn.Module):
    def __init__(self, config: HybridConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Lfm2Layer(config, i) for i in range(config.num_hidden_layers))
        self.embedding_norm = PlainRMSNorm(config.hidden_size, config.rms_norm_eps)  # the final norm
