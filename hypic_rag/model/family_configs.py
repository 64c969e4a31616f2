"""``config.json`` readers for the Mamba2 hybrids: Nemotron-H, Granite-4.0-H (``granitemoehybrid``), Bamba.

Each reads the fields as published checkpoints spell them, not only as ``save_pretrained`` writes them:
Nemotron's ``hybrid_override_pattern``, Granite's ``layer_types`` of ``mamba``/``attention``, Bamba's
``attn_layer_indices``, the ``mamba_*`` aliases, ``mamba_d_head: "auto"``, a ``time_step_limit`` written
as ``Infinity`` or as transformers' tagged ``{"__float__": "Infinity"}``. Defaults are transformers 5's:
a missing field means what it means to transformers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .config import FULL, HYBRID, LINEAR, MLP, MOE, HybridConfig

# transformers' older layer names, as some checkpoints still spell them (its ``remap_legacy_layer_types``).
LEGACY_LAYER_TYPES = {"mamba": LINEAR, "attention": FULL}
# Nemotron-H's ``hybrid_override_pattern``: one character per layer.
NEMOTRON_PATTERN = {"M": LINEAR, "*": FULL, "-": MLP, "E": MOE}

NEMOTRON_H: dict[str, Any] = {
    "vocab_size": 131072,
    "hidden_size": 4096,
    "tie_word_embeddings": False,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 4096,
    "intermediate_size": 21504,
    "mlp_hidden_act": "relu2",
    "mlp_bias": False,
    "ssm_state_size": 128,
    "mamba_num_heads": 128,
    "mamba_head_dim": 64,
    "mamba_hidden_act": "silu",
    "n_groups": 8,
    "conv_kernel": 4,
    "use_conv_bias": True,
    "time_step_min": 0.001,
    "use_bias": False,
    "n_routed_experts": 8,
    "moe_intermediate_size": 7688,
    "moe_shared_expert_intermediate_size": 7688,
    "moe_latent_size": None,
    "num_experts_per_tok": 2,
    "routed_scaling_factor": 1.0,
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": True,
    "layer_norm_epsilon": 1e-5,
    "eos_token_id": 2,
    "bos_token_id": 1,
    "pad_token_id": 0,
}
NEMOTRON_ALIASES = {
    "mamba_n_groups": "n_groups",
    "mamba_d_conv": "conv_kernel",
    "mamba_conv_bias": "use_conv_bias",
    "mamba_dt_min": "time_step_min",
}

# Granite-4.0-H and Bamba share their Mamba fields.
_MAMBA: dict[str, Any] = {
    "mamba_n_heads": 128,
    "mamba_n_groups": 1,
    "mamba_d_state": 256,
    "mamba_d_head": "auto",
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_conv_bias": True,
    "mamba_proj_bias": False,
    "time_step_limit": [0.0, float("inf")],
}
GRANITE: dict[str, Any] = {
    **_MAMBA,
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
BAMBA: dict[str, Any] = {
    **_MAMBA,
    "vocab_size": 128000,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_act": "silu",
    "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
    "attn_layer_indices": None,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}


def _common(
    model_type: str,
    d: dict[str, Any],
    data: dict[str, Any],
    types: Any,
    heads: int,
    kv_heads: int,
    head_dim: int,
    eps: float,
    max_positions: int,
    hidden_act: str,
) -> dict[str, Any]:
    """The fields every family's config gives the same way, from its merged fields ``d``."""
    types = tuple(types)
    return {
        "model_type": model_type,
        "vocab_size": int(d["vocab_size"]),
        "hidden_size": int(d["hidden_size"]),
        "num_hidden_layers": len(types),
        "layer_types": types,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": eps,
        "hidden_act": hidden_act,
        "max_position_embeddings": max_positions,
        "tie_word_embeddings": bool(d["tie_word_embeddings"]),
        "eos_token_ids": _eos(d.get("eos_token_id")),
        "bos_token_id": d.get("bos_token_id"),
        "pad_token_id": d.get("pad_token_id"),
        "raw": dict(data),
    }


def _eos(value: Any) -> tuple[int, ...]:
    return tuple(value) if isinstance(value, list) else (() if value is None else (int(value),))


def _float(value: Any) -> float:
    """A float as JSON configs write it, transformers' tagged ``{"__float__": "Infinity"}`` included."""
    if isinstance(value, dict) and "__float__" in value:
        value = value["__float__"]
    return float(value)


def _layer_names(types: Any, allowed: set[str]) -> tuple[str, ...]:
    if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
        raise ValueError(f"layer_types must be a list of names, got {types!r}")
    out = tuple(LEGACY_LAYER_TYPES.get(t, t) for t in types)
    unknown = sorted(set(out) - allowed)
    if unknown:
        raise ValueError(f"unsupported layer types {unknown}; expected {sorted(allowed)}")
    return out


def _rope(d: dict[str, Any]) -> tuple[float, float | None]:
    """``rope_theta`` and ``partial_rotary_factor`` from ``rope_parameters`` or the legacy top-level fields."""
    rope = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
        raise ValueError(f"unsupported rope_type {kind!r}: only 'default' RoPE is implemented")
    partial = rope.get("partial_rotary_factor", d.get("partial_rotary_factor"))
    return float(rope.get("rope_theta", d.get("rope_theta", 10000.0))), partial


def _mamba_fields(d: dict[str, Any]) -> dict[str, Any]:
    """Granite's and Bamba's ``mamba_*`` fields under this runtime's names."""
    heads = int(d["mamba_n_heads"])
    head_dim = d["mamba_d_head"]
    if head_dim == "auto":
        head_dim = int(d["mamba_expand"]) * int(d["hidden_size"]) // heads
    limit = d.get("time_step_limit") or [0.0, float("inf")]
    return {
        "mamba_num_heads": heads,
        "mamba_head_dim": int(head_dim),
        "ssm_state_size": int(d["mamba_d_state"]),
        "mamba_n_groups": int(d["mamba_n_groups"]),
        "mamba_conv_kernel": int(d["mamba_d_conv"]),
        "mamba_conv_bias": bool(d["mamba_conv_bias"]),
        "mamba_proj_bias": bool(d["mamba_proj_bias"]),
        "time_step_min": _float(limit[0]),
        "time_step_max": _float(limit[1]),
    }


def _check_act(d: dict[str, Any], name: str, want: str) -> None:
    if d.get(name, want) != want:
        raise ValueError(f"unsupported {name} {d.get(name)!r}: only {want!r} is implemented")


def read_nemotron_h(cls: type[HybridConfig], data: dict[str, Any]) -> HybridConfig:
    """Nemotron-H: Mamba2, attention without RoPE, ReLU² MLP and MoE layers, from ``hybrid_override_pattern``
    (``M*-E``) or ``layers_block_type`` / ``layer_types``."""
    d = dict(NEMOTRON_H)
    for key, value in data.items():
        if value is not None or key.endswith("token_id"):
            d[NEMOTRON_ALIASES.get(key, key)] = value
    types = d.get("layers_block_type") or d.get("layer_types")
    if types is None:
        pattern = d.get("hybrid_override_pattern")
        if not isinstance(pattern, str) or not pattern:
            raise ValueError("a nemotron_h config needs layers_block_type or hybrid_override_pattern")
        bad = sorted(set(pattern) - set(NEMOTRON_PATTERN))
        if bad:
            raise ValueError(f"hybrid_override_pattern has unknown layer codes {bad}; expected M, *, - or E")
        types = [NEMOTRON_PATTERN[ch] for ch in pattern]
    types = _layer_names(types, {LINEAR, FULL, MLP, MOE})
    _check_act(d, "mlp_hidden_act", "relu2")
    _check_act(d, "mamba_hidden_act", "silu")
    if d.get("sliding_window"):
        raise ValueError("nemotron_h with sliding_window attention is not supported")
    return cls(
        **_common(
            "nemotron_h",
            d,
            data,
            types,
            int(d["num_attention_heads"]),
            int(d.get("num_key_value_heads") or d["num_attention_heads"]),
            int(d.get("head_dim") or d["hidden_size"] // d["num_attention_heads"]),
            float(d["layer_norm_epsilon"]),
            int(d["max_position_embeddings"]),
            "relu2",
        ),
        intermediate_size=int(d["intermediate_size"]),
        rope_theta=10000.0,
        partial_rotary_factor=0.0,  # Nemotron-H's attention has no position encoding
        attention_bias=False,
        num_experts=int(d["n_routed_experts"]) if MOE in types else 0,
        num_experts_per_tok=int(d["num_experts_per_tok"]),
        moe_intermediate_size=int(d["moe_intermediate_size"]),
        shared_expert_intermediate_size=int(d["moe_shared_expert_intermediate_size"]),
        norm_topk_prob=bool(d["norm_topk_prob"]),
        mamba_num_heads=int(d["mamba_num_heads"]),
        mamba_head_dim=int(d["mamba_head_dim"]),
        ssm_state_size=int(d["ssm_state_size"]),
        mamba_n_groups=int(d["n_groups"]),
        mamba_conv_kernel=int(d["conv_kernel"]),
        mamba_conv_bias=bool(d["use_conv_bias"]),
        mamba_proj_bias=bool(d["use_bias"]),
        time_step_min=float(d["time_step_min"]),  # the mixer clamps dt to (time_step_min, inf)
        mlp_bias=bool(d["mlp_bias"]),
        moe_latent_size=int(d["moe_latent_size"]) if d.get("moe_latent_size") else None,
        moe_n_group=int(d["n_group"]),
        moe_topk_group=int(d["topk_group"]),
        routed_scaling_factor=float(d["routed_scaling_factor"]),
    )


def read_granitemoehybrid(cls: type[HybridConfig], data: dict[str, Any]) -> HybridConfig:
    """Granite-4.0-H: Mamba2 or attention (RoPE or none), then a shared SwiGLU MLP plus an optional MoE, with
    embedding, attention, residual and logit multipliers."""
    d = {**GRANITE, **{k: v for k, v in data.items() if v is not None or k.endswith("token_id")}}
    n = int(d["num_hidden_layers"])
    types = d.get("layer_types") or d.get("layers_block_type") or [LINEAR] * n
    types = _layer_names(types, {LINEAR, FULL})
    _check_act(d, "hidden_act", "silu")
    theta, _ = _rope(d)
    rope = d.get("position_embedding_type") == "rope"
    heads = int(d["num_attention_heads"])
    return cls(
        **_common(
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
        **_mamba_fields(d),
        embedding_multiplier=float(d["embedding_multiplier"]),
        residual_multiplier=float(d["residual_multiplier"]),
        attention_scale=float(d["attention_multiplier"]),
        logits_scaling=float(d["logits_scaling"]),
    )


def read_bamba(cls: type[HybridConfig], data: dict[str, Any]) -> HybridConfig:
    """Bamba: Mamba2 everywhere but ``attn_layer_indices``; attention with half the head rotated (transformers
    forces ``partial_rotary_factor = 0.5``); a SwiGLU MLP after every mixer."""
    d = {**BAMBA, **{k: v for k, v in data.items() if v is not None or k.endswith("token_id")}}
    n = int(d["num_hidden_layers"])
    attn = d.get("attn_layer_indices") or []
    if not isinstance(attn, list) or any(not isinstance(i, int) or not 0 <= i < n for i in attn):
        raise ValueError(f"attn_layer_indices must list layer indices below {n}, got {attn!r}")
    _check_act(d, "hidden_act", "silu")
    theta, _ = _rope(d)
    heads = int(d["num_attention_heads"])
    return cls(
        **_common(
            "bamba",
            d,
            data,
            tuple(FULL if i in attn else LINEAR for i in range(n)),
            heads,
            int(data.get("num_key_value_heads", d["num_key_value_heads"]) or heads),  # null: heads
            int(d.get("head_dim") or int(d["hidden_size"]) // heads),
            float(d["rms_norm_eps"]),
            int(d["max_position_embeddings"]),
            "silu",
        ),
        intermediate_size=int(d["intermediate_size"]),
        rope_theta=theta,
        partial_rotary_factor=0.5,
        attention_bias=bool(d["attention_bias"]),
        **_mamba_fields(d),
        mlp_bias=bool(d["mlp_bias"]),
    )


READERS: dict[str, Callable[[type[HybridConfig], dict[str, Any]], HybridConfig]] = {
    "nemotron_h": read_nemotron_h,
    "granitemoehybrid": read_granitemoehybrid,
    "bamba": read_bamba,
}


LFM2: dict[str, Any] = {
    "vocab_size": 65536,
    "hidden_size": 2560,
    "intermediate_size": 12288,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 128000,
    "norm_eps": 1e-5,
    "tie_word_embeddings": True,
    "conv_bias": False,
    "conv_L_cache": 3,
    "block_multiple_of": 256,
    "block_ffn_dim_multiplier": 1.0,
    "block_auto_adjust_ff_dim": True,
    "full_attn_idxs": None,
    "rope_theta": 1000000.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}


def lfm2_ffn_size(d: dict[str, Any]) -> int:
    """LFM2's feed-forward width: ``intermediate_size`` shrunk to 2/3, scaled and rounded up to a multiple,
    as transformers' ``Lfm2MLP`` computes it."""
    size = int(d["intermediate_size"])
    if d["block_auto_adjust_ff_dim"]:
        size = int(2 * size / 3)
        if d["block_ffn_dim_multiplier"] is not None:
            size = int(d["block_ffn_dim_multiplier"] * size)
            multiple = int(d["block_multiple_of"])
            size = multiple * ((size + multiple - 1) // multiple)
    return size


def read_lfm2(cls: type[HybridConfig], data: dict[str, Any]) -> HybridConfig:
    """LFM2: short gated convolutions (``conv``) and attention with q/k RMSNorm and full RoPE, each followed by
    a SwiGLU. Layer types from ``layer_types``, else ``full_attn_idxs`` (none: every layer attends);
    ``tie_embedding`` and ``block_ff_dim`` are the published aliases."""
    d = {**LFM2, **{k: v for k, v in data.items() if v is not None or k.endswith("token_id") or k.startswith("block")}}
    if "tie_embedding" in data:
        d["tie_word_embeddings"] = data["tie_embedding"]
    if "block_ff_dim" in data:
        d["intermediate_size"] = data["block_ff_dim"]
    n = int(d["num_hidden_layers"])
    types = d.get("layer_types")
    if types is None:
        full = d.get("full_attn_idxs")
        full = list(range(n)) if full is None else full
        types = ["full_attention" if i in full else "conv" for i in range(n)]
    if not isinstance(types, list) or any(t not in ("conv", FULL) for t in types):
        raise ValueError(f"lfm2 layer_types must be 'conv' or 'full_attention', got {types!r}")
    theta, _ = _rope({**d, "rope_theta": d["rope_theta"]})
    heads = int(d["num_attention_heads"])
    return cls(
        **_common(
            "lfm2",
            d,
            data,
            tuple(LINEAR if t == "conv" else FULL for t in types),
            heads,
            int(d["num_key_value_heads"]),
            int(d["hidden_size"]) // heads,
            float(d["norm_eps"]),
            int(d["max_position_embeddings"]),
            "silu",
        ),
        intermediate_size=lfm2_ffn_size(d),
        rope_theta=theta,
        partial_rotary_factor=1.0,
        attention_bias=False,
        short_conv_kernel=int(d["conv_L_cache"]),
        short_conv_bias=bool(d["conv_bias"]),
    )


READERS["lfm2"] = read_lfm2


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
    d = {**MINIMAX, **{k: v for k, v in data.items() if v is not None or k.endswith("token_id")}}
    if "num_experts" in data:
        d["num_local_experts"] = data["num_experts"]
    n = int(d["num_hidden_layers"])
    types = d.get("layer_types")
    if types is None and isinstance(d.get("attn_type_list"), list):
        types = [FULL if int(t) == 1 else LINEAR for t in d["attn_type_list"]]
    if types is None:
        types = [FULL if (i + 1) % 2 else LINEAR for i in range(n)]
    types = _layer_names(types, {LINEAR, FULL})
    if d.get("sliding_window"):
        raise ValueError("minimax with sliding_window attention is not supported")
    if d.get("postnorm") is False:
        raise ValueError("minimax with postnorm=false is not supported: transformers' MiniMax is post-norm")
    _check_act(d, "hidden_act", "silu")
    factors = {}
    for part, (alpha, beta, release) in _MINIMAX_FACTORS.items():
        factors[part] = (
            float(d.get(alpha, d.get(release + "_alpha", 1.0))),
            float(d.get(beta, d.get(release + "_beta", 1.0))),
        )
    theta, _ = _rope(d)
    heads = int(d["num_attention_heads"])
    return cls(
        **_common(
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


READERS["minimax"] = read_minimax


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
    d = dict(KIMI_LINEAR)
    for key, value in data.items():
        if value is not None or key.endswith("token_id") or key == "q_lora_rank":
            d[KIMI_ALIASES.get(key, key)] = value
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
    types = _layer_names(types, {LINEAR, FULL})
    _check_act(d, "hidden_act", "silu")
    attn_heads = int(d["num_attention_heads"])
    return cls(
        **_common(
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


READERS["kimi_linear"] = read_kimi_linear


OLMO_HYBRID: dict[str, Any] = {
    "vocab_size": 100352,
    "hidden_size": 3840,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 30,
    "hidden_act": "silu",
    "max_position_embeddings": 65536,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "linear_conv_kernel_dim": 4,
    "linear_allow_neg_eigval": True,
    "pad_token_id": 100277,
    "bos_token_id": None,
    "eos_token_id": 100257,
}


def read_olmo_hybrid(cls: type[HybridConfig], data: dict[str, Any]) -> HybridConfig:
    """OLMo hybrid: Gated DeltaNet layers (pre-norm; beta doubled when ``linear_allow_neg_eigval``) and
    attention layers (post-norm, q/k RMSNorm over the whole projection, RoPE — or none when
    ``rope_theta`` is null)."""
    d = {**OLMO_HYBRID, **{k: v for k, v in data.items() if v is not None or k.endswith("token_id")}}
    n, h = int(d["num_hidden_layers"]), int(d["hidden_size"])
    heads = int(d["num_attention_heads"])
    types = d.get("layer_types")
    if types is None:
        types = [FULL if i % 4 == 3 else LINEAR for i in range(n)]
        if FULL not in types:
            types[-1] = FULL
    types = _layer_names(types, {LINEAR, FULL})
    _check_act(d, "hidden_act", "silu")
    rope = dict(d.get("rope_parameters") or {})
    nope = any("rope_theta" in where and where["rope_theta"] is None for where in (rope, data))
    theta = 10000.0 if nope else _rope(d)[0]
    k_heads = int(d.get("linear_num_key_heads") or heads)
    v_heads = int(d.get("linear_num_value_heads") or heads)
    dk = int(d.get("linear_key_head_dim") or int(0.75 * h / k_heads))
    return cls(
        **_common(
            "olmo_hybrid",
            d,
            data,
            types,
            heads,
            int(d.get("num_key_value_heads") or heads),
            int(d.get("head_dim") or h // heads),
            float(d["rms_norm_eps"]),
            int(d["max_position_embeddings"]),
            "silu",
        ),
        intermediate_size=int(d["intermediate_size"]),
        rope_theta=theta,
        partial_rotary_factor=0.0 if nope else 1.0,
        attention_bias=bool(d["attention_bias"]),
        linear_num_key_heads=k_heads,
        linear_num_value_heads=v_heads,
        linear_key_head_dim=dk,
        linear_value_head_dim=int(d.get("linear_value_head_dim") or 2 * dk),
        linear_conv_kernel_dim=int(d["linear_conv_kernel_dim"]),
        linear_beta_scale=2.0 if d["linear_allow_neg_eigval"] else 1.0,
        linear_norm_eps=1e-5,  # transformers hard-codes the read-out norm's eps
    )


READERS["olmo_hybrid"] = read_olmo_hybrid


FALCON_H1: dict[str, Any] = {
    **_MAMBA,
    "vocab_size": 128000,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": None,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": False,
    "mamba_d_ssm": 1024,
    "mamba_d_head": "auto",
    "mamba_norm_before_gate": True,
    "mamba_rms_norm": False,
    "projectors_bias": False,
    "attention_bias": False,
    "mlp_bias": False,
    "embedding_multiplier": 1.0,
    "lm_head_multiplier": 1.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}


def read_falcon_h1(cls: type[HybridConfig], data: dict[str, Any]) -> HybridConfig:
    """Falcon-H1: attention and Mamba2 side by side in every layer, with μP multipliers. The multipliers on
    projections are folded into their weights when loading (``loading``); the embedding's and the LM
    head's stay here."""
    d = {**FALCON_H1, **{k: v for k, v in data.items() if v is not None or k.endswith("token_id")}}
    if "mamba_d_ssm" in data and data["mamba_d_ssm"] is None:
        d["mamba_d_ssm"] = int(d["mamba_expand"]) * int(d["hidden_size"])
    heads = int(d["num_attention_heads"])
    mamba = _mamba_fields({**d, "mamba_expand": int(d["mamba_d_ssm"]) // int(d["hidden_size"]) or 1})
    if d["mamba_d_head"] == "auto":
        mamba["mamba_head_dim"] = int(d["mamba_d_ssm"]) // int(d["mamba_n_heads"])
    if mamba["mamba_head_dim"] * mamba["mamba_num_heads"] != int(d["mamba_d_ssm"]):
        raise ValueError(
            f"mamba_n_heads x mamba_d_head = {mamba['mamba_num_heads']} x {mamba['mamba_head_dim']} "
            f"must equal mamba_d_ssm = {d['mamba_d_ssm']}"
        )
    _check_act(d, "hidden_act", "silu")
    theta, _ = _rope(d)
    lm_head = float(d["lm_head_multiplier"])
    if lm_head == 0:
        raise ValueError("lm_head_multiplier must not be 0")
    norm = "norm_then_gate" if d["mamba_norm_before_gate"] else "gate_then_norm"
    norm = norm if d["mamba_rms_norm"] else "none"
    n = int(d["num_hidden_layers"])
    return cls(
        **_common(
            "falcon_h1",
            d,
            data,
            (HYBRID,) * n,
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
        attention_bias=bool(d["attention_bias"]),
        **mamba,
        mamba_norm=norm,
        mamba_out_bias=bool(d["projectors_bias"]),
        mlp_bias=bool(d["mlp_bias"]),
        embedding_multiplier=float(d["embedding_multiplier"]),
        logits_scaling=1.0 / lm_head,
    )


READERS["falcon_h1"] = read_falcon_h1


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
    d = {**BAILING_MOE_LINEAR, **{k: v for k, v in data.items() if v is not None or k.endswith("token_id")}}
    n, h = int(d["num_hidden_layers"]), int(d["hidden_size"])
    heads = int(d["num_attention_heads"])
    head_dim = int(d.get("head_dim") or h // heads)
    types = d.get("layer_types") or ring_layer_types(n, int(d["layer_group_size"]))
    types = _layer_names(types, {LINEAR, FULL})
    _check_act(d, "hidden_act", "silu")
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
        **_common(
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


READERS["bailing_moe_linear"] = read_bailing_moe_linear


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
    d = {**JAMBA, **{k: v for k, v in data.items() if v is not None or k.endswith("token_id")}}
    if "num_local_experts" in data:
        d["num_experts"] = data["num_local_experts"]
    n, h = int(d["num_hidden_layers"]), int(d["hidden_size"])
    for period, offset in (("attn_layer_period", "attn_layer_offset"), ("expert_layer_period", "expert_layer_offset")):
        if not 0 <= int(d[offset]) < int(d[period]):
            raise ValueError(f"{offset} ({d[offset]}) must be smaller than {period} ({d[period]})")
    types = [FULL if i % int(d["attn_layer_period"]) == int(d["attn_layer_offset"]) else LINEAR for i in range(n)]
    experts = int(d["num_experts"])
    moe = [experts > 1 and i % int(d["expert_layer_period"]) == int(d["expert_layer_offset"]) for i in range(n)]
    _check_act(d, "hidden_act", "silu")
    rank = d["mamba_dt_rank"]
    heads = int(d["num_attention_heads"])
    return cls(
        **_common(
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


READERS["jamba"] = read_jamba


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
    d = dict(BAILING_HYBRID)
    for key, value in data.items():
        if value is not None or key.endswith("token_id") or key == "q_lora_rank":
            d[BAILING_HYBRID_ALIASES.get(key, key)] = value
    n, heads = int(d["num_hidden_layers"]), int(d["num_attention_heads"])
    types = d.get("layer_types") or [
        FULL if (i + 1) % int(d["layer_group_size"]) == 0 else LINEAR for i in range(n)
    ]
    types = _layer_names(types, {LINEAR, FULL})
    _check_act(d, "hidden_act", "silu")
    rope = dict(d.get("rope_parameters") or {})
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ValueError(f"unsupported rope_type {rope.get('rope_type')!r}: only 'default' RoPE is implemented")
    theta = float(rope.get("rope_theta", d["rope_theta"]))
    linear_dim = int(d.get("linear_head_dim") or d["head_dim"])
    qk = int(d["qk_nope_head_dim"]) + int(d["qk_rope_head_dim"])
    return cls(
        **_common(
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


READERS["bailing_hybrid"] = read_bailing_hybrid
