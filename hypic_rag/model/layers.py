"""Norms and MLPs shared by every layer of the hybrid."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import HybridConfig


class RMSNorm(nn.Module):
    """Zero-centred RMSNorm: the weight is stored as ``w`` and applied as ``1 + w``, in fp32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * (1.0 + self.weight.float())).type_as(x)


class PlainRMSNorm(nn.Module):
    """RMSNorm with the weight applied as stored (not ``1 + w``), in fp32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * xf).to(x.dtype)


class GatedRMSNorm(nn.Module):
    """``norm(x) * w * silu(z)`` after the Gated DeltaNet read-out; the weight is applied as is."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        out = self.weight * xf.to(dtype)
        return (out * F.silu(gate.float())).to(dtype)


class MLP(nn.Module):
    """SwiGLU feed-forward."""

    def __init__(self, hidden: int, intermediate: int, bias: bool = False) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.up_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Router(nn.Module):
    def __init__(self, config: HybridConfig) -> None:
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.norm_topk_prob = config.norm_topk_prob
        self.weight = nn.Parameter(torch.zeros(config.num_experts, config.hidden_size))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = F.linear(x, self.weight)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)
        top, idx = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            top = top / top.sum(dim=-1, keepdim=True)
        return top.to(logits.dtype), idx


class Experts(nn.Module):
    """All routed experts as two stacked tensors: ``gate_up_proj [E, 2I, H]`` and ``down_proj [E, H, I]``."""

    def __init__(self, config: HybridConfig) -> None:
        super().__init__()
        e, h, i = config.num_experts, config.hidden_size, config.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * i, h))
        self.down_proj = nn.Parameter(torch.empty(e, h, i))

    def forward(self, x: torch.Tensor, weights: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(x)
        for e in idx.unique().tolist():
            token, slot = torch.where(idx == e)
            gate, up = F.linear(x[token], self.gate_up_proj[e]).chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, self.down_proj[e]) * weights[token, slot, None]
            out.index_add_(0, token, y.to(out.dtype))
        return out


class SparseMoE(nn.Module):
    """Top-k routed experts plus a sigmoid-gated shared expert."""

    def __init__(self, config: HybridConfig) -> None:
        super().__init__()
        self.gate = Router(config)
        self.experts = Experts(config)
        self.shared_expert = MLP(config.hidden_size, config.shared_expert_intermediate_size)
        self.shared_expert_gate = nn.Linear(config.hidden_size, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        weights, idx = self.gate(flat)
        routed = self.experts(flat, weights, idx)
        shared = torch.sigmoid(self.shared_expert_gate(flat)) * self.shared_expert(flat)
        return (routed + shared).reshape(shape)


class GroupRouter(nn.Module):
    """Sigmoid scores; experts chosen with a score-correction bias among the ``topk_group`` groups whose two
    best corrected scores sum highest; weights are the uncorrected scores, renormalised and scaled."""

    def __init__(self, config: HybridConfig) -> None:
        super().__init__()
        e = config.num_experts
        self.top_k, self.groups, self.topk_group = config.num_experts_per_tok, config.moe_n_group, config.moe_topk_group
        self.norm_topk_prob, self.scale = config.norm_topk_prob, config.routed_scaling_factor
        self.weight = nn.Parameter(torch.zeros(e, config.hidden_size))
        self.e_score_correction_bias = nn.Parameter(torch.zeros(e))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = F.linear(x.float(), self.weight.float()).sigmoid()
        choice = scores + self.e_score_correction_bias.float()
        n, e = choice.shape
        grouped = choice.view(n, self.groups, e // self.groups)
        best_groups = grouped.topk(min(2, e // self.groups), dim=-1)[0].sum(-1).topk(self.topk_group, dim=-1)[1]
        keep = torch.zeros(n, self.groups, dtype=torch.bool, device=x.device).scatter_(1, best_groups, True)
        choice = choice.masked_fill(~keep.repeat_interleave(e // self.groups, dim=1), float("-inf"))
        idx = choice.topk(self.top_k, dim=-1)[1]
        weights = scores.gather(1, idx)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return weights * self.scale, idx


class GroupRoutedMoE(nn.Module):
    """Gated experts chosen by ``GroupRouter``, plus a shared SwiGLU expert (Kimi Linear, Ring-linear-2.0)."""

    def __init__(self, config: HybridConfig) -> None:
        super().__init__()
        self.gate = GroupRouter(config)
        self.experts = Experts(config)
        self.shared_experts = MLP(config.hidden_size, config.shared_expert_intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights, idx = self.gate(flat)
        return self.experts(flat, weights.to(x.dtype), idx).reshape(x.shape) + self.shared_experts(x)
