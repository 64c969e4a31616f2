"""The norms, the feed-forward and the mixture of experts that families compose their layers from."""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from .config import HybridConfig
from .linear import Linear


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


# SwiGLU projection names: transformers' usual ones, LFM2's, and Granite's fused gate-and-up.
GATE_UP_DOWN = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}
W1_W2_W3 = {"gate": "w1", "down": "w2", "up": "w3"}
FUSED_GATE_UP = {"gate_up": "input_linear", "down": "output_linear"}


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))``, every family's gated feed-forward. ``names`` maps the roles ``gate``,
    ``up`` and ``down`` (or ``gate_up``, one fused projection with the gate's rows first, and ``down``) to the
    names the family's checkpoints give them; they are registered in that order, so weights load by name and
    a random initialisation draws them in the order it always has."""

    def __init__(self, hidden: int, size: int, bias: bool = False, names: Mapping[str, str] = GATE_UP_DOWN) -> None:
        super().__init__()
        if set(names) not in ({"gate", "up", "down"}, {"gate_up", "down"}):
            raise ValueError(f"SwiGLU names must map gate, up, down (or gate_up, down), got {sorted(names)}")
        self.fused = "gate_up" in names
        self.names = dict(names)
        for role, name in names.items():
            rows = 2 * size if role == "gate_up" else size
            shape = (size, hidden) if role == "down" else (hidden, rows)
            self.add_module(name, Linear(*shape, bias=bias))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            gate, up = getattr(self, self.names["gate_up"])(x).chunk(2, dim=-1)
        else:
            gate, up = getattr(self, self.names["gate"])(x), getattr(self, self.names["up"])(x)
        return getattr(self, self.names["down"])(F.silu(gate) * up)


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


class TopKSoftmaxRouter(nn.Module):
    """The top-k router logits, softmaxed among themselves (Granite's)."""

    def __init__(self, config: HybridConfig) -> None:
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.weight = nn.Parameter(torch.zeros(config.num_experts, config.hidden_size))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = F.linear(x, self.weight).float()
        top, idx = torch.topk(logits, self.top_k, dim=-1)
        return torch.softmax(top, dim=-1).to(x.dtype), idx


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


class MoE(nn.Module):
    """Routed experts plus, optionally, a shared expert, each part under the name the family's checkpoints
    give it: the router as ``gate`` (Qwen, MiniMax, Kimi Linear, Ring-linear) or ``router`` (Jamba,
    Granite); the shared expert as ``shared=(name, module)``, with ``shared_gate`` a sigmoid gate on it
    (Qwen's ``shared_expert`` behind ``shared_expert_gate``) or none (``shared_experts``)."""

    def __init__(
        self,
        router: nn.Module,
        experts: nn.Module,
        router_name: str = "gate",
        shared: tuple[str, nn.Module] | None = None,
        shared_gate: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.router_name = router_name
        self.add_module(router_name, router)
        self.experts = experts
        self.shared_name = shared[0] if shared is not None else None
        if shared is not None:
            self.add_module(*shared)
        if shared_gate is not None:
            self.shared_expert_gate = shared_gate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights, idx = getattr(self, self.router_name)(flat)
        out = self.experts(flat, weights.to(flat.dtype), idx)
        if self.shared_name is not None:
            shared = getattr(self, self.shared_name)(flat)
            if hasattr(self, "shared_expert_gate"):
                shared = torch.sigmoid(self.shared_expert_gate(flat)) * shared
            out = out + shared
        return out.reshape(x.shape)


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
