"""OLMo hybrid (``olmo_hybrid``): Gated DeltaNet layers, pre-norm, and attention layers, post-norm.

The Gated DeltaNet mixer is Qwen3.5's (``mixers.deltanet``: ``map_weights`` fuses OLMo's separate
``q/k/v/g/a/b_proj`` into its layout) with beta doubled (``linear_allow_neg_eigval``) and its read-out norm's
own eps. Attention layers have no input norm: ``x + norm(attn(x))``, then ``x + norm(mlp(x))``; their q/k
RMSNorm spans the whole projection, before the heads are split.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..attention import Attention
from ..config import FULL, LINEAR, HybridConfig
from ..context import Forward
from ..family import Family
from ..layers import PlainRMSNorm, SwiGLU
from ..mixers.deltanet import GatedDeltaNet
from .reading import DELTA_SIZES, check_act, check_rotary, common_fields, layer_names, merge, rope_fields

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
    d = merge(OLMO_HYBRID, data)
    n, h = int(d["num_hidden_layers"]), int(d["hidden_size"])
    heads = int(d["num_attention_heads"])
    types = d.get("layer_types")
    if types is None:
        types = [FULL if i % 4 == 3 else LINEAR for i in range(n)]
        if FULL not in types:
            types[-1] = FULL
    types = layer_names(types, {LINEAR, FULL})
    check_act(d, "hidden_act", "silu")
    rope = dict(d.get("rope_parameters") or {})
    nope = any("rope_theta" in where and where["rope_theta"] is None for where in (rope, data))
    theta = 10000.0 if nope else rope_fields(d)[0]
    k_heads = int(d.get("linear_num_key_heads") or heads)
    v_heads = int(d.get("linear_num_value_heads") or heads)
    dk = int(d.get("linear_key_head_dim") or int(0.75 * h / k_heads))
    return cls(
        **common_fields(
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


def validate(config: HybridConfig) -> None:
    if config.linear_num_value_heads % config.linear_num_key_heads:
        raise ValueError("linear_num_value_heads must be a multiple of linear_num_key_heads")
    check_rotary(config)  # it may run NoPE
    if config.intermediate_size <= 0:
        dense = list(range(config.num_hidden_layers))
        raise ValueError(f"layers {dense} are dense but intermediate_size is {config.intermediate_size}")


class OlmoHybridLayer(nn.Module):
    def __init__(self, config: HybridConfig, idx: int) -> None:
        super().__init__()
        self.is_linear = config.layer_types[idx] == LINEAR
        eps = config.rms_norm_eps
        if self.is_linear:
            self.linear_attn = GatedDeltaNet(config, idx)
            self.input_layernorm = PlainRMSNorm(config.hidden_size, eps)
        else:
            self.self_attn = Attention(config, idx, qk_norm=("q_norm", "k_norm"), norm_whole_projection=True)
            self.post_feedforward_layernorm = PlainRMSNorm(config.hidden_size, eps)
        self.post_attention_layernorm = PlainRMSNorm(config.hidden_size, eps)
        self.mlp = SwiGLU(config.hidden_size, config.intermediate_size)

    @property
    def linear_mixer(self) -> nn.Module:
        return self.linear_attn

    def forward(self, x: torch.Tensor, ctx: Forward) -> torch.Tensor:
        if self.is_linear:
            x = x + self.linear_attn(self.input_layernorm(x), ctx)
            return x + self.mlp(self.post_attention_layernorm(x))
        x = x + self.post_attention_layernorm(self.self_attn(x, ctx))
        return x + self.post_feedforward_layernorm(self.mlp(x))


# OLMo hybrid's Gated DeltaNet projections, as this runtime's fused layout takes them.
_OLMO_LINEAR = (("g_proj", "in_proj_z"), ("b_proj", "in_proj_b"), ("a_proj", "in_proj_a"), ("o_proj", "out_proj"),
                ("o_norm", "norm"))  # fmt: skip


def map_weights(tensors: dict[str, torch.Tensor], config: HybridConfig) -> None:
    """OLMo hybrid keeps q, k, v (and their convs) apart and names its norms as OLMo-core does."""
    for name in list(tensors):
        new = name.replace("attention_layer_norm", "input_layernorm").replace(
            "feedforward_layer_norm", "post_attention_layernorm"
        )
        if new != name:
            tensors[new] = tensors.pop(name)
    for name in [n for n in tensors if n.endswith(".linear_attn.q_proj.weight")]:
        prefix = name[: -len("q_proj.weight")]
        fusions = ((("q_proj", "k_proj", "v_proj"), "in_proj_qkv"), (("q_conv1d", "k_conv1d", "v_conv1d"), "conv1d"))
        for parts, fused in fusions:
            found = [tensors.pop(f"{prefix}{p}.weight", None) for p in parts]
            if all(f is not None for f in found):
                tensors[f"{prefix}{fused}.weight"] = torch.cat(found)
            elif any(f is not None for f in found):
                raise ValueError(f"{prefix}: {', '.join(parts)} must all be present")
        for old, new in _OLMO_LINEAR:
            if f"{prefix}{old}.weight" in tensors:
                tensors[f"{prefix}{new}.weight"] = tensors.pop(f"{prefix}{old}.weight")


FAMILIES = (
    Family(
        model_types=("olmo_hybrid",),
        mixer="gated_deltanet",
        read_config=read_olmo_hybrid,
        layer=OlmoHybridLayer,
        linear_sizes=DELTA_SIZES,
        validate=validate,
        map_weights=map_weights,
    ),
)
