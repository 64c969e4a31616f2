"""Lightning attention (MiniMax, Ring-linear-2.0): linear attention with a fixed decay per head,
``S_t = lam S_{t-1} + k_t v_t^T``, ``o_t = q_t S_t``, ``lam = exp(-slope)``, the slopes set by the head and
the layer's depth. That is Mamba2's scan with ``dt = 1``, ``a = -slope``, ``x = v``, ``B = k``, ``C = q``
(``kernels.ssd``), so its operator is a scalar per head (``lam ** T``) and it shares Mamba2's capture and
jumps.

MiniMax's layer (``LightningAttention``) projects q, k, v through a SiLU; Ring-linear's
(``RingLightningAttention``) RMS-norms q and k per head and RoPE-rotates them (partially, as in its softmax
layers), scales q by ``D^-0.5`` and reads out through a group RMSNorm gated by ``sigmoid(g_proj(x))``.
Because its keys are rotated, a segment's state ``B`` is held in the frame of its first token: placed at
position ``o`` its key axis is rotated by ``o`` (``R(o) B``; rotations compose and the scalar ``P`` commutes
with them), the linear-state counterpart of moving cached keys (``place_state``). Both recompute their decay
tables rather than load the ones checkpoints store.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from hypic_rag.kernels.algebra import SCALAR, rerotate, ssd_split_transition
from hypic_rag.kernels.rope import apply_rope
from hypic_rag.kernels.ssd import ssd_scan

from ..config import HybridConfig
from ..context import Forward
from ..layers import PlainRMSNorm
from ..linear import Linear
from ..state import RequestState, SegmentJumps, StateMarks, TransitionCapture
from .recurrence import run_recurrence


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
    marks: StateMarks | None = None,
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
        marks,
    )
    if marks is not None:  # no conv: empty tails
        marks.conv[layer_idx] = [v.new_zeros(b, 0, 0)] * len(marks.at)
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
        self.qkv_proj = Linear(config.hidden_size, 3 * inner, bias=False)
        self.output_gate = Linear(config.hidden_size, inner, bias=False)
        self.out_proj = Linear(inner, config.hidden_size, bias=False)
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

    def forward(self, x: torch.Tensor, ctx: Forward) -> torch.Tensor:
        """Padding is an exact identity (``lightning``)."""
        state, pad_mask, capture, jumps = ctx.state, ctx.pad_mask, ctx.capture, ctx.jumps
        b, t, _ = x.shape
        qkv = torch.nn.functional.silu(self.qkv_proj(x)).view(b, t, self.heads, 3 * self.head_dim)
        q, k, v = qkv.split(self.head_dim, dim=-1)
        y = lightning(self.layer_idx, q, k, v, pad_mask, self.log_decay(x.device), state, capture, jumps, ctx.marks)
        out = self.norm(y.reshape(b, t, -1).to(x.dtype))
        return self.out_proj(torch.sigmoid(self.output_gate(x)) * out)


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
    """Ring-linear's per-head log-decays: ALiBi's slopes scaled with depth by the reference's
    ``1 - (i - 1) / (L - 1) + 1e-5``."""
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
        self.query_key_value = Linear(h, 3 * inner, bias=config.attention_bias)
        if self.qk_norm:
            self.query_layernorm = PlainRMSNorm(self.head_dim, config.rms_norm_eps)
            self.key_layernorm = PlainRMSNorm(self.head_dim, config.rms_norm_eps)
        self.g_proj = Linear(h, inner, bias=False)
        self.g_norm = GroupRMSNorm(inner, config.ring_group_norm_size, config.rms_norm_eps)
        self.dense = Linear(inner, h, bias=config.attention_bias)
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

    def forward(self, x: torch.Tensor, ctx: Forward) -> torch.Tensor:
        """Its keys rotate as the softmax ones do, by the pass's ``ctx.rope``."""
        state, pad_mask, capture, jumps, rope = ctx.state, ctx.pad_mask, ctx.capture, ctx.jumps, ctx.rope
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
        y = lightning(self.layer_idx, q, k, v, pad_mask, self.log_decay(x.device), state, capture, jumps, ctx.marks)
        out = self.g_norm(y.reshape(b, t, -1).to(x.dtype))
        return self.dense(out * torch.sigmoid(self.g_proj(x)))
