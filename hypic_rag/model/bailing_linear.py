"""Ring-linear-2.0 (``bailing_moe_linear``: Ring-mini-linear-2.0, Ring-flash-linear-2.0), which transformers
does not ship: Lightning attention layers and, every ``layer_group_size``-th layer, softmax attention; a
dense SwiGLU in the first layers, then a sigmoid-routed MoE with shared experts.

Its Lightning layers are MiniMax's recurrence (``S_t = lam S_{t-1} + k_t v_t^T``, a scalar operator per head,
on ``kernels.ssd``) with three differences that matter here: q and k are RMS-normed per head and RoPE-rotated
(partially, as in the softmax layers), q is scaled by ``D^-0.5``, and the read-out is a group RMSNorm gated
by ``sigmoid(g_proj(x))``. Because keys are rotated, a segment's state ``B`` is held in the frame of its
first token: placed at position ``o`` its key axis is rotated by ``o`` (``R(o) B``; rotations compose and
the scalar ``P`` commutes with them) — the linear-state counterpart of moving cached keys (``place_state``).

Parity rests on the published architecture as the open ports (mlx-lm, sglang, vLLM) implement it and on an
independent token-by-token oracle in the tests, not on the original remote code, which is not here; the
per-layer decay factor follows the reference's ``1 - (i - 1) / (L - 1) + 1e-5``. Weight names are the
checkpoint's (``model.word_embeddings``, ``attention.query_key_value``, ``attention.dense``, ``g_proj``,
``g_norm``, ``mlp.gate.expert_bias``, experts one module each).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from hypic_rag.kernels.algebra import SCALAR, rerotate
from hypic_rag.kernels.rope import apply_rope

from .attention import attend
from .block import GroupRoutedLayer
from .config import HybridConfig
from .layers import PlainRMSNorm
from .minimax import lightning
from .state import RequestState, SegmentJumps, TransitionCapture


def alibi_slopes(heads: int) -> list[float]:
    """ALiBi's per-head slopes: ``(2^(-8/H))^(i+1)`` for a power of two ``H``, else those of the largest power
    of two below it followed by every other slope of twice that."""

    def power_of_two(n: int) -> list[float]:
        base = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [base ** (i + 1) for i in range(n)]

    if math.log2(heads).is_integer():
        return power_of_two(heads)
    below = 2 ** math.floor(math.log2(heads))
    return power_of_two(below) + power_of_two(2 * below)[0::2][: heads - below]


def ring_log_decay(heads: int, layer_idx: int, layers: int) -> torch.Tensor:
    factor = 1 - (layer_idx - 1) / (layers - 1) + 1e-5 if layers > 1 else 1.0
    return -torch.tensor([s * factor for s in alibi_slopes(heads)], dtype=torch.float32)


class GroupRMSNorm(nn.Module):
    """RMSNorm over each of ``groups`` slices of the channels, in fp32, times a full-width weight."""

    def __init__(self, dim: int, groups: int, eps: float) -> None:
        super().__init__()
        self.groups, self.eps = groups, eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = x.float().view(*x.shape[:-1], self.groups, -1)
        g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * g.view(x.shape)).to(x.dtype)


class RingLightningAttention(nn.Module):
    operator_form = SCALAR

    def __init__(self, config: HybridConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx, self.layers = layer_idx, config.num_hidden_layers
        self.heads, self.head_dim = config.num_attention_heads, config.head_dim
        h, inner = config.hidden_size, config.num_attention_heads * config.head_dim
        self.silu, self.qk_norm, self.rotary = config.ring_linear_silu, config.ring_qk_norm, config.ring_linear_rope
        self.query_key_value = nn.Linear(h, 3 * inner, bias=config.attention_bias)
        if self.qk_norm:
            self.query_layernorm = PlainRMSNorm(self.head_dim, config.rms_norm_eps)
            self.key_layernorm = PlainRMSNorm(self.head_dim, config.rms_norm_eps)
        self.g_proj = nn.Linear(h, inner, bias=False)
        self.g_norm = GroupRMSNorm(inner, config.ring_group_norm_size, config.rms_norm_eps)
        self.dense = nn.Linear(inner, h, bias=config.attention_bias)
        self._decay: torch.Tensor | None = None

    def log_decay(self, device: torch.device) -> torch.Tensor:
        """As ``LightningAttention.log_decay``, with Ring-linear's slopes."""
        if self._decay is None or self._decay.device != device:
            self._decay = ring_log_decay(self.heads, self.layer_idx, self.layers).to(device)
        return self._decay

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"b": (self.heads, self.head_dim, self.head_dim), "p": (self.heads,), "conv_tail": (0, 0)}

    def place_state(self, b: torch.Tensor, offset: int, inv_freq: torch.Tensor) -> torch.Tensor:
        """A state built from keys rotated as if its segment began at 0, moved to begin at ``offset``: its key
        axis (the last) rotated by ``offset`` with the model's RoPE frequencies."""
        if not offset or not self.rotary or inv_freq.numel() == 0:
            return b
        delta = torch.full((b.shape[-2],), offset, device=b.device)
        return rerotate(b, delta, inv_freq)

    def forward(
        self,
        x: torch.Tensor,
        state: RequestState | None,
        pad_mask: torch.Tensor | None = None,
        capture: TransitionCapture | None = None,
        jumps: SegmentJumps | None = None,
        rope: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``rope`` (cos, sin at the tokens' positions, and the frequencies) is required: its keys rotate."""
        if rope is None:
            raise ValueError("Ring-linear's Lightning layers need the RoPE tables of the tokens' positions")
        b, t, _ = x.shape
        qkv = self.query_key_value(x)
        if self.silu:
            qkv = torch.nn.functional.silu(qkv)
        q, k, v = (y.view(b, t, self.heads, self.head_dim) for y in qkv.chunk(3, dim=-1))
        if self.qk_norm:
            q, k = self.query_layernorm(q), self.key_layernorm(k)
        cos, sin, _ = rope
        if self.rotary:  # ``linear_rope`` (default true): the Lightning keys rotate as the softmax ones do
            q, k = (apply_rope(y.transpose(1, 2), cos, sin).transpose(1, 2) for y in (q, k))
        q = q * self.head_dim**-0.5
        y = lightning(self.layer_idx, q, k, v, pad_mask, self.log_decay(x.device), state, capture, jumps)
        out = self.g_norm(y.reshape(b, t, -1).to(x.dtype))
        return self.dense(out * torch.sigmoid(self.g_proj(x)))


class RingSoftmaxAttention(nn.Module):
    """GQA over a fused ``query_key_value``, per-head q/k RMSNorm, partial RoPE, no output gate."""

    def __init__(self, config: HybridConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.heads, self.kv_heads, self.head_dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        )
        h, hd = config.hidden_size, config.head_dim
        self.query_key_value = nn.Linear(h, (self.heads + 2 * self.kv_heads) * hd, bias=config.attention_bias)
        self.qk_norm = config.ring_qk_norm
        if self.qk_norm:
            self.query_layernorm = PlainRMSNorm(hd, config.rms_norm_eps)
            self.key_layernorm = PlainRMSNorm(hd, config.rms_norm_eps)
        self.dense = nn.Linear(self.heads * hd, h, bias=config.attention_bias)

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
        q, k, v = self.query_key_value(x).split((self.heads * hd, self.kv_heads * hd, self.kv_heads * hd), dim=-1)
        q, k = q.view(b, t, self.heads, hd), k.view(b, t, self.kv_heads, hd)
        if self.qk_norm:
            q, k = self.query_layernorm(q), self.key_layernorm(k)
        cos, sin, inv_freq = rope
        q, k = apply_rope(q.transpose(1, 2), cos, sin), apply_rope(k.transpose(1, 2), cos, sin)
        v = v.view(b, t, self.kv_heads, hd).transpose(1, 2)
        out = attend(self.layer_idx, q, k, v, positions, inv_freq, state, pad_mask, hd**-0.5)
        return self.dense(out.transpose(1, 2).reshape(b, t, -1))


class RingBackbone(nn.Module):
    def __init__(self, config: HybridConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            GroupRoutedLayer(config, i, "attention", RingLightningAttention, RingSoftmaxAttention)
            for i in range(config.num_hidden_layers)
        )
        self.norm = PlainRMSNorm(config.hidden_size, config.rms_norm_eps)
