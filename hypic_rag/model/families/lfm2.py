"""LFM2 (Liquid): gated short convolutions (``mixers.short_conv``) and attention with q/k RMSNorm per head,
each followed by a SwiGLU. Module names follow transformers' ``Lfm2ForCausalLM`` (``conv``,
``self_attn.out_proj``, ``q_layernorm``, ``feed_forward.w1/w2/w3``, ``operator_norm``, ``ffn_norm``,
``model.embedding_norm``), so checkpoints load as they are.
"""

from __future__ import annotations

from typing import Any

from ..attention import Attention
from ..block import PreNormLayer
from ..config import FULL, LINEAR, HybridConfig
from ..family import Family
from ..layers import W1_W2_W3, PlainRMSNorm, SwiGLU
from ..mixers.short_conv import ShortConv
from .reading import common_fields, merge, rope_fields

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
    d = merge(LFM2, data, keep_null=("block",))
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
    theta, _ = rope_fields({**d, "rope_theta": d["rope_theta"]})
    heads = int(d["num_attention_heads"])
    return cls(
        **common_fields(
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


def validate(config: HybridConfig) -> None:
    if LINEAR in config.layer_types and config.short_conv_kernel < 1:
        raise ValueError(f"conv_L_cache must be >= 1, got {config.short_conv_kernel}")
    if config.intermediate_size < 1:
        raise ValueError(f"the feed-forward size must be >= 1, got {config.intermediate_size}")


class Lfm2Layer(PreNormLayer):
    def __init__(self, config: HybridConfig, idx: int) -> None:
        linear = config.layer_types[idx] == LINEAR
        attention = Attention(config, idx, out="out_proj", qk_norm=("q_layernorm", "k_layernorm"))
        super().__init__(
            linear,
            ("conv", ShortConv(config, idx)) if linear else ("self_attn", attention),
            ("feed_forward", SwiGLU(config.hidden_size, config.intermediate_size, names=W1_W2_W3)),
            ("operator_norm", PlainRMSNorm(config.hidden_size, config.rms_norm_eps)),
            ("ffn_norm", PlainRMSNorm(config.hidden_size, config.rms_norm_eps)),
        )


FAMILIES = (
    Family(
        model_types=("lfm2",),
        mixer="short_conv",
        read_config=read_lfm2,
        layer=Lfm2Layer,
        final_norm="embedding_norm",  # transformers' name for LFM2's final norm
        validate=validate,
    ),
)
