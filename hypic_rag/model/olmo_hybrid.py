"""OLMo hybrid (``olmo_hybrid``): Gated DeltaNet layers, pre-norm, and attention layers, post-norm.

The Gated DeltaNet mixer is Qwen3.5's (``deltanet.GatedDeltaNet``: the loader renames OLMo's separate
``q/k/v/g/a/b_proj`` into its fused layout) with beta doubled (``linear_allow_neg_eigval``) and its
read-out norm's own eps. Attention layers have no input norm: ``x + norm(attn(x))``, then
``x + norm(mlp(x))``; their q/k RMSNorm spans the whole projection, before the heads are split.
"""

from __future__ import annotations

import torch
from torch import nn

from hypic_rag.kernels.rope import apply_rope

from .attention import attend
from .config import LINEAR, HybridConfig
from .deltanet import GatedDeltaNet
from .layers import MLP, PlainRMSNorm
from .state import RequestState, SegmentJumps, TransitionCapture


class OlmoAttention(nn.Module):
    def __init__(self, config: HybridConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.heads, self.kv_heads, self.head_dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        )
        h, hd, bias = config.hidden_size, config.head_dim, config.attention_bias
        self.q_proj = nn.Linear(h, self.heads * hd, bias=bias)
        self.k_proj = nn.Linear(h, self.kv_heads * hd, bias=bias)
        self.v_proj = nn.Linear(h, self.kv_heads * hd, bias=bias)
        self.o_proj = nn.Linear(self.heads * hd, h, bias=bias)
        self.q_norm = PlainRMSNorm(self.heads * hd, config.rms_norm_eps)
        self.k_norm = PlainRMSNorm(self.kv_heads * hd, config.rms_norm_eps)
        self.rotary = config.rotary_dim > 0

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
        q = self.q_norm(self.q_proj(x)).view(b, t, self.heads, hd).transpose(1, 2)
        k = self.k_norm(self.k_proj(x)).view(b, t, self.kv_heads, hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, hd).transpose(1, 2)
        cos, sin, inv_freq = rope
        if self.rotary:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = attend(self.layer_idx, q, k, v, positions, inv_freq, state, pad_mask, hd**-0.5)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class OlmoHybridLayer(nn.Module):
    def __init__(self, config: HybridConfig, idx: int) -> None:
        super().__init__()
        self.is_linear = config.layer_types[idx] == LINEAR
        eps = config.rms_norm_eps
        if self.is_linear:
            self.linear_attn = GatedDeltaNet(config, idx)
            self.input_layernorm = PlainRMSNorm(config.hidden_size, eps)
        else:
            self.self_attn = OlmoAttention(config, idx)
            self.post_feedforward_layernorm = PlainRMSNorm(config.hidden_size, eps)
        self.post_attention_layernorm = PlainRMSNorm(config.hidden_size, eps)
        self.mlp = MLP(config.hidden_size, config.intermediate_size)

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
        if self.is_linear:
            x = x + self.linear_attn(self.input_layernorm(x), state, pad_mask, capture, jumps)
            return x + self.mlp(self.post_attention_layernorm(x))
        x = x + self.post_attention_layernorm(self.self_attn(x, positions, rope, state, pad_mask))
        return x + self.post_feedforward_layernorm(self.mlp(x))


class OlmoHybridBackbone(nn.Module):
    def __init__(self, config: HybridConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(OlmoHybridLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = PlainRMSNorm(config.hidden_size, config.rms_norm_eps)
