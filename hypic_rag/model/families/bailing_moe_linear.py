"""Ring-linear-2.0 (``bailing_moe_linear``: Ring-mini-linear-2.0, Ring-flash-linear-2.0), which transformers
does not ship: Lightning attention layers (``mixers.lightning.RingLightningAttention``) and, every
``layer_group_size``-th layer, softmax attention; a dense SwiGLU in the first layers, then a sigmoid-routed
MoE with shared experts.

Parity rests on the published architecture as the open ports (mlx-lm, sglang, vLLM) implement it and on an
independent token-by-token oracle in the tests, not on the original remote code, which is not here; the
per-layer decay factor follows the reference's ``1 - (i - 1) / (L - 1) + 1e-5``. Weight names are the
checkpoint's (``model.word_embeddings``, ``attention.query_key_value``, ``attention.dense``, ``g_proj``,
``g_norm``, ``mlp.gate.expert_bias``, experts one module each).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hypic_rag.kernels.rope import apply_rope

from ..attention import attend
from ..block import GroupRoutedLayer
from ..config import FULL, LINEAR, HybridConfig
from ..context import Forward
from ..family import Family
from ..layers import PlainRMSNorm
from ..linear import Linear
from ..mixers.lightning import RingLightningAttention
from ..weight_names import drop, stack_experts
from .reading import check_act, check_experts, check_rotary, common_fields, layer_names, merge

BAILING_MOE_LINEAR: dict[str, Any] = {
    "vocab_size": 157184,
    "hidden_size": 2048,
    "intermediate_size": 5120,
    "num_hidden_layers": 20,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": None,
    "layer_group_size": 5,
    "group_norm_size": 4,
    "linear_silu": False,
    "use_qk_norm": True,
    "partial_rotary_factor": 0.5,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 131072,
    "first_k_dense_replace": 1,
    "num_experts": 256,
    "num_experts_per_tok": 8,
    "n_group": 8,
    "topk_group": 4,
    "num_shared_experts": 1,
    "moe_intermediate_size": 512,
    "moe_shared_expert_intermediate_size": None,
    "score_function": "sigmoid",
    "routed_scaling_factor": 2.5,
    "norm_topk_prob": True,
    "rms_norm_eps": 1e-6,
    "use_bias": False,
    "use_qkv_bias": False,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "eos_token_id": 156892,
    "pad_token_id": 156892,
    "bos_token_id": None,
}


def ring_layer_types(layers: int, group: int) -> list[str]:
    """Softmax attention at every ``group``-th layer, and at the layers past the last whole group (mlx-lm's
    reading of the reference; sglang and vLLM require whole groups, where the two agree)."""
    whole = (layers // group) * group
    return [FULL if (i + 1) % group == 0 or i >= whole else LINEAR for i in range(layers)]


def read_bailing_moe_linear(cls: type[HybridConfig], data: dict[str, Any]) -> HybridConfig:
    """Ring-linear-2.0 (no transformers class; its remote code's config names): Lightning layers with softmax
    attention every ``layer_group_size``-th layer, ``first_k_dense_replace`` dense MLPs, then a grouped
    sigmoid router (``n_group``/``topk_group``) with shared experts."""
    d = merge(BAILING_MOE_LINEAR, data)
    n, h = int(d["num_hidden_layers"]), int(d["hidden_size"])
    heads = int(d["num_attention_heads"])
    head_dim = int(d.get("head_dim") or h // heads)
    types = d.get("layer_types") or ring_layer_types(n, int(d["layer_group_size"]))
    types = layer_names(types, {LINEAR, FULL})
    check_act(d, "hidden_act", "silu")
    if d["score_function"] != "sigmoid":
        raise ValueError(f"unsupported score_function {d['score_function']!r}: only 'sigmoid' routing is implemented")
    if d["use_bias"]:
        raise ValueError("bailing_moe_linear with use_bias=true is not supported")
    if d.get("rope_scaling"):
        raise ValueError("bailing_moe_linear with rope_scaling is not supported")
    if d.get("norm_head"):
        raise ValueError("bailing_moe_linear with norm_head=true (an L2-normalised LM head) is not supported")
    partial = float(d["rotary_dim"]) / head_dim if d.get("rotary_dim") else float(d["partial_rotary_factor"])
    shared = d.get("moe_shared_expert_intermediate_size") or d["moe_intermediate_size"]
    return cls(
        **common_fields(
            "bailing_moe_linear",
            d,
            data,
            types,
            heads,
            int(d.get("num_key_value_heads") or heads),
            head_dim,
            float(d["rms_norm_eps"]),
            int(d["max_position_embeddings"]),
            "silu",
        ),
        intermediate_size=int(d["intermediate_size"]),
        rope_theta=float(d["rope_theta"]),
        partial_rotary_factor=partial,
        attention_bias=bool(d["use_qkv_bias"]),
        num_experts=int(d["num_experts"]),
        num_experts_per_tok=int(d["num_experts_per_tok"]),
        moe_intermediate_size=int(d["moe_intermediate_size"]),
        shared_expert_intermediate_size=int(shared) * int(d["num_shared_experts"]),
        norm_topk_prob=bool(d["norm_topk_prob"]),
        mlp_only_layers=tuple(range(min(n, int(d["first_k_dense_replace"])))),
        moe_n_group=int(d["n_group"]),
        moe_topk_group=int(d["topk_group"]),
        routed_scaling_factor=float(d["routed_scaling_factor"]),
        ring_linear_silu=bool(d.get("use_linear_silu", d["linear_silu"])),
        ring_qk_norm=bool(d["use_qk_norm"]),
        ring_group_norm_size=int(d["group_norm_size"]),
        ring_linear_rope=bool(d.get("linear_rope", True)),
    )


def validate(config: HybridConfig) -> None:
    check_experts(config)
    inner = config.num_attention_heads * config.head_dim
    if LINEAR in config.layer_types and inner % config.ring_group_norm_size:
        raise ValueError(f"group_norm_size {config.ring_group_norm_size} does not divide {inner} channels")
    check_rotary(config)


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
        self.query_key_value = Linear(h, (self.heads + 2 * self.kv_heads) * hd, bias=config.attention_bias)
        self.qk_norm = config.ring_qk_norm
        if self.qk_norm:
            self.query_layernorm = PlainRMSNorm(hd, config.rms_norm_eps)
            self.key_layernorm = PlainRMSNorm(hd, config.rms_norm_eps)
        self.dense = Linear(self.heads * hd, h, bias=config.attention_bias)

    def forward(self, x: torch.Tensor, ctx: Forward) -> torch.Tensor:
        positions, rope, state, pad_mask = ctx.positions, ctx.rope, ctx.state, ctx.pad_mask
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


def ring_layer(config: HybridConfig, idx: int) -> nn.Module:
    return GroupRoutedLayer(config, idx, "attention", RingLightningAttention, RingSoftmaxAttention)


def map_weights(tensors: dict[str, torch.Tensor], config: HybridConfig) -> None:
    """Experts stored one module each, the router's bias as ``expert_bias`` (absent when the bias is off),
    and the Lightning layers' slopes and RoPE tables, which the runtime recomputes."""
    drop(tensors, "slope", "slopes", "inv_freq")
    for name in [n for n in tensors if n.endswith(".mlp.gate.expert_bias")]:
        tensors[name.replace(".expert_bias", ".e_score_correction_bias")] = tensors.pop(name)
    for name in [n for n in tensors if n.endswith(".mlp.gate.weight")]:
        bias = name.replace(".weight", ".e_score_correction_bias")
        tensors.setdefault(bias, torch.zeros(config.num_experts))
    stack_experts(tensors, config)


FAMILIES = (
    Family(
        model_types=("bailing_moe_linear",),
        mixer="lightning",
        read_config=read_bailing_moe_linear,
        layer=ring_layer,
        embeddings="word_embeddings",
        validate=validate,
        map_weights=map_weights,
        fp32_params=("e_score_correction_bias", "gate.weight"),  # as the open ports keep the router
    ),
)
