"""Qwen3-Next and Qwen3.5 (dense and MoE, and the multimodal ``qwen3_5``/``qwen3_5_moe`` wrappers whose
text model sits in ``text_config``): Gated DeltaNet and gated attention, each followed by a SwiGLU or a MoE
with a sigmoid-gated shared expert.

Their norms are zero-centred (``layers.RMSNorm``, applied as ``1 + w``). Qwen3-Next's checkpoints fuse
and interleave the Gated DeltaNet projections per key-head group; Qwen3.5's are split as the runtime
keeps them. Module names follow transformers' ``Qwen3NextForCausalLM`` and ``Qwen3_5ForCausalLM``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..attention import GatedAttention
from ..block import PreNormLayer
from ..config import FULL, LINEAR, HybridConfig
from ..family import Family
from ..layers import Experts, MoE, RMSNorm, Router, SwiGLU
from ..linear import Linear
from ..mixers.deltanet import GatedDeltaNet
from ..weight_names import stack_experts
from .reading import DELTA_SIZES, check_act, check_experts, check_rotary, common_fields, merge, rope_fields

_COMMON: dict[str, Any] = {
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "head_dim": 256,
    "num_key_value_heads": 2,
    "num_attention_heads": 16,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "eos_token_id": None,
    "bos_token_id": None,
    "pad_token_id": None,
}

# Per model_type defaults, as transformers 5 defines them.
DEFAULTS: dict[str, dict[str, Any]] = {
    "qwen3_next": {
        **_COMMON,
        "vocab_size": 151936,
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_hidden_layers": 48,
        "decoder_sparse_step": 1,
        "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512,
        "num_experts_per_tok": 10,
        "num_experts": 512,
        "norm_topk_prob": True,
        "mlp_only_layers": [],
    },
    "qwen3_5_text": {
        **_COMMON,
        "vocab_size": 248320,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 32,
        "num_key_value_heads": 4,
        "num_experts": 0,
    },
    "qwen3_5_moe_text": {
        **_COMMON,
        "vocab_size": 248320,
        "hidden_size": 2048,
        "intermediate_size": 0,
        "num_hidden_layers": 40,
        "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512,
        "num_experts_per_tok": 8,
        "num_experts": 256,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    },
}

# Top-level model types whose text model lives in ``text_config``.
WRAPPERS = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}


def read_qwen(cls: type[HybridConfig], data: dict[str, Any]) -> HybridConfig:
    """Layer types from ``layer_types``, else a full-attention layer every ``full_attention_interval``; RoPE
    from ``rope_parameters`` (or the legacy ``rope_scaling`` / top-level fields)."""
    top = data
    model_type = data["model_type"]
    if model_type in WRAPPERS:
        text = data.get("text_config")
        if not isinstance(text, dict):
            raise ValueError(f"model_type {model_type!r} needs a 'text_config' object")
        data = {**text}
        if "tie_word_embeddings" in top:
            data["tie_word_embeddings"] = top["tie_word_embeddings"]
        data.setdefault("eos_token_id", top.get("eos_token_id"))
        model_type = WRAPPERS[model_type]
    d = merge(DEFAULTS[model_type], data)
    n_layers = int(d["num_hidden_layers"])
    layer_types = d.get("layer_types")
    if layer_types is None:
        interval = int(d.get("full_attention_interval", 4))
        layer_types = [LINEAR if (i + 1) % interval else FULL for i in range(n_layers)]
    layer_types = tuple(layer_types)
    if len(layer_types) != n_layers or any(t not in (LINEAR, FULL) for t in layer_types):
        raise ValueError(f"layer_types must list {n_layers} entries of {LINEAR!r} or {FULL!r}, got {list(layer_types)}")
    theta, partial = rope_fields(d)
    if model_type == "qwen3_5_moe_text":
        d["norm_topk_prob"] = True  # its router always renormalises
    check_act(d, "hidden_act", "silu")
    return cls(
        **common_fields(
            model_type,
            d,
            top,
            layer_types,
            int(d["num_attention_heads"]),
            int(d["num_key_value_heads"]),
            int(d["head_dim"]),
            float(d["rms_norm_eps"]),
            int(d["max_position_embeddings"]),
            "silu",
        ),
        intermediate_size=int(d.get("intermediate_size") or 0),
        linear_num_key_heads=int(d["linear_num_key_heads"]),
        linear_num_value_heads=int(d["linear_num_value_heads"]),
        linear_key_head_dim=int(d["linear_key_head_dim"]),
        linear_value_head_dim=int(d["linear_value_head_dim"]),
        linear_conv_kernel_dim=int(d["linear_conv_kernel_dim"]),
        rope_theta=theta,
        partial_rotary_factor=0.25 if partial is None else float(partial),
        attention_bias=bool(d["attention_bias"]),
        num_experts=int(d.get("num_experts") or 0),
        num_experts_per_tok=int(d.get("num_experts_per_tok") or 0),
        moe_intermediate_size=int(d.get("moe_intermediate_size") or 0),
        shared_expert_intermediate_size=int(d.get("shared_expert_intermediate_size") or 0),
        norm_topk_prob=bool(d.get("norm_topk_prob", True)),
        decoder_sparse_step=int(d.get("decoder_sparse_step") or 1),
        mlp_only_layers=tuple(d.get("mlp_only_layers") or ()),
    )


def validate(config: HybridConfig) -> None:
    if config.linear_num_value_heads % config.linear_num_key_heads:
        raise ValueError("linear_num_value_heads must be a multiple of linear_num_key_heads")
    check_rotary(config, required=True)
    check_experts(config)
    dense_layers = [i for i in range(config.num_hidden_layers) if not config.is_moe_layer(i)]
    if dense_layers and config.intermediate_size <= 0:
        raise ValueError(f"layers {dense_layers} are dense but intermediate_size is {config.intermediate_size}")


class QwenLayer(PreNormLayer):
    """Gated DeltaNet or gated attention, then a SwiGLU or a MoE."""

    def __init__(self, config: HybridConfig, idx: int) -> None:
        linear = config.layer_types[idx] == LINEAR
        mixer = ("linear_attn", GatedDeltaNet(config, idx)) if linear else ("self_attn", GatedAttention(config, idx))
        h = config.hidden_size
        if config.is_moe_layer(idx):
            shared = ("shared_expert", SwiGLU(h, config.shared_expert_intermediate_size))
            gate = Linear(h, 1, bias=False)  # sigmoid-gates the shared expert
            ffn: nn.Module = MoE(Router(config), Experts(config), shared=shared, shared_gate=gate)
        else:
            ffn = SwiGLU(h, config.intermediate_size)
        super().__init__(
            linear,
            mixer,
            ("mlp", ffn),
            ("input_layernorm", RMSNorm(h, config.rms_norm_eps)),
            ("post_attention_layernorm", RMSNorm(h, config.rms_norm_eps)),
        )


def split_qwen3_next_projections(tensors: dict[str, torch.Tensor], config: HybridConfig) -> None:
    """``in_proj_qkvz``/``in_proj_ba`` are laid out per key-head group as [q | k | v | z] and [b | a]."""
    nk, dk, dv = config.linear_num_key_heads, config.linear_key_head_dim, config.linear_value_head_dim
    r = config.linear_num_value_heads // nk
    for name in [n for n in tensors if n.endswith("linear_attn.in_proj_qkvz.weight")]:
        prefix = name[: -len("in_proj_qkvz.weight")]
        w = tensors.pop(name)
        if w.dim() != 2 or w.shape[0] != nk * (2 * dk + 2 * r * dv):
            raise ValueError(f"weight {name} has shape {tuple(w.shape)}, which does not fit the config")
        q, k, v, z = w.view(nk, 2 * dk + 2 * r * dv, -1).split((dk, dk, r * dv, r * dv), dim=1)
        hidden = w.shape[1]
        tensors[prefix + "in_proj_qkv.weight"] = torch.cat(
            (q.reshape(-1, hidden), k.reshape(-1, hidden), v.reshape(-1, hidden))
        )
        tensors[prefix + "in_proj_z.weight"] = z.reshape(-1, hidden)
        ba_name = prefix + "in_proj_ba.weight"
        if ba_name not in tensors:
            raise ValueError(f"missing weight {ba_name}")
        ba = tensors.pop(ba_name)
        if ba.dim() != 2 or ba.shape[0] != 2 * nk * r:
            raise ValueError(f"weight {ba_name} has shape {tuple(ba.shape)}, which does not fit the config")
        b, a = ba.view(nk, 2 * r, -1).split((r, r), dim=1)
        tensors[prefix + "in_proj_b.weight"] = b.reshape(-1, hidden)
        tensors[prefix + "in_proj_a.weight"] = a.reshape(-1, hidden)


def map_weights(tensors: dict[str, torch.Tensor], config: HybridConfig) -> None:
    split_qwen3_next_projections(tensors, config)
    stack_experts(tensors, config)


FAMILIES = (
    Family(
        model_types=("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", *WRAPPERS),
        mixer="gated_deltanet",
        read_config=read_qwen,
        layer=QwenLayer,
        norm=RMSNorm,
        linear_sizes=DELTA_SIZES,
        validate=validate,
        map_weights=map_weights,
    ),
)
