"""Jamba (``jamba``): Mamba1 (``mixers.mamba1``) and attention layers (no position encoding), each followed by
a SwiGLU or, every ``expert_layer_period``-th layer, a softmax-routed MoE whose top-k weights are not
renormalised. Module names follow transformers' ``JambaForCausalLM``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..attention import Attention
from ..block import PreNormLayer
from ..config import FULL, LINEAR, HybridConfig
from ..family import Family
from ..layers import Experts, MoE, PlainRMSNorm, Router, SwiGLU
from ..mixers.mamba1 import Mamba1Mixer
from ..weight_names import stack_experts
from .reading import check_act, check_experts, common_fields, merge

JAMBA: dict[str, Any] = {
    "vocab_size": 65536,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_act": "silu",
    "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "num_experts_per_tok": 2,
    "num_experts": 16,
    "expert_layer_period": 2,
    "expert_layer_offset": 1,
    "attn_layer_period": 8,
    "attn_layer_offset": 4,
    "mamba_d_state": 16,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_dt_rank": "auto",
    "mamba_conv_bias": True,
    "mamba_proj_bias": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}


def read_jamba(cls: type[HybridConfig], data: dict[str, Any]) -> HybridConfig:
    """Jamba: attention where ``i % attn_layer_period == attn_layer_offset``, Mamba1 elsewhere; a MoE where
    ``i % expert_layer_period == expert_layer_offset`` (with more than one expert), a SwiGLU elsewhere."""
    d = merge(JAMBA, data)
    if "num_local_experts" in data:
        d["num_experts"] = data["num_local_experts"]
    n, h = int(d["num_hidden_layers"]), int(d["hidden_size"])
    for period, offset in (("attn_layer_period", "attn_layer_offset"), ("expert_layer_period", "expert_layer_offset")):
        if not 0 <= int(d[offset]) < int(d[period]):
            raise ValueError(f"{offset} ({d[offset]}) must be smaller than {period} ({d[period]})")
    types = [FULL if i % int(d["attn_layer_period"]) == int(d["attn_layer_offset"]) else LINEAR for i in range(n)]
    experts = int(d["num_experts"])
    moe = [experts > 1 and i % int(d["expert_layer_period"]) == int(d["expert_layer_offset"]) for i in range(n)]
    check_act(d, "hidden_act", "silu")
    rank = d["mamba_dt_rank"]
    heads = int(d["num_attention_heads"])
    return cls(
        **common_fields(
            "jamba",
            d,
            data,
            types,
            heads,
            int(d.get("num_key_value_heads") or heads),
            h // heads,
            float(d["rms_norm_eps"]),
            int(d["max_position_embeddings"]),
            "silu",
        ),
        intermediate_size=int(d["intermediate_size"]),
        rope_theta=10000.0,
        partial_rotary_factor=0.0,  # Jamba's attention has no position encoding
        attention_bias=False,
        num_experts=experts if any(moe) else 0,
        num_experts_per_tok=int(d["num_experts_per_tok"]),
        moe_intermediate_size=int(d["intermediate_size"]),
        norm_topk_prob=False,  # Jamba keeps the top-k softmax weights as they are
        mlp_only_layers=tuple(i for i in range(n) if not moe[i]),
        ssm_state_size=int(d["mamba_d_state"]),
        mamba_conv_kernel=int(d["mamba_d_conv"]),
        mamba_conv_bias=bool(d["mamba_conv_bias"]),
        mamba_proj_bias=bool(d["mamba_proj_bias"]),
        mamba1_inner=int(d["mamba_expand"]) * h,
        mamba_dt_rank=math.ceil(h / 16) if rank == "auto" else int(rank),
    )


class JambaLayer(PreNormLayer):
    def __init__(self, config: HybridConfig, idx: int) -> None:
        linear = config.layer_types[idx] == LINEAR
        h = config.hidden_size
        dense = idx in config.mlp_only_layers
        ffn = SwiGLU(h, config.intermediate_size) if dense else MoE(Router(config), Experts(config), "router")
        super().__init__(
            linear,
            ("mamba", Mamba1Mixer(config, idx)) if linear else ("self_attn", Attention(config, idx)),
            ("feed_forward", ffn),
            ("input_layernorm", PlainRMSNorm(h, config.rms_norm_eps)),
            ("pre_ff_layernorm", PlainRMSNorm(h, config.rms_norm_eps)),
        )


def map_weights(tensors: dict[str, torch.Tensor], config: HybridConfig) -> None:
    """Its experts are stored one module each, under ``feed_forward``."""
    stack_experts(tensors, config, "feed_forward")


FAMILIES = (
    Family(
        model_types=("jamba",),
        mixer="mamba1",
        read_config=read_jamba,
        layer=JambaLayer,
        final_norm="final_layernorm",
        linear_sizes=("mamba1_inner", "mamba_dt_rank", "ssm_state_size", "mamba_conv_kernel", "intermediate_size"),
        validate=check_experts,
        map_weights=map_weights,
    ),
)
