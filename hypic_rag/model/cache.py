"""The hybrid cache that carries a prompt's state from one forward to the next.

Linear layers keep the conv tail (the last ``kernel - 1`` pre-conv inputs) and the fp32 recurrent
state; attention layers keep K (after RoPE) and V with the absolute position of every key, so that
keys assembled from elsewhere can sit at any position.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import LINEAR, HybridConfig


@dataclass
class LinearLayerState:
    conv: torch.Tensor  # [B, conv_dim, kernel - 1]
    recurrent: torch.Tensor  # [B, H_v, d_k, d_v], fp32


@dataclass
class Transition:
    """What an isolated segment prefill captures per linear layer (HYPIC.md §3-§4): the transition
    operator ``P [B, H, K, K]`` over the whole segment, and over its remainder after the seam."""

    p: torch.Tensor
    p_rest: torch.Tensor | None = None
    b_rest: torch.Tensor | None = None


@dataclass
class AttentionLayerKV:
    keys: torch.Tensor  # [B, kv_heads, S, head_dim], rotated at `positions - shift`
    values: torch.Tensor  # [B, kv_heads, S, head_dim]
    positions: torch.Tensor  # [S] int64: where each key sits in the prompt
    shift: torch.Tensor  # [S] int64: the rotation still owed to reach `positions` (0 for fresh keys)


class HybridCache:
    """Per-layer state for incremental prefill and decode; ``seq_len`` counts the tokens it holds."""

    def __init__(self, config: HybridConfig) -> None:
        self.config = config
        self.layers: list[LinearLayerState | AttentionLayerKV | None] = [None] * config.num_hidden_layers
        self.seq_len = 0
        # Set by an isolated segment prefill: linear layers then also record their transition
        # operators, and the remainder's: from column ``rest_split`` on when every row splits there,
        # else from the tokens where ``rest_mask`` is True.
        self.capture_transitions = False
        self.rest_split: int | None = None
        self.rest_mask: torch.Tensor | None = None
        self.transitions: dict[int, Transition] = {}

    def linear(self, idx: int) -> LinearLayerState | None:
        state = self.layers[idx]
        assert state is None or isinstance(state, LinearLayerState)
        return state

    def attention(self, idx: int) -> AttentionLayerKV | None:
        kv = self.layers[idx]
        assert kv is None or isinstance(kv, AttentionLayerKV)
        return kv

    def set_linear(self, idx: int, conv: torch.Tensor, recurrent: torch.Tensor) -> None:
        self.layers[idx] = LinearLayerState(conv=conv, recurrent=recurrent)

    def append_kv(
        self,
        idx: int,
        keys: torch.Tensor,
        values: torch.Tensor,
        positions: torch.Tensor,
        shift: torch.Tensor | None = None,
    ) -> AttentionLayerKV:
        """Add keys rotated at ``positions - shift`` (``shift`` None: already at ``positions``)."""
        if shift is None:
            shift = torch.zeros_like(positions)
        old = self.attention(idx)
        if old is not None:
            keys = torch.cat((old.keys, keys), dim=2)
            values = torch.cat((old.values, values), dim=2)
            positions = torch.cat((old.positions, positions))
            shift = torch.cat((old.shift, shift))
        kv = AttentionLayerKV(keys=keys, values=values, positions=positions, shift=shift)
        self.layers[idx] = kv
        return kv

    @property
    def linear_layer_ids(self) -> list[int]:
        return [i for i, t in enumerate(self.config.layer_types) if t == LINEAR]
