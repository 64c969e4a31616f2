"""Nemotron-H's layers (NVIDIA Nemotron-H, Nemotron Nano 2, Nemotron 3 Nano): every layer is a norm, ONE
mixer and a residual, the mixer being Mamba2 (``M``), attention without position encoding (``*``), a ReLU²
MLP (``-``) or a mixture of ReLU² experts with sigmoid, group-limited routing and a shared expert (``E``).

Module names follow transformers' ``NemotronHForCausalLM`` (``backbone.embeddings``,
``backbone.layers.N.norm``, ``backbone.layers.N.mixer``, ``backbone.norm_f``), so checkpoints load as they
are.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .attention import PlainAttention
from .config import FULL, LINEAR, MLP, MOE, HybridConfig
from .layers import GroupRouter, PlainRMSNorm
from .mamba2 import Mamba2Mixer
from .state import RequestState, SegmentJumps, TransitionCapture


def relu2(x: torch.Tensor) -> torch.Tensor:
    return F.relu(x).square()


class Relu2MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, bias: bool) -> None:
        super().__init__()
        self.up_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)

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
            self.fc1_latent_proj = nn.Linear(config.hidden_size, latent, bias=config.mlp_bias)
            self.fc2_latent_proj = nn.Linear(latent, config.hidden_size, bias=config.mlp_bias)

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
            self.mixer = PlainAttention(config, idx)
        elif self.kind == MLP:
            self.mixer = Relu2MLP(config.hidden_size, config.intermediate_size, config.mlp_bias)
        elif self.kind == MOE:
            self.mixer = Relu2MoE(config)
        else:
            raise ValueError(f"unknown nemotron_h layer type {self.kind!r}")

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        state: RequestState | None,
        pad_mask: torch.Tensor | None = None,
        capture: TransitionCapture | None = None,
        jumps: SegmentJumps | None = None,
    ) -> torch.Tensor:
        h = self.norm(x)
        if self.kind == LINEAR:
            h = self.mixer(h, state, pad_mask, capture, jumps)
        elif self.kind == FULL:
            h = self.mixer(h, positions, rope, state, pad_mask)
        else:
            h = self.mixer(h)
        return x + h


class NemotronBackbone(nn.Module):
    def __init__(self, config: HybridConfig) -> None:
        super().__init__()
        self.embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(NemotronBlock(config, i) for i in range(config.num_hidden_layers))
        self.norm_f = PlainRMSNorm(config.hidden_size, config.rms_norm_eps)
