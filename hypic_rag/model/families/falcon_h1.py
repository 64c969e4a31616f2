"""Falcon-H1: attention and Mamba2 side by side on the same normed input in every layer, their outputs summed
into the residual, then a SwiGLU; μP multipliers throughout.

The multipliers on projections are folded into their weights when loading (``fold_multipliers``), so its
layers are plain; the embedding's and the LM head's stay in the config. Module names follow transformers'
``FalconH1ForCausalLM``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..attention import Attention
from ..config import HYBRID, HybridConfig
from ..context import Forward
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

FALCON_H1: dict[str, Any] = {
    **MAMBA2_DEFAULTS,
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
    projections are folded into their weights when loading (``fold_multipliers``); the embedding's and the LM
    head's stay here."""
    d = merge(FALCON_H1, data)
    if "mamba_d_ssm" in data and data["mamba_d_ssm"] is None:
        d["mamba_d_ssm"] = int(d["mamba_expand"]) * int(d["hidden_size"])
    heads = int(d["num_attention_heads"])
    mamba = mamba2_fields({**d, "mamba_expand": int(d["mamba_d_ssm"]) // int(d["hidden_size"]) or 1})
    if d["mamba_d_head"] == "auto":
        mamba["mamba_head_dim"] = int(d["mamba_d_ssm"]) // int(d["mamba_n_heads"])
    if mamba["mamba_head_dim"] * mamba["mamba_num_heads"] != int(d["mamba_d_ssm"]):
        raise ValueError(
            f"mamba_n_heads x mamba_d_head = {mamba['mamba_num_heads']} x {mamba['mamba_head_dim']} "
            f"must equal mamba_d_ssm = {d['mamba_d_ssm']}"
        )
    check_act(d, "hidden_act", "silu")
    theta, _ = rope_fields(d)
    lm_head = float(d["lm_head_multiplier"])
    if lm_head == 0:
        raise ValueError("lm_head_multiplier must not be 0")
    norm = "norm_then_gate" if d["mamba_norm_before_gate"] else "gate_then_norm"
    norm = norm if d["mamba_rms_norm"] else "none"
    n = int(d["num_hidden_layers"])
    return cls(
        **common_fields(
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


class FalconH1Layer(nn.Module):
    """Attention and Mamba2 side by side on the same normed input, their outputs summed into the residual,
    then a SwiGLU. μP multipliers are folded into the projections' weights (``fold_multipliers``)."""

    def __init__(self, config: HybridConfig, idx: int) -> None:
        super().__init__()
        self.is_linear = True  # its Mamba2 state is carried; its attention keeps KV as any attention layer
        self.input_layernorm = PlainRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.pre_ff_layernorm = PlainRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mamba = Mamba2Mixer(config, idx)
        self.self_attn = Attention(config, idx)
        self.feed_forward = SwiGLU(config.hidden_size, config.intermediate_size, config.mlp_bias)

    @property
    def linear_mixer(self) -> nn.Module:
        return self.mamba

    def forward(self, x: torch.Tensor, ctx: Forward) -> torch.Tensor:
        h = self.input_layernorm(x)
        x = x + self.mamba(h, ctx) + self.self_attn(h, ctx)
        return x + self.feed_forward(self.pre_ff_layernorm(x))


def fold_multipliers(tensors: dict[str, torch.Tensor], config: HybridConfig) -> None:
    """Falcon-H1's μP multipliers, folded into the weights they scale, so its layers are plain: the Mamba input
    (``ssm_in``, weights only) and each block of its projection's rows (``ssm_multipliers``: z, x, B, C, dt),
    its output (``ssm_out``), the attention input (``attention_in``, weights only), keys (``key``), output
    (``attention_out``), and the MLP's gate and down projections (``mlp_multipliers``). Exact up to rounding."""
    raw = config.raw
    ssm = [float(m) for m in raw.get("ssm_multipliers") or [1.0] * 5]
    mlp = [float(m) for m in raw.get("mlp_multipliers") or [1.0, 1.0]]
    ssm_in, ssm_out = float(raw.get("ssm_in_multiplier", 1.0)), float(raw.get("ssm_out_multiplier", 1.0))
    att_in, att_out = float(raw.get("attention_in_multiplier", 1.0)), float(raw.get("attention_out_multiplier", 1.0))
    key = float(raw.get("key_multiplier", 1.0))
    if len(ssm) != 5 or len(mlp) != 2:
        raise ValueError("ssm_multipliers must hold 5 numbers and mlp_multipliers 2")
    inner, gn = config.mamba_intermediate, config.mamba_n_groups * config.ssm_state_size
    blocks = (inner, inner, gn, gn, config.mamba_num_heads)
    rows = torch.cat([torch.full((n,), m) for n, m in zip(blocks, ssm, strict=True)])
    scale = {  # suffix: (factor on the weight, factor on the bias), per output row where a tensor
        "mamba.in_proj": (rows[:, None] * ssm_in, rows),
        "mamba.out_proj": (ssm_out, ssm_out),
        "self_attn.q_proj": (att_in, 1.0),
        "self_attn.k_proj": (att_in * key, key),
        "self_attn.v_proj": (att_in, 1.0),
        "self_attn.o_proj": (att_out, att_out),
        "feed_forward.gate_proj": (mlp[0], mlp[0]),
        "feed_forward.down_proj": (mlp[1], mlp[1]),
    }
    for name in list(tensors):
        for suffix, (on_weight, on_bias) in scale.items():
            for kind, factor in (("weight", on_weight), ("bias", on_bias)):
                if name.endswith(f".{suffix}.{kind}"):
                    t = tensors[name]
                    tensors[name] = (t.float() * factor).to(t.dtype)


FAMILIES = (
    Family(
        model_types=("falcon_h1",),
        mixer="mamba2",
        read_config=read_falcon_h1,
        layer=FalconH1Layer,
        final_norm="final_layernorm",
        linear_sizes=MAMBA2_SIZES,
        validate=check_mamba2,
        map_weights=fold_multipliers,
    ),
)
