"""A request's per-layer state, carried from one forward to the next.

Linear layers keep the conv tail (the last ``kernel - 1`` pre-conv inputs) and the fp32 recurrent
state; attention layers keep K (after RoPE) and V with the absolute position of every key, so that
keys assembled from elsewhere can sit at any position. Only this class writes its layers and its
length: the model through ``set_linear``, ``append_kv`` and ``advance``, the engine's parts through
``restore`` (a cached prefix) and ``extend`` (a cached segment placed after what is there).

``TransitionCapture`` is the forward's explicit request, for an isolated zero-start prefill, to
record each linear layer's segment operators (HYPIC.md §3-§4).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from hypic_rag.kernels.algebra import SplitTransition

from .config import LINEAR, HybridConfig


@dataclass
class LinearLayerState:
    conv: torch.Tensor  # [B, conv_dim, kernel - 1]
    recurrent: torch.Tensor  # [B, H_v, d_k, d_v], fp32


@dataclass
class AttentionLayerKV:
    keys: torch.Tensor  # [B, kv_heads, S, head_dim], rotated at `positions - shift`
    values: torch.Tensor  # [B, kv_heads, S, head_dim]
    positions: torch.Tensor  # [S] int64: where each key sits in the prompt
    shift: torch.Tensor  # [S] int64: the rotation still owed to reach `positions` (0 for fresh keys)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in (self.keys, self.values, self.positions, self.shift))


@dataclass
class TransitionCapture:
    """Passed to a zero-start forward: ``rest_start [B]`` is the column where each row's remainder
    begins (``T`` for none); the forward fills ``operators`` with each linear layer's result (its
    outputs dropped)."""

    rest_start: torch.Tensor
    operators: dict[int, SplitTransition] = field(default_factory=dict)


class RequestState:
    """Per-layer state for incremental prefill and decode; ``seq_len`` counts the tokens it holds."""

    def __init__(self, config: HybridConfig) -> None:
        self.config = config
        self._layers: list[LinearLayerState | AttentionLayerKV | None] = [None] * config.num_hidden_layers
        self._seq_len = 0

    @property
    def seq_len(self) -> int:
        return self._seq_len

    @property
    def linear_layer_ids(self) -> list[int]:
        return [i for i, t in enumerate(self.config.layer_types) if t == LINEAR]

    @property
    def attention_layer_ids(self) -> list[int]:
        return [i for i, t in enumerate(self.config.layer_types) if t != LINEAR]

    def linear(self, idx: int) -> LinearLayerState | None:
        state = self._layers[idx]
        assert state is None or isinstance(state, LinearLayerState)
        return state

    def attention(self, idx: int) -> AttentionLayerKV | None:
        kv = self._layers[idx]
        assert kv is None or isinstance(kv, AttentionLayerKV)
        return kv

    # -- written by the model's layers ------------------------------------------------------------

    def set_linear(self, idx: int, conv: torch.Tensor, recurrent: torch.Tensor) -> None:
        self._layers[idx] = LinearLayerState(conv=conv, recurrent=recurrent)

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
        self._layers[idx] = kv
        return kv

    def advance(self, tokens: int) -> None:
        """Count ``tokens`` that a forward has just written into every layer."""
        self._seq_len += tokens

    # -- written by the engine's parts --------------------------------------------------------------

    def restore(
        self, seq_len: int, linear: Mapping[int, LinearLayerState], kv: Mapping[int, AttentionLayerKV]
    ) -> None:
        """Become the state of a cached prefix of ``seq_len`` tokens (an empty state only)."""
        if self._seq_len or any(layer is not None for layer in self._layers):
            raise ValueError("restore needs an empty request state")
        for i, state in linear.items():
            self.set_linear(i, state.conv.clone(), state.recurrent.clone())
        for i, layer in kv.items():
            self._layers[i] = layer
        self._seq_len = seq_len

    def extend(
        self,
        length: int,
        linear: Mapping[int, tuple[torch.Tensor, torch.Tensor]],
        kv: Mapping[int, tuple[torch.Tensor, torch.Tensor]],
        shift: int,
    ) -> None:
        """Place ``length`` cached tokens after those held: ``linear`` maps each linear layer to its
        (conv tail, recurrent state) after them; ``kv`` each attention layer to their K and V ``[B, H,
        length, D]``, K rotated ``shift`` positions before where the tokens now sit."""
        positions = torch.arange(self._seq_len, self._seq_len + length)
        owed = torch.full((length,), shift)
        for i, (conv, recurrent) in linear.items():
            self.set_linear(i, conv, recurrent)
        for i, (keys, values) in kv.items():
            if keys.shape[2] != length or values.shape[2] != length:
                raise ValueError(f"layer {i}: {keys.shape[2]} keys for {length} tokens")
            self.append_kv(i, keys, values, positions.to(keys.device), owed.to(keys.device))
        self._seq_len += length
