"""Kimi Linear (``kimi_linear``) and Ling 3.0 (``bailing_hybrid``): KDA linear attention (``mixers.kda``) and
MLA full attention (``attention.MultiLatentAttention``), a dense SwiGLU in the first layers and a
sigmoid-routed MoE with a shared expert after. They share their config fields and layers; their checkpoints
name the parts differently.

Kimi Linear's MLA has no RoPE (transformers' Kimi Linear applies none): its cached keys move to any
position unchanged; Ling's rotates the shared key part (interleaved) and gates each head's output. Module
names follow transformers' ``KimiLinearForCausalLM`` and ``BailingHybridForCausalLM``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..attention import MultiLatentAttention
from ..block import GroupRoutedLayer
from ..config import FULL, LINEAR, HybridConfig
from ..family import Family
from ..mixers.kda import BailingDeltaAttention, KimiDeltaAttention
from ..weight_names import fuse_qkv_convs, merge_expert_modules
from .bailing_moe_linear import map_weights as ring_weight_names
from .reading import DELTA_SIZES, check_act, check_experts, check_rotary, common_fields, layer_names, merge

KIMI_LINEAR: dict[str, Any] = {
    "vocab_size": 163840,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "moe_intermediate_size": 1024,
    "num_hidden_layers": 27,
    "num_attention_heads": 32,
    "n_shared_experts": 1,
    "routed_scaling_factor": 2.446,
    "kv_lora_rank": 512,
    "q_lora_rank": None,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "qk_nope_head_dim": 128,
    "n_group": 1,
    "topk_group": 1,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "hidden_act": "silu",
    "max_position_embeddings": 1048576,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "num_local_experts": 256,
    "linear_head_dim": 128,
    "linear_num_heads": 32,
    "linear_conv_kernel_dim": 4,
    "first_k_dense_replace": 1,
    "pad_token_id": 163839,
    "bos_token_id": 163584,
    "eos_token_id": 163586,
}
# The names Kimi Linear's config.json uses for transformers' fields (its ``attribute_map``).
KIMI_ALIASES = {
    "model_max_length": "max_position_embeddings",
    "moe_renormalize": "norm_topk_prob",
    "num_expert_group": "n_group",
    "num_experts": "num_local_experts",
    "num_experts_per_token": "num_experts_per_tok",
    "num_shared_experts": "n_shared_experts",
}


def _mla_moe(d: dict[str, Any], n: int) -> dict[str, Any]:
    """The fields Kimi Linear and Ling 3.0 share: MLA's widths, and a grouped sigmoid MoE after the first
    dense layers (``mlp_layer_types``, else ``first_k_dense_replace``)."""
    mlp_types = d.get("mlp_layer_types") or [
        "dense" if i < int(d["first_k_dense_replace"]) else "sparse" for i in range(n)
    ]
    if len(mlp_types) != n or any(m not in ("dense", "sparse") for m in mlp_types):
        raise ValueError(f"mlp_layer_types must list {n} of 'dense' or 'sparse', got {mlp_types!r}")
    return {
        "num_experts": int(d["num_local_experts"]),
        "num_experts_per_tok": int(d["num_experts_per_tok"]),
        "moe_intermediate_size": int(d["moe_intermediate_size"]),
        "shared_expert_intermediate_size": int(d["moe_intermediate_size"]) * int(d["n_shared_experts"]),
        "norm_topk_prob": bool(d["norm_topk_prob"]),
        "mlp_only_layers": tuple(i for i, m in enumerate(mlp_types) if m == "dense"),
        "moe_n_group": int(d["n_group"]),
        "moe_topk_group": int(d["topk_group"] or 1),
        "routed_scaling_factor": float(d["routed_scaling_factor"]),
        "q_lora_rank": int(d["q_lora_rank"]) if d.get("q_lora_rank") else None,
        "kv_lora_rank": int(d["kv_lora_rank"]),
        "qk_nope_head_dim": int(d["qk_nope_head_dim"]),
        "qk_rope_head_dim": int(d["qk_rope_head_dim"]),
        "v_head_dim": int(d["v_head_dim"]),
    }


def read_kimi_linear(cls: type[HybridConfig], data: dict[str, Any]) -> HybridConfig:
    """Kimi Linear: KDA and MLA layers from ``layer_types`` or ``linear_attn_config`` (``kda_layers`` /
    ``full_attn_layers``, 1-based), dense MLPs before ``first_k_dense_replace`` (or per ``mlp_layer_types``),
    the checkpoint's own field names (``num_experts``, ``moe_renormalize``, ...)."""
    d = merge(KIMI_LINEAR, data, KIMI_ALIASES, keep_null=("q_lora_rank",))
    linear = d.get("linear_attn_config") or {}
    if not isinstance(linear, dict):
        raise ValueError("linear_attn_config must be an object")
    heads = int(linear.get("num_heads", d["linear_num_heads"]))
    dim = int(linear.get("head_dim", d["linear_head_dim"]))
    kernel = int(linear.get("short_conv_kernel_size", d["linear_conv_kernel_dim"]))
    n = int(d["num_hidden_layers"])
    types = d.get("layer_types")
    if types is None and "kda_layers" in linear and "full_attn_layers" in linear:
        types = [None] * n
        for key, kind in (("full_attn_layers", FULL), ("kda_layers", LINEAR)):
            for one_based in linear[key]:
                if not 1 <= int(one_based) <= n:
                    raise ValueError(f"linear_attn_config.{key} holds {one_based}, outside layers 1..{n}")
                types[int(one_based) - 1] = kind
        unset = [i + 1 for i, kind in enumerate(types) if kind is None]
        if unset:
            raise ValueError(f"linear_attn_config leaves layers {unset} unset")
    if types is None:
        types = [FULL if i and i % 4 == 0 else LINEAR for i in range(n)]
    types = layer_names(types, {LINEAR, FULL})
    check_act(d, "hidden_act", "silu")
    attn_heads = int(d["num_attention_heads"])
    return cls(
        **common_fields(
            "kimi_linear",
            d,
            data,
            types,
            attn_heads,
            attn_heads,
            int(d["qk_nope_head_dim"]) + int(d["qk_rope_head_dim"]),
            float(d["rms_norm_eps"]),
            int(d["max_position_embeddings"]),
            "silu",
        ),
        intermediate_size=int(d["intermediate_size"]),
        rope_theta=10000.0,
        partial_rotary_factor=0.0,  # transformers' Kimi Linear rotates nothing
        attention_bias=bool(d["attention_bias"]),
        linear_num_key_heads=heads,
        linear_num_value_heads=heads,
        linear_key_head_dim=dim,
        linear_value_head_dim=dim,
        linear_conv_kernel_dim=kernel,
        **_mla_moe(d, n),
    )


BAILING_HYBRID: dict[str, Any] = {
    "vocab_size": 157184,
    "hidden_size": 2560,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 42,
    "num_attention_heads": 32,
    "num_key_value_heads": None,
    "n_shared_experts": 1,
    "routed_scaling_factor": 2.5,
    "kv_lora_rank": 512,
    "q_lora_rank": None,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "qk_nope_head_dim": 128,
    "n_group": 8,
    "topk_group": 4,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 2,
    "norm_topk_prob": True,
    "hidden_act": "silu",
    "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "num_local_experts": 512,
    "rope_theta": 6_000_000.0,
    "head_dim": 128,
    "short_conv_kernel_size": 4,
    "layer_group_size": 6,
    "kda_safe_gate": True,
    "kda_lower_bound": -5.0,
    "pad_token_id": 156892,
    "bos_token_id": None,
    "eos_token_id": 156895,
}
# Ling 3.0's config.json names for transformers' fields (its ``attribute_map``), as in Kimi Linear.
BAILING_HYBRID_ALIASES = {**KIMI_ALIASES, "num_mtp_layers": "num_nextn_predict_layers"}


def read_bailing_hybrid(cls: type[HybridConfig], data: dict[str, Any]) -> HybridConfig:
    """Ling 3.0 (``bailing_hybrid``): KDA layers and, every ``layer_group_size``-th layer, MLA with interleaved
    RoPE and a per-head output gate; dense MLPs before ``first_k_dense_replace``, then a grouped sigmoid MoE.
    The linear heads are ``head_dim`` wide in a release's config; a config saved by transformers writes that
    width as ``linear_head_dim`` (and ``head_dim`` as the rotated width)."""
    d = merge(BAILING_HYBRID, data, BAILING_HYBRID_ALIASES, keep_null=("q_lora_rank",))
    n, heads = int(d["num_hidden_layers"]), int(d["num_attention_heads"])
    types = d.get("layer_types") or [FULL if (i + 1) % int(d["layer_group_size"]) == 0 else LINEAR for i in range(n)]
    types = layer_names(types, {LINEAR, FULL})
    check_act(d, "hidden_act", "silu")
    rope = dict(d.get("rope_parameters") or {})
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ValueError(f"unsupported rope_type {rope.get('rope_type')!r}: only 'default' RoPE is implemented")
    theta = float(rope.get("rope_theta", d["rope_theta"]))
    linear_dim = int(d.get("linear_head_dim") or d["head_dim"])
    qk = int(d["qk_nope_head_dim"]) + int(d["qk_rope_head_dim"])
    return cls(
        **common_fields(
            "bailing_hybrid",
            d,
            data,
            types,
            heads,
            heads,  # MLA: every head has its own K and V after kv_b_proj
            qk,
            float(d["rms_norm_eps"]),
            int(d["max_position_embeddings"]),
            "silu",
        ),
        intermediate_size=int(d["intermediate_size"]),
        rope_theta=theta,
        partial_rotary_factor=int(d["qk_rope_head_dim"]) / qk,
        rope_dim=int(d["qk_rope_head_dim"]),
        attention_bias=bool(d["attention_bias"]),
        linear_num_key_heads=heads,
        linear_num_value_heads=heads,
        linear_key_head_dim=linear_dim,
        linear_value_head_dim=linear_dim,
        linear_conv_kernel_dim=int(d["short_conv_kernel_size"]),
        **_mla_moe(d, n),
        kda_safe_gate=bool(d["kda_safe_gate"]),
        kda_lower_bound=float(d["kda_lower_bound"]),
    )


def validate(config: HybridConfig) -> None:
    check_rotary(config)
    check_experts(config)
    if config.v_head_dim > config.head_dim:
        raise ValueError(f"v_head_dim {config.v_head_dim} is wider than the query-key head {config.head_dim}")


def kimi_layer(config: HybridConfig, idx: int) -> nn.Module:
    return GroupRoutedLayer(config, idx, "self_attn", KimiDeltaAttention, MultiLatentAttention)


def _ling_attention(config: HybridConfig, idx: int) -> nn.Module:
    return MultiLatentAttention(config, idx, out_name="dense", rotate_and_gate=True)


def ling_layer(config: HybridConfig, idx: int) -> nn.Module:
    return GroupRoutedLayer(config, idx, "attention", BailingDeltaAttention, _ling_attention)


def kimi_weight_names(tensors: dict[str, torch.Tensor], config: HybridConfig) -> None:
    """Kimi Linear's checkpoints keep the forget gate's tensors on the attention module, one short conv each
    for q, k and v, and DeepSeek's expert names (``block_sparse_moe``, ``w1``/``w2``/``w3``)."""
    for name in list(tensors):
        for part in ("f_a_proj", "f_b_proj", "dt_bias", "A_log"):
            old = f".self_attn.{part}"
            if old + "." in name or name.endswith(old):
                tensors[name.replace(old, f".self_attn.forget_gate.{part}")] = tensors.pop(name)
    fuse_qkv_convs(tensors, "self_attn")
    merge_expert_modules(tensors, config, "block_sparse_moe", "mlp")


def ling_weight_names(tensors: dict[str, torch.Tensor], config: HybridConfig) -> None:
    """Ling 3.0's checkpoints: one short conv each for q, k and v, and Ring-linear's MoE names."""
    fuse_qkv_convs(tensors, "attention")
    ring_weight_names(tensors, config)


FAMILIES = (
    Family(
        model_types=("kimi_linear",),
        mixer="kda",
        read_config=read_kimi_linear,
        layer=kimi_layer,
        linear_sizes=DELTA_SIZES,
        validate=validate,
        map_weights=kimi_weight_names,
        fp32_params=("e_score_correction_bias", "gate.weight", "dt_bias"),  # KDA's gate bias too
    ),
    Family(
        model_types=("bailing_hybrid",),
        mixer="kda",
        read_config=read_bailing_hybrid,
        layer=ling_layer,
        embeddings="word_embeddings",
        linear_sizes=DELTA_SIZES,
        validate=validate,
        map_weights=ling_weight_names,
        fp32_params=("e_score_correction_bias", "gate.weight"),
    ),
)
