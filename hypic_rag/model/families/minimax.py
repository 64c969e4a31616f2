"""MiniMax (MiniMax-Text-01): Lightning attention (``mixers.lightning``) and softmax attention layers, each
followed by a softmax-routed MoE. The residual is taken after the input norm (transformers' ``postnorm``),
scaled by the alpha/beta factors.

Module names follow transformers' ``MiniMaxForCausalLM``; its checkpoints keep Mixtral's MoE names and the
Lightning layers' decay tables, which the runtime recomputes.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..attention import Attention
from ..config import FULL, LINEAR, HybridConfig
from ..context import Forward
from ..family import Family
from ..layers import Experts, MoE, PlainRMSNorm, Router
from ..mixers.lightning import LightningAttention
from ..weight_names import drop, merge_expert_modules
from .reading import check_act, check_experts, check_rotary, common_fields, layer_names, merge, rope_fields

MINIMAX: dict[str, Any] = {
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": None,
    "hidden_act": "silu",
    "max_position_embeddings": 4096 * 32,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "sliding_window": None,
    "num_experts_per_tok": 2,
    "num_local_experts": 8,
    "rope_theta": 1000000.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": None,
}
# MiniMax-Text-01's own config names for the residual scalings, and transformers'.
_MINIMAX_FACTORS = {
    "full_attn": ("full_attn_alpha_factor", "full_attn_beta_factor", "layernorm_full_attention"),
    "linear_attn": ("linear_attn_alpha_factor", "linear_attn_beta_factor", "layernorm_linear_attention"),
    "mlp": ("mlp_alpha_factor", "mlp_beta_factor", "layernorm_mlp"),
}


def read_minimax(cls: type[HybridConfig], data: dict[str, Any]) -> HybridConfig:
    """MiniMax: Lightning and softmax attention layers with a MoE after each; ``layer_types`` or the release's
    ``attn_type_list`` (1: softmax), the residual factors by transformers' names or the release's
    ``layernorm_*_alpha/beta``. RoPE spans the whole head, as transformers computes it."""
    d = merge(MINIMAX, data)
    if "num_experts" in data:
        d["num_local_experts"] = data["num_experts"]
    n = int(d["num_hidden_layers"])
    types = d.get("layer_types")
    if types is None and isinstance(d.get("attn_type_list"), list):
        types = [FULL if int(t) == 1 else LINEAR for t in d["attn_type_list"]]
    if types is None:
        types = [FULL if (i + 1) % 2 else LINEAR for i in range(n)]
    types = layer_names(types, {LINEAR, FULL})
    if d.get("sliding_window"):
        raise ValueError("minimax with sliding_window attention is not supported")
    if d.get("postnorm") is False:
        raise ValueError("minimax with postnorm=false is not supported: transformers' MiniMax is post-norm")
    check_act(d, "hidden_act", "silu")
    factors = {}
    for part, (alpha, beta, release) in _MINIMAX_FACTORS.items():
        factors[part] = (
            float(d.get(alpha, d.get(release + "_alpha", 1.0))),
            float(d.get(beta, d.get(release + "_beta", 1.0))),
        )
    theta, _ = rope_fields(d)
    heads = int(d["num_attention_heads"])
    return cls(
        **common_fields(
            "minimax",
            d,
            data,
            types,
            heads,
            int(d.get("num_key_value_heads") or heads),
            int(d.get("head_dim") or int(d["hidden_size"]) // heads),
            float(d["rms_norm_eps"]),
            int(d["max_position_embeddings"]),
            "silu",
        ),
        intermediate_size=int(d["intermediate_size"]),
        rope_theta=theta,
        partial_rotary_factor=1.0,
        attention_bias=False,
        num_experts=int(d["num_local_experts"]),
        num_experts_per_tok=int(d["num_experts_per_tok"]),
        moe_intermediate_size=int(d["intermediate_size"]),
        norm_topk_prob=True,
        residual_factors=factors,
    )


def validate(config: HybridConfig) -> None:
    check_experts(config)
    check_rotary(config)


class MiniMaxLayer(nn.Module):
    def __init__(self, config: HybridConfig, idx: int) -> None:
        super().__init__()
        self.is_linear = config.layer_types[idx] == LINEAR
        self.self_attn: nn.Module = LightningAttention(config, idx) if self.is_linear else Attention(config, idx)
        self.input_layernorm = PlainRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = PlainRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MoE(Router(config), Experts(config))  # top-k renormalised, no shared expert
        alpha, beta = config.residual_factors["linear_attn" if self.is_linear else "full_attn"]
        self.attn_alpha, self.attn_beta = alpha, beta
        self.mlp_alpha, self.mlp_beta = config.residual_factors["mlp"]

    @property
    def linear_mixer(self) -> nn.Module:
        return self.self_attn

    def forward(self, x: torch.Tensor, ctx: Forward) -> torch.Tensor:
        h = self.input_layernorm(x)
        if self.is_linear:
            out = self.self_attn(h, ctx)
        else:
            out = self.self_attn(h, ctx)
        h = self.post_attention_layernorm(h * self.attn_alpha + out * self.attn_beta)
        return h * self.mlp_alpha + self.mlp(h) * self.mlp_beta


def map_weights(tensors: dict[str, torch.Tensor], config: HybridConfig) -> None:
    """Mixtral's names (``block_sparse_moe``, experts' ``w1``/``w2``/``w3``); the decay tables dropped."""
    drop(tensors, "slope_rate", "query_decay", "key_decay", "diagonal_decay")
    merge_expert_modules(tensors, config, "block_sparse_moe", "mlp")


FAMILIES = (
    Family(
        model_types=("minimax",),
        mixer="lightning",
        read_config=read_minimax,
        layer=MiniMaxLayer,
        validate=validate,
        map_weights=map_weights,
    ),
)
