"""Nemotron-H (NVIDIA Nemotron-H, Nemotron Nano 2, Nemotron 3 Nano): every layer is a norm, ONE mixer and a
residual, the mixer being Mamba2 (``M``), attention without position encoding (``*``), a ReLU² MLP (``-``)
or a mixture of ReLU² experts with sigmoid, group-limited routing and a shared expert (``E``).

Module names follow transformers' ``NemotronHForCausalLM`` (``backbone.embeddings``,
``backbone.layers.N.norm``, ``backbone.layers.N.mixer``, ``backbone.norm_f``), so checkpoints load as they
are, but for the experts, stored one module each.
"""

from __future__ import annotations

import re
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import Attention
from ..config import FULL, LINEAR, MLP, MOE, HybridConfig
from ..context import Forward
from ..family import Family
from ..layers import GroupRouter, PlainRMSNorm
from ..linear import Linear
from ..mixers.mamba2 import Mamba2Mixer
from ..weight_names import expert_groups
from .reading import MAMBA2_SIZES, check_act, check_mamba2, common_fields, layer_names, merge, time_step_limit

# ``hybrid_override_pattern``: one character per layer.
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
    "time_step_limit": [0.0, float("inf")],
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
    "mamba_dt_limit": "time_step_limit",
}


def read_nemotron_h(cls: type[HybridConfig], data: dict[str, Any]) -> HybridConfig:
    """Nemotron-H: Mamba2, attention without RoPE, ReLU² MLP and MoE layers, from ``hybrid_override_pattern``
    (``M*-E``) or ``layers_block_type`` / ``layer_types``."""
    d = merge(NEMOTRON_H, data, NEMOTRON_ALIASES)
    types = d.get("layers_block_type") or d.get("layer_types")
    if types is None:
        pattern = d.get("hybrid_override_pattern")
        if not isinstance(pattern, str) or not pattern:
            raise ValueError("a nemotron_h config needs layers_block_type or hybrid_override_pattern")
        bad = sorted(set(pattern) - set(NEMOTRON_PATTERN))
        if bad:
            raise ValueError(f"hybrid_override_pattern has unknown layer codes {bad}; expected M, *, - or E")
        types = [NEMOTRON_PATTERN[ch] for ch in pattern]
    types = layer_names(types, {LINEAR, FULL, MLP, MOE})
    check_act(d, "mlp_hidden_act", "relu2")
    check_act(d, "mamba_hidden_act", "silu")
    if d.get("sliding_window"):
        raise ValueError("nemotron_h with sliding_window attention is not supported")
    return cls(
        **common_fields(
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
        # transformers 5.25 clamps dt to time_step_limit, as the reference implementation does (5.24: to
        # time_step_min and up); time_step_min only bounds dt_bias's initialisation
        time_step_limit=time_step_limit(d),
        mlp_bias=bool(d["mlp_bias"]),
        moe_latent_size=int(d["moe_latent_size"]) if d.get("moe_latent_size") else None,
        moe_n_group=int(d["n_group"]),
        moe_topk_group=int(d["topk_group"]),
        routed_scaling_factor=float(d["routed_scaling_factor"]),
    )


def validate(config: HybridConfig) -> None:
    check_mamba2(config, feed_forward=MLP in config.layer_types)


def relu2(x: torch.Tensor) -> torch.Tensor:
    return F.relu(x).square()


class Relu2MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, bias: bool) -> None:
        super().__init__()
        self.up_proj = Linear(hidden, intermediate, bias=bias)
        self.down_proj = Linear(intermediate, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(relu2(self.up_proj(x)))


class Relu2Experts(nn.Module):
    """Routed experts as two stacked tensors: ``up_proj [E, I, D]`` and ``down_proj [E, D, I]``."""

    def __init__(self, config: HybridConfig, dim: int) -> None:
        super().__init__()
        e, i = config.num_experts, config.moe_intermediate_size
        self.up_proj = nn.Parameter(torch.empty(e, i, dim))
        self.down_proj = nn.Parameter(torch.empty(e, dim, i))

    def forward(self, x: torch.Tensor, weights: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(x, dtype=weights.dtype)
        for e in idx.unique().tolist():
            token, slot = torch.where(idx == e)
            y = F.linear(relu2(F.linear(x[token], self.up_proj[e])), self.down_proj[e])
            out.index_add_(0, token, (y * weights[token, slot, None]).to(out.dtype))
        return out.to(x.dtype)


class Relu2MoE(nn.Module):
    def __init__(self, config: HybridConfig) -> None:
        super().__init__()
        latent = config.moe_latent_size
        self.gate = GroupRouter(config)
        self.experts = Relu2Experts(config, latent or config.hidden_size)
        self.shared_experts = Relu2MLP(config.hidden_size, config.shared_expert_intermediate_size, config.mlp_bias)
        if latent:
            self.fc1_latent_proj = Linear(config.hidden_size, latent, bias=config.mlp_bias)
            self.fc2_latent_proj = Linear(latent, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights, idx = self.gate(flat)
        routed = flat if not hasattr(self, "fc1_latent_proj") else self.fc1_latent_proj(flat)
        routed = self.experts(routed, weights, idx)
        if hasattr(self, "fc2_latent_proj"):
            routed = self.fc2_latent_proj(routed)
        return routed.reshape(x.shape) + self.shared_experts(x)


class NemotronBlock(nn.Module):
    def __init__(self, config: HybridConfig, idx: int) -> None:
        super().__init__()
        self.kind = config.layer_types[idx]
        self.is_linear = self.kind == LINEAR
        self.norm = PlainRMSNorm(config.hidden_size, config.rms_norm_eps)
        if self.kind == LINEAR:
            self.mixer: nn.Module = Mamba2Mixer(config, idx)
        elif self.kind == FULL:
            self.mixer = Attention(config, idx)
        elif self.kind == MLP:
            self.mixer = Relu2MLP(config.hidden_size, config.intermediate_size, config.mlp_bias)
        elif self.kind == MOE:
            self.mixer = Relu2MoE(config)
        else:
            raise ValueError(f"unknown nemotron_h layer type {self.kind!r}")

    @property
    def linear_mixer(self) -> nn.Module:
        return self.mixer

    def forward(self, x: torch.Tensor, ctx: Forward) -> torch.Tensor:
        h = self.norm(x)
        if self.kind == LINEAR:
            h = self.mixer(h, ctx)
        elif self.kind == FULL:
            h = self.mixer(h, ctx)
        else:
            h = self.mixer(h)
        return x + h


_EXPERT = re.compile(r"^(backbone\.layers\.\d+\.mixer\.experts)\.(\d+)\.(up_proj|down_proj)\.weight$")


def map_weights(tensors: dict[str, torch.Tensor], config: HybridConfig) -> None:
    """Its (ungated, ReLU²) experts' ``up_proj``/``down_proj`` are stored one module each."""
    for prefix, experts in expert_groups(tensors, config, _EXPERT, ("up_proj", "down_proj")).items():
        for proj in ("up_proj", "down_proj"):
            tensors[f"{prefix}.{proj}"] = torch.stack([x[proj] for x in experts])


FAMILIES = (
    Family(
        model_types=("nemotron_h",),
        mixer="mamba2",
        read_config=read_nemotron_h,
        layer=NemotronBlock,
        root="backbone",
        embeddings="embeddings",
        final_norm="norm_f",
        linear_sizes=MAMBA2_SIZES,
        validate=validate,
        map_weights=map_weights,
        fp32_params=("e_score_correction_bias", "gate.weight"),
    ),
)
