"""Gated full attention with q/k RMSNorm, partial rotate-half RoPE and GQA.

Keys are rotated at their absolute positions and masked by position, not by index, so a request state may
hold keys assembled out of order (HYPIC.md §3). For Qwen3.5's multi-axis RoPE, text-only positions
make all three axes equal, which is exactly 1-D RoPE; that is the only case we serve.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hypic_rag.kernels.rope import apply_rope
from hypic_rag.kernels.stitch import stitch

from .config import HybridConfig
from .layers import RMSNorm
from .state import RequestState


def attend(
    layer_idx: int,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    state: RequestState | None,
    pad_mask: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """Every attention layer's core, ``[B, Hq, T, D]``: the new keys join the request's KV and the
    queries attend over it by position (``stitch``), or, for a fresh state, causally over themselves.
    ``pad_mask [B, T]`` (True for real tokens) hides padding keys; it is for a fresh state only."""
    t = q.shape[2]
    if state is not None:
        kv = state.append_kv(layer_idx, k, v, positions)
        if kv.keys.shape[2] != t:  # earlier tokens are held: attend over the reassembled KV
            if pad_mask is not None:
                raise ValueError("pad_mask needs a fresh request state")
            return stitch(q, kv.keys, kv.values, positions, kv.positions, kv.shift, inv_freq, scale=scale)
    mask = None
    if pad_mask is not None:
        eye = torch.eye(t, dtype=torch.bool, device=q.device)
        # Each padding query sees itself, so no softmax row is empty (an empty row gives NaN).
        mask = (torch.ones_like(eye).tril() & pad_mask[:, None, None, :]) | eye
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=mask is None and t > 1, scale=scale, enable_gqa=True
    )


class PlainAttention(nn.Module):
    """Multi-head attention with GQA, no output gate or q/k norm: Nemotron-H's (no position encoding, so
    its cached keys move to any position without rotation), Granite-4.0-H's (RoPE or none, its own
    scale) and Bamba's (half the head rotated)."""

    def __init__(self, config: HybridConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = hd = config.head_dim
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * hd, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * hd, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * hd, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * hd, config.hidden_size, bias=bias)
        self.scale = config.attention_scale if config.attention_scale is not None else hd**-0.5
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
        q = self.q_proj(x).view(b, t, self.num_heads, hd).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.num_kv_heads, hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, hd).transpose(1, 2)
        cos, sin, inv_freq = rope
        if self.rotary:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = attend(self.layer_idx, q, k, v, positions, inv_freq, state, pad_mask, self.scale)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class GatedAttention(nn.Module):
    def __init__(self, config: HybridConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = hd = config.head_dim
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * hd * 2, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * hd, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * hd, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * hd, config.hidden_size, bias=bias)
        self.q_norm = RMSNorm(hd, config.rms_norm_eps)
        self.k_norm = RMSNorm(hd, config.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        state: RequestState | None,
        pad_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``rope`` is (cos, sin) at ``positions`` and the inverse frequencies. ``pad_mask [B, T]``
        (True for real tokens) hides padding keys; it is for a fresh state only."""
        b, t, _ = x.shape
        hd = self.head_dim
        q, gate = self.q_proj(x).view(b, t, self.num_heads, 2 * hd).chunk(2, dim=-1)
        gate = gate.reshape(b, t, -1)
        q = self.q_norm(q).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, t, self.num_kv_heads, hd)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, hd).transpose(1, 2)
        cos, sin, inv_freq = rope
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)

        out = attend(self.layer_idx, q, k, v, positions, inv_freq, state, pad_mask, hd**-0.5)
        return self._output(out, gate)

    def _output(self, out: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        b, _, t, _ = out.shape
        out = out.transpose(1, 2).reshape(b, t, -1) * torch.sigmoid(gate)
        return self.o_proj(out)
