"""Bamba: Mamba2 everywhere but ``attn_layer_indices``, attention with half of each head rotated, a SwiGLU
after every mixer. Module names follow transformers' ``BambaForCausalLM``, so checkpoints load as they are.
"""

from __future__ import annotations

from typing import Any

from ..attention import Attention
from ..block import PreNormLayer
from ..config import FULL, LINEAR, HybridConfig
from ..family import Family
from ..layers import PlainRMSNorm, SwiGLU
from ..mixers.mamba2 import Mamba2Mixer
from .reading import (
    MAMBA2_DEFAULTS,
    MAMBA2_SIZES,
    check_act,
    check_mamba2,
    common_fields,
    mamba2_fields,
    merge,
    rope_fields,
)

BAMBA: dict[str, Any] = {
    **MAMBA2_DEFAULTS,
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


def read_bamba(cls: type[HybridConfig], data: dict[str, Any]) -> HybridConfig:
    """Bamba: Mamba2 everywhere but ``attn_layer_indices``; attention with half the head rotated (transformers
    forces ``partial_rotary_factor = 0.5``); a SwiGLU MLP after every mixer."""
    d = merge(BAMBA, data)
    n = int(d["num_hidden_layers"])
    attn = d.get("attn_layer_indices") or []
    if not isinstance(attn, list) or any(not isinstance(i, int) or not 0 <= i < n for i in attn):
        raise ValueError(f"attn_layer_indices must list layer indices below {n}, got {attn!r}")
    check_act(d, "hidden_act", "silu")
    theta, _ = rope_fields(d)
    heads = int(d["num_attention_heads"])
    return cls(
        **common_fields(
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
        **mamba2_fields(d),
        mlp_bias=bool(d["mlp_bias"]),
    )


class BambaLayer(PreNormLayer):
    def __init__(self, config: HybridConfig, idx: int) -> None:
        linear = config.layer_types[idx] == LINEAR
        eps = config.rms_norm_eps
        super().__init__(
            linear,
            ("mamba", Mamba2Mixer(config, idx)) if linear else ("self_attn", Attention(config, idx)),
            ("feed_forward", SwiGLU(config.hidden_size, config.intermediate_size)),
            ("input_layernorm", PlainRMSNorm(config.hidden_size, eps)),
            ("pre_ff_layernorm", PlainRMSNorm(config.hidden_size, eps)),
        )


FAMILIES = (
    Family(
        model_types=("bamba",),
        mixer="mamba2",
        read_config=read_bamba,
        layer=BambaLayer,
        final_norm="final_layernorm",
        linear_sizes=MAMBA2_SIZES,
        validate=check_mamba2,
    ),
)
