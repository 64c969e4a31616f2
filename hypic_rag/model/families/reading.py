"""The ``config.json`` idioms many families share, for their readers, and the checks their ``validate`` makes.

Readers take the fields as published checkpoints spell them, not only as ``save_pretrained`` writes them
(legacy layer names, ``Infinity`` written as transformers' tagged ``{"__float__": "Infinity"}``, ...), over
transformers 5's defaults: ``save_pretrained`` writes only the fields that differ from a class's defaults,
so a missing field must mean what it means to transformers.
"""

from __future__ import annotations

from typing import Any

from ..config import FULL, HYBRID, LINEAR, HybridConfig

# transformers' older layer names, as some checkpoints still spell them (its ``remap_legacy_layer_types``).
LEGACY_LAYER_TYPES = {"mamba": LINEAR, "attention": FULL}

# The ``mamba_*`` fields Granite-4.0-H, Bamba and Falcon-H1 share, with transformers' defaults.
MAMBA2_DEFAULTS: dict[str, Any] = {
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


def merge(
    defaults: dict[str, Any],
    data: dict[str, Any],
    aliases: dict[str, str] | None = None,
    keep_null: tuple[str, ...] = (),
) -> dict[str, Any]:
    """``data`` over the family's ``defaults``, fields renamed by ``aliases`` (a release's names for
    transformers' fields). A JSON null means the default, except for the token ids and the fields starting
    with one of ``keep_null``, where null is a value of its own."""
    d = dict(defaults)
    for key, value in data.items():
        if value is not None or key.endswith("token_id") or key.startswith(keep_null):
            d[(aliases or {}).get(key, key)] = value
    return d


def common_fields(
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
        "eos_token_ids": eos_ids(d.get("eos_token_id")),
        "bos_token_id": d.get("bos_token_id"),
        "pad_token_id": d.get("pad_token_id"),
        "raw": dict(data),
    }


def eos_ids(value: Any) -> tuple[int, ...]:
    """``eos_token_id`` as one id, a list of them or none."""
    return tuple(value) if isinstance(value, list) else (() if value is None else (int(value),))


def json_float(value: Any) -> float:
    """A float as JSON configs write it, transformers' tagged ``{"__float__": "Infinity"}`` included."""
    if isinstance(value, dict) and "__float__" in value:
        value = value["__float__"]
    return float(value)


def layer_names(types: Any, allowed: set[str]) -> tuple[str, ...]:
    """``layer_types`` as this runtime names them (legacy names mapped), each one of ``allowed``."""
    if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
        raise ValueError(f"layer_types must be a list of names, got {types!r}")
    out = tuple(LEGACY_LAYER_TYPES.get(t, t) for t in types)
    unknown = sorted(set(out) - allowed)
    if unknown:
        raise ValueError(f"unsupported layer types {unknown}; expected {sorted(allowed)}")
    return out


def rope_fields(d: dict[str, Any]) -> tuple[float, float | None]:
    """``rope_theta`` and ``partial_rotary_factor`` from ``rope_parameters`` or the legacy top-level fields."""
    rope = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
        raise ValueError(f"unsupported rope_type {kind!r}: only 'default' RoPE is implemented")
    partial = rope.get("partial_rotary_factor", d.get("partial_rotary_factor"))
    return float(rope.get("rope_theta", d.get("rope_theta", 10000.0))), partial


def mamba2_fields(d: dict[str, Any]) -> dict[str, Any]:
    """The ``mamba_*`` fields (``MAMBA2_DEFAULTS``) under this runtime's names."""
    heads = int(d["mamba_n_heads"])
    head_dim = d["mamba_d_head"]
    if head_dim == "auto":
        head_dim = int(d["mamba_expand"]) * int(d["hidden_size"]) // heads
    return {
        "mamba_num_heads": heads,
        "mamba_head_dim": int(head_dim),
        "ssm_state_size": int(d["mamba_d_state"]),
        "mamba_n_groups": int(d["mamba_n_groups"]),
        "mamba_conv_kernel": int(d["mamba_d_conv"]),
        "mamba_conv_bias": bool(d["mamba_conv_bias"]),
        "mamba_proj_bias": bool(d["mamba_proj_bias"]),
        "time_step_limit": time_step_limit(d),
    }


def time_step_limit(d: dict[str, Any]) -> tuple[float, float]:
    """The dt clamp ``(low, high)`` from ``time_step_limit`` (null or missing: none)."""
    limit = d.get("time_step_limit") or [0.0, float("inf")]
    if not isinstance(limit, list | tuple) or len(limit) != 2:
        raise ValueError(f"time_step_limit must be [low, high], got {limit!r}")
    low, high = json_float(limit[0]), json_float(limit[1])
    if not 0.0 <= low <= high:
        raise ValueError(f"time_step_limit must satisfy 0 <= low <= high, got {limit!r}")
    return low, high


def check_act(d: dict[str, Any], name: str, want: str) -> None:
    """The only activation implemented for ``name``."""
    if d.get(name, want) != want:
        raise ValueError(f"unsupported {name} {d.get(name)!r}: only {want!r} is implemented")


def check_rotary(config: HybridConfig, required: bool = False) -> None:
    """The rotated part of a head is even and fits in it; ``required``: something rotates."""
    dim = config.rotary_dim
    if dim % 2 or dim > config.head_dim or (required and dim <= 0):
        raise ValueError(f"rotary dim {dim} must be even and within head_dim {config.head_dim}")


def check_experts(config: HybridConfig) -> None:
    """With experts, top-k picks between 1 and all of them, and they split into ``n_group`` groups of which
    ``topk_group`` are picked (1 and 1 where a family has no groups)."""
    if not config.num_experts:
        return
    if not 0 < config.num_experts_per_tok <= config.num_experts:
        raise ValueError(
            f"num_experts_per_tok must be between 1 and num_experts ({config.num_experts}), "
            f"got {config.num_experts_per_tok}"
        )
    if config.num_experts % config.moe_n_group or not 0 < config.moe_topk_group <= config.moe_n_group:
        raise ValueError("num_experts must split into n_group groups, topk_group of them picked")


def check_positive(config: HybridConfig, *names: str) -> None:
    for name in names:
        if getattr(config, name) < 1:
            raise ValueError(f"config {name} must be >= 1, got {getattr(config, name)}")


# The sizes a Gated DeltaNet or KDA layer needs, and a Mamba2 layer (``Family.linear_sizes``).
DELTA_SIZES = (
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
)
MAMBA2_SIZES = ("mamba_num_heads", "mamba_head_dim", "ssm_state_size", "mamba_n_groups", "mamba_conv_kernel")


def check_mamba2(config: HybridConfig, feed_forward: bool = True) -> None:
    """A Mamba2 hybrid's checks: heads split into the B/C groups; ``feed_forward`` layers have a width."""
    if any(t in (LINEAR, HYBRID) for t in config.layer_types) and config.mamba_num_heads % config.mamba_n_groups:
        raise ValueError("mamba_num_heads must be a multiple of n_groups")
    if feed_forward and config.intermediate_size <= 0:
        raise ValueError(f"the feed-forward layers need a size >= 1, got {config.intermediate_size}")
    check_rotary(config)
    check_experts(config)
