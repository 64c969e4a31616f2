"""The decoder layer most hybrids share: ``x + m * mixer(norm_in(x))``, then ``x + m * ffn(norm_ffn(x))``
(``m``, Granite's residual multiplier, is 1 elsewhere), the mixer a linear one or attention.

Each family names the parts as its checkpoints do (Qwen's ``linear_attn``/``self_attn`` and ``mlp``, LFM2's
``conv``/``operator_norm``/``feed_forward``, Ring-linear's ``attention``, ...): the names are given, the
modules registered under them, so weights load by name and the layer's logic is written once. Every mixer,
linear or attention, takes ``(x, ctx)``: the hidden states and the pass's ``context.Forward``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .config import LINEAR, HybridConfig
from .context import Forward
from .layers import Experts, GroupRouter, MoE, PlainRMSNorm, SwiGLU


class PreNormLayer(nn.Module):
    def __init__(
        self,
        is_linear: bool,
        mixer: tuple[str, nn.Module],
        ffn: tuple[str, nn.Module] | None,
        norm_in: tuple[str, nn.Module],
        norm_ffn: tuple[str, nn.Module],
        residual_multiplier: float = 1.0,
    ) -> None:
        super().__init__()
        self.is_linear = is_linear
        self.residual_multiplier = residual_multiplier
        self._parts = (mixer[0], ffn[0] if ffn else "", norm_in[0], norm_ffn[0])
        for name, module in (mixer, ffn or ("", None), norm_in, norm_ffn):
            if module is not None:
                self.add_module(name, module)

    @property
    def linear_mixer(self) -> nn.Module:
        """The token mixer of a linear layer (``is_linear``)."""
        return getattr(self, self._parts[0])

    def ffn(self, x: torch.Tensor) -> torch.Tensor:
        """The named feed-forward; a family whose feed-forward is several modules overrides this."""
        return getattr(self, self._parts[1])(x)

    def forward(self, x: torch.Tensor, ctx: Forward) -> torch.Tensor:
        mixer, _, norm_in, norm_ffn = self._parts
        h = getattr(self, mixer)(getattr(self, norm_in)(x), ctx)
        m = self.residual_multiplier
        x = x + h * m if m != 1.0 else x + h
        out = self.ffn(getattr(self, norm_ffn)(x))
        return x + out * m if m != 1.0 else x + out


class GroupRoutedLayer(PreNormLayer):
    """Kimi Linear's, Ling 3.0's and Ring-linear's layer: its mixer (``linear`` or ``attention``, built for the
    layer, under ``mixer_name``), then a dense SwiGLU in ``mlp_only_layers`` and, after, experts chosen by a
    ``GroupRouter`` plus a shared SwiGLU expert."""

    def __init__(
        self,
        config: HybridConfig,
        idx: int,
        mixer_name: str,
        linear: Callable[[HybridConfig, int], nn.Module],
        attention: Callable[[HybridConfig, int], nn.Module],
    ) -> None:
        is_linear = config.layer_types[idx] == LINEAR
        dense = idx in config.mlp_only_layers
        super().__init__(
            is_linear,
            (mixer_name, linear(config, idx) if is_linear else attention(config, idx)),
            ("mlp", SwiGLU(config.hidden_size, config.intermediate_size) if dense else _group_routed_moe(config)),
            ("input_layernorm", PlainRMSNorm(config.hidden_size, config.rms_norm_eps)),
            ("post_attention_layernorm", PlainRMSNorm(config.hidden_size, config.rms_norm_eps)),
        )


def _group_routed_moe(config: HybridConfig) -> MoE:
    shared = SwiGLU(config.hidden_size, config.shared_expert_intermediate_size)
    return MoE(GroupRouter(config), Experts(config), shared=("shared_experts", shared))
