"""Granite-4.0-H (``granitemoehybrid``): Mamba2 or attention (RoPE or none, its own scale), then a shared
SwiGLU MLP plus, with experts, a softmax-routed MoE; multipliers on the embedding, the residuals and the
logits.

Module names follow transformers' ``GraniteMoeHybridForCausalLM`` (``model.layers.N.mamba`` / ``.self_attn``,
``shared_mlp.input_linear`` fused gate and up, ``block_sparse_moe``); its checkpoints name the MoE as the
original release did, which ``map_weights`` renames as transformers does on load.
"""

from __future__ import annotations

from typing import Any

import torch

from ..attention import Attention
from ..block import PreNormLayer
from ..config import FULL, LINEAR, HybridConfig
from ..family import Family
from ..layers import FUSED_GATE_UP, Experts, MoE, PlainRMSNorm, SwiGLU, TopKSoftmaxRouter
from ..mixers.mamba2 import Mamba2Mixer
from .reading import (
    MAMBA2_DEFAULTS,
    MAMBA2_SIZES,
    check_act,
    check_mamba2,
    common_fields,
    layer_names,
    mamba2_fields,
    merge,
    rope_fields,
)

GRANITE: dict[str, Any] = {
    **MAMBA2_DEFAULTS,
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": None,  # None: num_attention_heads
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "embedding_multiplier": 1.0,
    "logits_scaling": 1.0,
    "residual_multiplier": 1.0,
    "attention_multiplier": 1.0,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "shared_intermediate_size": 1024,
    "position_embedding_type": None,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": None,
}


def read_granitemoehybrid(cls: type[HybridConfig], data: dict[str, Any]) -> HybridConfig:
    """Granite-4.0-H: Mamba2 or attention (RoPE or none), then a shared SwiGLU MLP plus an optional MoE, with
    embedding, attention, residual and logit multipliers."""
    d = merge(GRANITE, data)
    n = int(d["num_hidden_layers"])
    types = d.get("layer_types") or d.get("layers_block_type") or [LINEAR] * n
    types = layer_names(types, {LINEAR, FULL})
    check_act(d, "hidden_act", "silu")
    theta, _ = rope_fields(d)
    rope = d.get("position_embedding_type") == "rope"
    heads = int(d["num_attention_heads"])
    return cls(
        **common_fields(
            "granitemoehybrid",
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
        intermediate_size=int(d["shared_intermediate_size"]),
        rope_theta=theta,
        partial_rotary_factor=1.0 if rope else 0.0,
        attention_bias=bool(d["attention_bias"]),
        num_experts=int(d["num_local_experts"] or 0),
        num_experts_per_tok=int(d["num_experts_per_tok"]),
        moe_intermediate_size=int(d["intermediate_size"]),
        shared_expert_intermediate_size=int(d["shared_intermediate_size"]),
        **mamba2_fields(d),
        embedding_multiplier=float(d["embedding_multiplier"]),
        residual_multiplier=float(d["residual_multiplier"]),
        attention_scale=float(d["attention_multiplier"]),
        logits_scaling=float(d["logits_scaling"]),
    )


class GraniteLayer(PreNormLayer):
    """Its feed-forward is a shared SwiGLU plus, with experts, a MoE; both residuals scaled."""

    def __init__(self, config: HybridConfig, idx: int) -> None:
        linear = config.layer_types[idx] == LINEAR
        eps = config.rms_norm_eps
        super().__init__(
            linear,
            ("mamba", Mamba2Mixer(config, idx)) if linear else ("self_attn", Attention(config, idx)),
            None,
            ("input_layernorm", PlainRMSNorm(config.hidden_size, eps)),
            ("post_attention_layernorm", PlainRMSNorm(config.hidden_size, eps)),
            residual_multiplier=config.residual_multiplier,
        )
        self.shared_mlp = SwiGLU(config.hidden_size, config.shared_expert_intermediate_size, names=FUSED_GATE_UP)
        if config.num_experts:
            self.block_sparse_moe = MoE(TopKSoftmaxRouter(config), Experts(config), router_name="router")

    def ffn(self, x: torch.Tensor) -> torch.Tensor:
        out = self.shared_mlp(x)
        return out + self.block_sparse_moe(x) if hasattr(self, "block_sparse_moe") else out


# The release's MoE names, and transformers'.
_RENAMES = (
    (".block_sparse_moe.input_linear.weight", ".block_sparse_moe.experts.gate_up_proj"),
    (".block_sparse_moe.output_linear.weight", ".block_sparse_moe.experts.down_proj"),
    (".block_sparse_moe.router.layer.weight", ".block_sparse_moe.router.weight"),
)


def map_weights(tensors: dict[str, torch.Tensor], config: HybridConfig) -> None:
    for name in list(tensors):
        for old, new in _RENAMES:
            if name.endswith(old):
                tensors[name[: -len(old)] + new] = tensors.pop(name)


FAMILIES = (
    Family(
        model_types=("granitemoehybrid",),
        mixer="mamba2",
        read_config=read_granitemoehybrid,
        layer=GraniteLayer,
        linear_sizes=MAMBA2_SIZES,
        validate=check_mamba2,
        map_weights=map_weights,
    ),
)
