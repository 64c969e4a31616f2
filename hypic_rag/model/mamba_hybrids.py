"""The decoder layers of the Mamba2 + attention hybrids whose layers end in a feed-forward: Granite-4.0-H
(``granitemoehybrid``: a shared SwiGLU MLP plus an optional MoE, and multipliers on the embedding, the
residuals and the logits) and Bamba (a SwiGLU MLP). Module names follow transformers' classes
(``model.layers.N.mamba`` / ``.self_attn``, ``shared_mlp``, ``block_sparse_moe``, ``feed_forward``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .attention import PlainAttention
from .block import PreNormLayer
from .config import LINEAR, HybridConfig
from .layers import MLP, Experts, PlainRMSNorm
from .mamba2 import Mamba2Mixer
from .state import RequestState, SegmentJumps, TransitionCapture


class SharedMLP(nn.Module):
    """Granite's SwiGLU with one fused input projection, gate first: ``input_linear [2S, H]``."""

    def __init__(self, hidden: int, size: int) -> None:
        super().__init__()
        self.input_linear = nn.Linear(hidden, 2 * size, bias=False)
        self.output_linear = nn.Linear(size, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.input_linear(x).chunk(2, dim=-1)
        return self.output_linear(F.silu(gate) * up)


class TopKSoftmaxRouter(nn.Module):
    """The top-k router logits, softmaxed among themselves."""

    def __init__(self, config: HybridConfig) -> None:
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.weight = nn.Parameter(torch.zeros(config.num_experts, config.hidden_size))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = F.linear(x, self.weight).float()
        top, idx = torch.topk(logits, self.top_k, dim=-1)
        return torch.softmax(top, dim=-1).to(x.dtype), idx


class GraniteMoE(nn.Module):
    def __init__(self, config: HybridConfig) -> None:
        super().__init__()
        self.router = TopKSoftmaxRouter(config)
        self.experts = Experts(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights, idx = self.router(flat)
        return self.experts(flat, weights, idx).reshape(x.shape)


def _mixer(config: HybridConfig, idx: int) -> tuple[str, nn.Module]:
    if config.layer_types[idx] == LINEAR:
        return "mamba", Mamba2Mixer(config, idx)
    return "self_attn", PlainAttention(config, idx)


class GraniteLayer(PreNormLayer):
    """Its feed-forward is a shared SwiGLU plus, with experts, a MoE; both residuals scaled."""

    def __init__(self, config: HybridConfig, idx: int) -> None:
        eps = config.rms_norm_eps
        super().__init__(
            config.layer_types[idx] == LINEAR,
            _mixer(config, idx),
            None,
            ("input_layernorm", PlainRMSNorm(config.hidden_size, eps)),
            ("post_attention_layernorm", PlainRMSNorm(config.hidden_size, eps)),
            residual_multiplier=config.residual_multiplier,
        )
        self.shared_mlp = SharedMLP(config.hidden_size, config.shared_expert_intermediate_size)
        if config.num_experts:
            self.block_sparse_moe = GraniteMoE(config)

    def ffn(self, x: torch.Tensor) -> torch.Tensor:
        out = self.shared_mlp(x)
        return out + self.block_sparse_moe(x) if hasattr(self, "block_sparse_moe") else out


class BambaLayer(PreNormLayer):
    def __init__(self, config: HybridConfig, idx: int) -> None:
        eps = config.rms_norm_eps
        super().__init__(
            config.layer_types[idx] == LINEAR,
            _mixer(config, idx),
            ("feed_forward", MLP(config.hidden_size, config.intermediate_size)),
            ("input_layernorm", PlainRMSNorm(config.hidden_size, eps)),
            ("pre_ff_layernorm", PlainRMSNorm(config.hidden_size, eps)),
        )


class MambaHybridBackbone(nn.Module):
    """``embed_tokens``, the layers and the final norm (``norm``, or Bamba's ``final_layernorm``)."""

    def __init__(self, config: HybridConfig) -> None:
        super().__init__()
        granite = config.model_type == "granitemoehybrid"
        layer = GraniteLayer if granite else BambaLayer
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(layer(config, i) for i in range(config.num_hidden_layers))
        self.final_norm_name = "norm" if granite else "final_layernorm"
        setattr(self, self.final_norm_name, PlainRMSNorm(config.hidden_size, config.rms_norm_eps))

    @property
    def final_norm(self) -> nn.Module:
        return getattr(self, self.final_norm_name)


class FalconH1Layer(nn.Module):
    """Attention and Mamba2 side by side on the same normed input, their outputs summed into the residual,
    then a SwiGLU. μP multipliers are folded into the projections' weights at load time (``loading``)."""

    def __init__(self, config: HybridConfig, idx: int) -> None:
        super().__init__()
        self.is_linear = True  # its Mamba2 state is carried; its attention keeps KV as any attention layer
        self.input_layernorm = PlainRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.pre_ff_layernorm = PlainRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mamba = Mamba2Mixer(config, idx)
        self.self_attn = PlainAttention(config, idx)
        self.feed_forward = MLP(config.hidden_size, config.intermediate_size, config.mlp_bias)

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
        h = self.input_layernorm(x)
        x = x + self.mamba(h, state, pad_mask, capture, jumps) + self.self_attn(h, positions, rope, state, pad_mask)
        return x + self.feed_forward(self.pre_ff_layernorm(x))


class FalconH1Backbone(nn.Module):
    def __init__(self, config: HybridConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(FalconH1Layer(config, i) for i in range(config.num_hidden_layers))
        self.final_layernorm = PlainRMSNorm(config.hidden_size, config.rms_norm_eps)
