"""Zamba2: Mamba2 layers, and at ``hybrid`` layers a shared transformer block before the Mamba2 one.

The shared block reads the hidden states beside the pass's token embeddings (``[x | e]``, twice the width:
``context.Forward.embeds``), attends over them with heads of ``2 * hidden / heads`` and a scale of
``(head_dim / 2) ** -0.5``, and runs a GELU MLP; its output, through the layer's own ``linear``, is added to the
Mamba2 layer's input (not to its residual). ``num_mem_blocks`` blocks are shared round-robin across the hybrid
layers, and each hybrid layer adds its own low-rank adapters to the block's q, k, v (``use_shared_attention_
adapter``) and gate-up projections. Every hybrid layer here is one module as any other, with its block's
weights and its own adapters: a checkpoint stores a tied block once, ``map_weights`` names its tensors for each
layer that reuses it, and the loader keeps one tensor for them (``loading.load_model``).

For HYPIC a hybrid layer is attention and a linear mixer in one layer (``config.HYBRID``, as Falcon-H1's): its
attention keeps KV and its Mamba2 a state. The shared weights change nothing there: each layer's keys are its
own, and the embeddings it reads are the tokens' own, wherever they sit. Module names follow transformers'
``Zamba2ForCausalLM``.
"""

from __future__ import annotations

import re
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hypic_rag.kernels.rope import apply_rope

from ..attention import attend
from ..config import HYBRID, LINEAR, HybridConfig
from ..context import Forward
from ..family import Family
from ..layers import PlainRMSNorm
from ..linear import Linear
from ..mixers.mamba2 import Mamba2Mixer
from .reading import MAMBA2_SIZES, check_act, check_mamba2, common_fields, merge, rope_fields

ZAMBA2: dict[str, Any] = {
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "hidden_size": 2560,
    "layers_block_type": None,
    "mamba_d_state": 64,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_ngroups": 1,
    "time_step_min": 0.001,
    "n_mamba_heads": 8,
    "use_conv_bias": True,
    "add_bias_linear": False,
    "intermediate_size": None,
    "hidden_act": "gelu",
    "num_attention_heads": 32,
    "num_key_value_heads": None,
    "num_mem_blocks": 1,
    "use_shared_attention_adapter": False,
    "adapter_rank": 128,
    "use_mem_rope": False,
    "rms_norm_eps": 1e-5,
    "use_long_context": False,
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}
# transformers' default stack when a config names none
_M = "linear_attention"
DEFAULT_BLOCKS = [_M] + ([_M] * 5 + ["hybrid"]) * 7 + [_M] * 4 + ["hybrid"] + [_M] * 3 + ["hybrid"] + [_M] * 2
BLOCK_TYPES = {"mamba": LINEAR, "linear_attention": LINEAR, "hybrid": HYBRID}
MAMBA_NORM_EPS = 1e-5  # transformers' Zamba2 gated norm, whatever rms_norm_eps says


def read_zamba2(cls: type[HybridConfig], data: dict[str, Any]) -> HybridConfig:
    d = merge(ZAMBA2, data)
    blocks = d["layers_block_type"] or DEFAULT_BLOCKS
    if not isinstance(blocks, list) or any(b not in BLOCK_TYPES for b in blocks):
        raise ValueError(f"layers_block_type must list 'mamba' or 'hybrid' layers, got {blocks!r}")
    if d["use_long_context"]:
        raise ValueError("unsupported use_long_context: its rescaled RoPE is not implemented")
    check_act(d, "hidden_act", "gelu")
    hidden, heads = int(d["hidden_size"]), int(d["num_attention_heads"])
    if (2 * hidden) % heads or int(d["mamba_expand"]) * hidden % int(d["n_mamba_heads"]):
        raise ValueError("attention heads must split twice the hidden size, and Mamba2 heads its inner width")
    for name in ("num_mem_blocks", "adapter_rank"):
        if not isinstance(d[name], int) or d[name] < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {d[name]!r}")
    kv_heads = int(d["num_key_value_heads"] or heads)
    if d["use_shared_attention_adapter"] and kv_heads != heads:
        raise ValueError("the shared attention's adapters write every head: num_key_value_heads must be the heads'")
    theta, _ = rope_fields(d)
    mamba_heads = int(d["n_mamba_heads"])
    return cls(
        **common_fields(
            "zamba2",
            d,
            data,
            (BLOCK_TYPES[b] for b in blocks),
            heads,
            kv_heads,
            2 * hidden // heads,
            float(d["rms_norm_eps"]),
            int(d["max_position_embeddings"]),
            "gelu",
        ),
        intermediate_size=int(d["intermediate_size"] or 4 * hidden),
        rope_theta=theta,
        partial_rotary_factor=1.0 if d["use_mem_rope"] else 0.0,
        attention_bias=False,
        mamba_num_heads=mamba_heads,
        mamba_head_dim=int(d["mamba_expand"]) * hidden // mamba_heads,
        ssm_state_size=int(d["mamba_d_state"]),
        mamba_n_groups=int(d["mamba_ngroups"]),
        mamba_conv_kernel=int(d["mamba_d_conv"]),
        mamba_conv_bias=bool(d["use_conv_bias"]),
        mamba_proj_bias=bool(d["add_bias_linear"]),
        time_step_limit=(float(d["time_step_min"]), float("inf")),  # transformers' Zamba2 clamps dt there
        mlp_bias=bool(d["add_bias_linear"]),
    )


def _shared(config: HybridConfig, name: str) -> Any:
    return merge(ZAMBA2, config.raw)[name]


def _low_rank(width_in: int, rank: int, width_out: int) -> nn.Sequential:
    return nn.Sequential(Linear(width_in, rank, bias=False), Linear(rank, width_out, bias=False))


class SharedAttention(nn.Module):
    """The shared block's attention over ``[x | e]``, with this layer's adapters on q, k and v."""

    def __init__(self, config: HybridConfig, idx: int) -> None:
        super().__init__()
        self.layer_idx = idx
        self.heads, self.kv_heads, self.head_dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        )
        width, hd = 2 * config.hidden_size, config.head_dim
        self.q_proj = Linear(width, self.heads * hd, bias=False)
        self.k_proj = Linear(width, self.kv_heads * hd, bias=False)
        self.v_proj = Linear(width, self.kv_heads * hd, bias=False)
        self.o_proj = Linear(self.heads * hd, config.hidden_size, bias=False)
        if _shared(config, "use_shared_attention_adapter"):
            rank = _shared(config, "adapter_rank")
            self.q_adapter = _low_rank(width, rank, width)
            self.k_adapter = _low_rank(width, rank, width)
            self.v_adapter = _low_rank(width, rank, width)
        self.rotary = config.rotary_dim > 0

    def forward(self, x: torch.Tensor, ctx: Forward) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if hasattr(self, "q_adapter"):
            q, k, v = q + self.q_adapter(x), k + self.k_adapter(x), v + self.v_adapter(x)
        q, k, v = (y.view(b, t, -1, self.head_dim).transpose(1, 2) for y in (q, k, v))
        cos, sin, inv_freq = ctx.rope
        if self.rotary:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        scale = (self.head_dim / 2) ** -0.5
        out = attend(self.layer_idx, q, k, v, ctx.positions, inv_freq, ctx.state, ctx.pad_mask, scale)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class SharedMLP(nn.Module):
    """The shared block's GELU MLP, with this layer's adapter on the fused gate-up projection."""

    def __init__(self, config: HybridConfig) -> None:
        super().__init__()
        h, inner, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_up_proj = Linear(h, 2 * inner, bias=bias)
        self.gate_up_adapter = _low_rank(h, _shared(config, "adapter_rank"), 2 * inner)
        self.down_proj = Linear(inner, h, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = (self.gate_up_proj(x) + self.gate_up_adapter(x)).chunk(2, dim=-1)
        return self.down_proj(F.gelu(gate) * up)


class SharedTransformer(nn.Module):
    def __init__(self, config: HybridConfig, idx: int) -> None:
        super().__init__()
        self.input_layernorm = PlainRMSNorm(2 * config.hidden_size, config.rms_norm_eps)
        self.self_attn = SharedAttention(config, idx)
        self.pre_ff_layernorm = PlainRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.feed_forward = SharedMLP(config)

    def forward(self, x: torch.Tensor, ctx: Forward) -> torch.Tensor:
        if ctx.embeds is None:
            raise ValueError("Zamba2's shared blocks read the pass's token embeddings (Forward.embeds)")
        h = self.self_attn(self.input_layernorm(torch.cat([x, ctx.embeds], dim=-1)), ctx)
        return self.feed_forward(self.pre_ff_layernorm(h))


class MambaDecoder(nn.Module):
    """``x + mamba(norm(x + t))``: the shared block's ``t`` joins the Mamba2 input, not the residual."""

    def __init__(self, config: HybridConfig, idx: int) -> None:
        super().__init__()
        self.mamba = Mamba2Mixer(config, idx)
        self.mamba.norm.eps = MAMBA_NORM_EPS
        self.input_layernorm = PlainRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, ctx: Forward, shared: torch.Tensor | None = None) -> torch.Tensor:
        h = x if shared is None else x + shared
        return x + self.mamba(self.input_layernorm(h), ctx)


class Zamba2MambaLayer(MambaDecoder):
    is_linear = True

    @property
    def linear_mixer(self) -> nn.Module:
        return self.mamba


class Zamba2HybridLayer(nn.Module):
    is_linear = True  # its Mamba2 state is carried; its shared attention keeps KV as any attention layer

    def __init__(self, config: HybridConfig, idx: int) -> None:
        super().__init__()
        self.shared_transformer = SharedTransformer(config, idx)
        self.linear = Linear(config.hidden_size, config.hidden_size, bias=False)
        self.mamba_decoder = MambaDecoder(config, idx)

    @property
    def linear_mixer(self) -> nn.Module:
        return self.mamba_decoder.mamba

    def forward(self, x: torch.Tensor, ctx: Forward) -> torch.Tensor:
        return self.mamba_decoder(x, ctx, self.linear(self.shared_transformer(x, ctx)))


def zamba2_layer(config: HybridConfig, idx: int) -> nn.Module:
    if config.layer_types[idx] == HYBRID:
        return Zamba2HybridLayer(config, idx)
    return Zamba2MambaLayer(config, idx)


_ADAPTER = re.compile(r"^(.*)\.(linear_[qkv]_adapter_list|gate_up_proj_adapter_list)\.(\d+)\.(\d+)\.weight$")
_OURS = {
    "linear_q_adapter_list": "q_adapter",
    "linear_k_adapter_list": "k_adapter",
    "linear_v_adapter_list": "v_adapter",
    "gate_up_proj_adapter_list": "gate_up_adapter",
}


def map_weights(tensors: dict[str, torch.Tensor], config: HybridConfig) -> None:
    """Each hybrid layer gets its shared block's weights (a checkpoint keeps a tied block once, under the first
    layer that uses it) and, from the block's adapter lists, the adapters of its own place among the hybrid
    layers (the ``p``-th hybrid layer uses block ``p % num_mem_blocks`` and its adapters at ``p``)."""
    hybrid = [i for i, t in enumerate(config.layer_types) if t == HYBRID]
    blocks = _shared(config, "num_mem_blocks")
    prefix = "model.layers.{}.shared_transformer."
    for place, layer in enumerate(hybrid):
        source = prefix.format(hybrid[place % blocks])
        target = prefix.format(layer)
        for name in [n for n in tensors if n.startswith(source) and not _ADAPTER.match(n)]:
            tensors.setdefault(target + name[len(source) :], tensors[name])
        for name in [n for n in tensors if n.startswith(source)]:
            found = _ADAPTER.match(name)
            if found and int(found.group(3)) == place:
                module = found.group(1)[len(source) :]
                tensors[f"{target}{module}.{_OURS[found.group(2)]}.{found.group(4)}.weight"] = tensors[name]
    for name in [n for n in tensors if _ADAPTER.match(n)]:
        del tensors[name]


def validate(config: HybridConfig) -> None:
    check_mamba2(config)


FAMILIES = (
    Family(
        model_types=("zamba2",),
        mixer="mamba2",
        read_config=read_zamba2,
        layer=zamba2_layer,
        final_norm="final_layernorm",
        linear_sizes=MAMBA2_SIZES,
        validate=validate,
        map_weights=map_weights,
    ),
)
