"""Full attention: the core every attention layer shares (``attend``), the plain GQA layer most families
use (``Attention``), Qwen's gated one (``GatedAttention``: q/k RMSNorm, partial rotate-half RoPE) and
DeepSeek's multi-latent attention (``MultiLatentAttention``: Kimi Linear, Ling 3.0).

Keys are rotated at their absolute positions and masked by position, not by index, so a request state may
hold keys assembled out of order (docs/design.md §3). For Qwen3.5's multi-axis RoPE, text-only positions
make all three axes equal, which is exactly 1-D RoPE; that is the only case we serve.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hypic_rag.kernels.rope import apply_rope
from hypic_rag.kernels.stitch import stitch

from .batch import BatchState
from .config import HybridConfig
from .context import Forward
from .layers import PlainRMSNorm, RMSNorm
from .linear import Linear
from .state import RequestState


def attend(
    layer_idx: int,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    state: RequestState | BatchState | None,
    pad_mask: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """Every attention layer's core, ``[B, Hq, T, D]``: the new keys join the request's KV and the
    queries attend over it by position (``stitch``), or, for a fresh state, causally over themselves.
    ``pad_mask [B, T]`` (True for real tokens) hides padding keys; it is for a fresh state only. A
    ``BatchState`` (a continuous batch's decode step) runs this per row, over each row's own KV."""
    if isinstance(state, BatchState):
        return state.attend_rows(attend, layer_idx, q, k, v, inv_freq, scale)
    t = q.shape[2]
    if state is not None and state.queries is not None:
        state.queries[layer_idx] = (q, scale)
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


class Attention(nn.Module):
    """Multi-head attention with GQA and no output gate, as most families have it: Nemotron-H's and Jamba's
    (no position encoding, so their cached keys move to any position without rotation), Granite-4.0-H's
    (RoPE or none, its own scale), Bamba's (half the head rotated), MiniMax's, Falcon-H1's. ``qk_norm``
    names a plain RMSNorm on q and on k, per head (LFM2's ``q_layernorm``/``k_layernorm``) or, with
    ``norm_whole_projection``, over the whole projection before the heads are split (OLMo hybrid's
    ``q_norm``/``k_norm``); ``out`` names the output projection."""

    def __init__(
        self,
        config: HybridConfig,
        layer_idx: int,
        out: str = "o_proj",
        qk_norm: tuple[str, str] | None = None,
        norm_whole_projection: bool = False,
    ) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = hd = config.head_dim
        bias = config.attention_bias
        self.q_proj = Linear(config.hidden_size, self.num_heads * hd, bias=bias)
        self.k_proj = Linear(config.hidden_size, self.num_kv_heads * hd, bias=bias)
        self.v_proj = Linear(config.hidden_size, self.num_kv_heads * hd, bias=bias)
        self.out_name = out
        self.add_module(out, Linear(self.num_heads * hd, config.hidden_size, bias=bias))
        self.qk_norm = qk_norm
        self.norm_whole_projection = norm_whole_projection
        if qk_norm is not None:
            q_dim, k_dim = (self.num_heads * hd, self.num_kv_heads * hd) if norm_whole_projection else (hd, hd)
            self.add_module(qk_norm[0], PlainRMSNorm(q_dim, config.rms_norm_eps))
            self.add_module(qk_norm[1], PlainRMSNorm(k_dim, config.rms_norm_eps))
        self.scale = config.attention_scale if config.attention_scale is not None else hd**-0.5
        self.rotary = config.rotary_dim > 0

    def forward(self, x: torch.Tensor, ctx: Forward) -> torch.Tensor:
        positions, rope, state, pad_mask = ctx.positions, ctx.rope, ctx.state, ctx.pad_mask
        b, t, _ = x.shape
        hd = self.head_dim
        q, k = self.q_proj(x), self.k_proj(x)
        norms = (getattr(self, self.qk_norm[0]), getattr(self, self.qk_norm[1])) if self.qk_norm else None
        if norms and self.norm_whole_projection:
            q, k = norms[0](q), norms[1](k)
        q, k = q.view(b, t, self.num_heads, hd), k.view(b, t, self.num_kv_heads, hd)
        if norms and not self.norm_whole_projection:
            q, k = norms[0](q), norms[1](k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, hd).transpose(1, 2)
        cos, sin, inv_freq = rope
        if self.rotary:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = attend(self.layer_idx, q, k, v, positions, inv_freq, state, pad_mask, self.scale)
        return getattr(self, self.out_name)(out.transpose(1, 2).reshape(b, t, -1))


class GatedAttention(nn.Module):
    """Qwen3-Next's and Qwen3.5's: a sigmoid output gate from the query projection's second half, q/k
    zero-centred RMSNorm per head, RoPE on every layer."""

    def __init__(self, config: HybridConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = hd = config.head_dim
        bias = config.attention_bias
        self.q_proj = Linear(config.hidden_size, self.num_heads * hd * 2, bias=bias)
        self.k_proj = Linear(config.hidden_size, self.num_kv_heads * hd, bias=bias)
        self.v_proj = Linear(config.hidden_size, self.num_kv_heads * hd, bias=bias)
        self.o_proj = Linear(self.num_heads * hd, config.hidden_size, bias=bias)
        self.q_norm = RMSNorm(hd, config.rms_norm_eps)
        self.k_norm = RMSNorm(hd, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, ctx: Forward) -> torch.Tensor:
        """``rope`` is (cos, sin) at ``positions`` and the inverse frequencies. ``pad_mask [B, T]``
        (True for real tokens) hides padding keys; it is for a fresh state only."""
        positions, rope, state, pad_mask = ctx.positions, ctx.rope, ctx.state, ctx.pad_mask
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


class MultiLatentAttention(nn.Module):
    """DeepSeek's MLA: a compressed KV latent and one key part shared by the heads. As Kimi Linear runs it,
    nothing rotates; as Ling 3.0 (``bailing_hybrid``) runs it, that shared part and the queries' last
    ``qk_rope_head_dim`` dims take interleaved RoPE and each head's output is gated (``rotate_and_gate``).
    Rotated parts are de-interleaved and put first, so cached keys move as every rotated key does (the
    dot products are unchanged by one permutation of q's and k's dims). Each head's K (``[k_nope | k_rot]``)
    and V are cached after ``kv_b_proj``, V zero-padded to K's width so every attention layer's KV has one
    head size; the padding is cut from the output."""

    def __init__(self, config: HybridConfig, layer_idx: int, out_name: str = "o_proj", rotate_and_gate: bool = False):
        super().__init__()
        self.layer_idx = layer_idx
        h, heads = config.hidden_size, config.num_attention_heads
        self.heads = heads
        self.nope, self.rope_part, self.v_dim = config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim
        self.qk_dim = self.nope + self.rope_part
        self.kv_rank = config.kv_lora_rank
        if config.q_lora_rank:
            self.q_a_proj = Linear(h, config.q_lora_rank, bias=False)
            self.q_a_layernorm = PlainRMSNorm(config.q_lora_rank, 1e-6)
            self.q_b_proj = Linear(config.q_lora_rank, heads * self.qk_dim, bias=False)
        else:
            self.q_proj = Linear(h, heads * self.qk_dim, bias=False)
        self.kv_a_proj_with_mqa = Linear(h, self.kv_rank + self.rope_part, bias=config.attention_bias)
        self.kv_a_layernorm = PlainRMSNorm(self.kv_rank, 1e-6)
        self.kv_b_proj = Linear(self.kv_rank, heads * (self.nope + self.v_dim), bias=False)
        self._out = out_name
        self.add_module(out_name, Linear(heads * self.v_dim, h, bias=config.attention_bias))
        self.rotate_and_gate = rotate_and_gate
        if rotate_and_gate:
            self.g_proj = Linear(h, heads, bias=False)

    def forward(self, x: torch.Tensor, ctx: Forward) -> torch.Tensor:
        positions, rope, state, pad_mask = ctx.positions, ctx.rope, ctx.state, ctx.pad_mask
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
