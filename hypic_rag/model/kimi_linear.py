"""Kimi Linear (``kimi_linear``): KDA linear attention and MLA full attention, a dense MLP in the first
layers and a sigmoid-routed MoE with a shared expert after.

KDA is the gated delta rule with a decay per key channel (``kernels.kda``): its operator is dense, as
Gated DeltaNet's is. MLA here has no RoPE (transformers' Kimi Linear applies none): its cached keys move
to any position unchanged. Each head's K (``[k_nope | k_rot]``) and V are cached after ``kv_b_proj``, V
zero-padded to K's width so every attention layer's KV has one head size; the padding is cut from the
output. Module names follow transformers' ``KimiLinearForCausalLM``.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from hypic_rag.kernels.algebra import DENSE, kda_split_transition
from hypic_rag.kernels.delta_rule import l2norm
from hypic_rag.kernels.kda import kda_scan
from hypic_rag.kernels.rope import apply_rope

from .attention import attend
from .block import GroupRoutedLayer
from .config import HybridConfig
from .conv import request_conv
from .layers import PlainRMSNorm
from .recurrence import run_recurrence
from .state import RequestState, SegmentJumps, TransitionCapture


class ForgetGate(nn.Module):
    """The per-channel log-decay ``-exp(A_log[h]) * softplus(f_b(f_a(x)) + dt_bias)``."""

    def __init__(self, hidden: int, heads: int, dim: int) -> None:
        super().__init__()
        self.heads, self.dim = heads, dim
        self.f_a_proj = nn.Linear(hidden, dim, bias=False)
        self.f_b_proj = nn.Linear(dim, heads * dim, bias=False)
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
        self.q_proj = nn.Linear(h, inner, bias=False)
        self.k_proj = nn.Linear(h, inner, bias=False)
        self.v_proj = nn.Linear(h, inner, bias=False)
        self.conv1d = nn.Conv1d(3 * inner, 3 * inner, self.kernel, groups=3 * inner, bias=False)
        self.b_proj = nn.Linear(h, self.heads, bias=False)
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

    def forward(
        self,
        x: torch.Tensor,
        state: RequestState | None,
        pad_mask: torch.Tensor | None = None,
        capture: TransitionCapture | None = None,
        jumps: SegmentJumps | None = None,
        rope: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Padding is an exact identity (zero conv input, ``g = beta = 0``)."""
        b, t, _ = x.shape
        if pad_mask is not None:
            x = torch.where(pad_mask[..., None], x, 0.0)
        layer = state.linear(self.layer_idx) if state is not None else None
        mixed = torch.cat((self.q_proj(x), self.k_proj(x), self.v_proj(x)), dim=-1)
        tail = layer.conv if layer else None
        mixed, tail = request_conv(mixed, tail, self.conv1d.weight[:, 0, :], None, jumps, self.layer_idx)
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
        self.g_a_proj = nn.Linear(h, self.dim, bias=False)
        self.g_b_proj = nn.Linear(self.dim, self.inner, bias=False)
        self.o_proj = nn.Linear(self.inner, h, bias=False)

    def decay(self, x: torch.Tensor) -> torch.Tensor:
        return self.forget_gate(x)

    def output_gate(self, x: torch.Tensor) -> torch.Tensor:
        return self.g_b_proj(self.g_a_proj(x))

    def project(self, out: torch.Tensor) -> torch.Tensor:
        return self.o_proj(out)


class MultiLatentAttention(nn.Module):
    """DeepSeek's MLA: a compressed KV latent and one key part shared by the heads. As Kimi Linear runs it,
    nothing rotates; as Ling 3.0 (``bailing_hybrid``) runs it, that shared part and the queries' last
    ``qk_rope_head_dim`` dims take interleaved RoPE and each head's output is gated (``rotate_and_gate``).
    Rotated parts are de-interleaved and put first, so cached keys move as every rotated key does (the
    dot products are unchanged by one permutation of q's and k's dims)."""

    def __init__(self, config: HybridConfig, layer_idx: int, out_name: str = "o_proj", rotate_and_gate: bool = False):
        super().__init__()
        self.layer_idx = layer_idx
        h, heads = config.hidden_size, config.num_attention_heads
        self.heads = heads
        self.nope, self.rope_part, self.v_dim = config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim
        self.qk_dim = self.nope + self.rope_part
        self.kv_rank = config.kv_lora_rank
        if config.q_lora_rank:
            self.q_a_proj = nn.Linear(h, config.q_lora_rank, bias=False)
            self.q_a_layernorm = PlainRMSNorm(config.q_lora_rank, 1e-6)
            self.q_b_proj = nn.Linear(config.q_lora_rank, heads * self.qk_dim, bias=False)
        else:
            self.q_proj = nn.Linear(h, heads * self.qk_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(h, self.kv_rank + self.rope_part, bias=config.attention_bias)
        self.kv_a_layernorm = PlainRMSNorm(self.kv_rank, 1e-6)
        self.kv_b_proj = nn.Linear(self.kv_rank, heads * (self.nope + self.v_dim), bias=False)
        self._out = out_name
        self.add_module(out_name, nn.Linear(heads * self.v_dim, h, bias=config.attention_bias))
        self.rotate_and_gate = rotate_and_gate
        if rotate_and_gate:
            self.g_proj = nn.Linear(h, heads, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        state: RequestState | None,
        pad_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        b, t, _ = x.shape
        if hasattr(self, "q_proj"):
            q = self.q_proj(x)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(b, t, self.heads, self.qk_dim).transpose(1, 2)
        latent, k_rot = self.kv_a_proj_with_mqa(x).split((self.kv_rank, self.rope_part), dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(latent)).view(b, t, self.heads, self.nope + self.v_dim)
        k_nope, v = kv.split((self.nope, self.v_dim), dim=-1)
        k_rot = k_rot[:, :, None].expand(b, t, self.heads, self.rope_part).transpose(1, 2)
        k_nope = k_nope.transpose(1, 2)
        if self.rotate_and_gate:
            cos, sin, _ = rope
            q_nope, q_rot = q.split((self.nope, self.rope_part), dim=-1)
            q = torch.cat((apply_rope(_deinterleave(q_rot), cos, sin), q_nope), dim=-1)
            k = torch.cat((apply_rope(_deinterleave(k_rot), cos, sin), k_nope), dim=-1)
        else:
            k = torch.cat((k_nope, k_rot), dim=-1)
        v = F.pad(v, (0, self.qk_dim - self.v_dim)).transpose(1, 2)  # one head size for K and V
        out = attend(self.layer_idx, q, k, v, positions, rope[2], state, pad_mask, self.qk_dim**-0.5)
        out = out[..., : self.v_dim]
        if self.rotate_and_gate:
            out = out * torch.sigmoid(self.g_proj(x).float()).to(out.dtype).transpose(1, 2)[..., None]
        return getattr(self, self._out)(out.transpose(1, 2).reshape(b, t, -1))


def _deinterleave(x: torch.Tensor) -> torch.Tensor:
    """Pairs ``(x0, x1), (x2, x3), ...`` laid out as ``[x0, x2, ... | x1, x3, ...]``: interleaved RoPE in the
    rotate-half layout."""
    return x.unflatten(-1, (-1, 2)).transpose(-1, -2).flatten(-2)


class KimiBackbone(nn.Module):
    def __init__(self, config: HybridConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            GroupRoutedLayer(config, i, "self_attn", KimiDeltaAttention, MultiLatentAttention)
            for i in range(config.num_hidden_layers)
        )
        self.norm = PlainRMSNorm(config.hidden_size, config.rms_norm_eps)


class BailingDeltaAttention(DeltaAttentionBase):
    """Ling 3.0's KDA (``bailing_hybrid``): the decay from one projection, ``f_proj``, bounded below by
    ``kda_lower_bound`` when ``kda_safe_gate`` (``lower * sigmoid(exp(A_log) * (f + dt_bias))``, else Kimi's
    ``-exp(A_log) * softplus(f + dt_bias)``); read-out gated by ``g_proj``; output ``dense``. Checkpoint names."""

    def __init__(self, config: HybridConfig, layer_idx: int) -> None:
        super().__init__(config, layer_idx)
        h = config.hidden_size
        self.A_log = nn.Parameter(torch.zeros(self.heads))
        self.dt_bias = nn.Parameter(torch.zeros(self.inner))
        self.f_proj = nn.Linear(h, self.inner, bias=False)
        self.g_proj = nn.Linear(h, self.inner, bias=False)
        self.dense = nn.Linear(self.inner, h, bias=False)
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


class BailingHybridBackbone(nn.Module):
    def __init__(self, config: HybridConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        mla = partial(MultiLatentAttention, out_name="dense", rotate_and_gate=True)
        self.layers = nn.ModuleList(
            GroupRoutedLayer(config, i, "attention", BailingDeltaAttention, mla)
            for i in range(config.num_hidden_layers)
        )
        self.norm = PlainRMSNorm(config.hidden_size, config.rms_norm_eps)
