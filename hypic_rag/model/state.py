"""A request's per-layer state, carried from one forward to the next.

Linear layers keep the conv tail (the last ``kernel - 1`` pre-conv inputs) and the fp32 recurrent
state; attention layers keep K (after RoPE) and V with the absolute position of every key, so that
keys assembled from elsewhere can sit at any position. Only this class writes its layers and its
length: the model through ``set_linear``, ``append_kv`` and ``advance``, the engine's parts through
``restore`` (a cached prefix) and ``extend`` (a cached segment placed after what is there).

``TransitionCapture`` is the forward's explicit request, for an isolated zero-start prefill, to
record each linear layer's segment operators (docs/design.md §3-§4).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from hypic_rag.kernels.algebra import DeltaTokens, SplitTransition

from .config import FULL, HYBRID, LINEAR, HybridConfig


@dataclass
class LinearLayerState:
    conv: torch.Tensor  # [B, conv_dim, kernel - 1]
    recurrent: torch.Tensor  # [B, H_v, d_k, d_v], fp32
    # Memory only this state holds (a batched step's stacked rows): the next step may update it in place,
    # sparing a fresh [B, H, d_k, d_v] copy a token. False for anything restored or placed from a cache.
    scratch: bool = False


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
    # Gated DeltaNet layers' keys (per key head), values, log gates and betas ([B, T, H_k, K], [B, T, H_v, V],
    # [B, T, H_v]): what a short segment's entry keeps in place of its operators (``cache.entry.LinearTokens``)
    inputs: dict[int, tuple[torch.Tensor, ...]] = field(default_factory=dict)


@dataclass
class SegmentJumps:
    """Passed to a fused forward over a request's fresh tokens (seams, in-context stretches, the query):
    where its linear layers skip over a cached segment. After fresh token ``at[j]`` the state becomes
    ``P_j @ S + B_j`` of the state ``S`` after fresh token ``src[j]`` (``src == at``: the state then;
    earlier: the state before the segment's seam, seam variant A), and the conv history becomes the
    segment's tail. ``linear`` maps each linear layer to ``(P [J, H, K, K], B [J, H, K, V],
    tails [J, conv_dim, kernel - 1])``; where a Gated DeltaNet layer has segments kept as their tokens,
    ``tokens`` maps it to one ``DeltaTokens`` or None per jump, and its ``P``, ``B`` hold the None jumps' only
    (``kernels.scan.Jumps``)."""

    at: torch.Tensor
    src: torch.Tensor
    linear: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    tokens: dict[int, tuple[DeltaTokens | None, ...]] = field(default_factory=dict)


@dataclass
class StateMarks:
    """Passed to a forward: ``at`` the positions (after that many of its tokens, each in ``(0, T)``, ascending)
    where each linear layer records its state, so that a request keeping its state where its query and its
    generation prompt begin runs one forward, not one per mark. In a fused forward (``SegmentJumps``) they lie
    after its last jump (in the query), and the state there is the one after the jumps. Attention layers record
    nothing: their KV there is a prefix of the buffer. A mixer records its conv tail (``conv``) and its
    recurrent state (``recurrent``), one per mark; one with neither records an empty tensor, so that a mixer
    that does not record at all is found (``linear``)."""

    at: tuple[int, ...]
    conv: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    recurrent: dict[int, list[torch.Tensor]] = field(default_factory=dict)

    def pieces(self, tokens: int, start: int = 0) -> list[tuple[int, int]]:
        """The forward's tokens from ``start`` (where its jumps end) cut at the marks: ``(lo, hi)`` spans, each but
        the last ending at a mark (empty where a mark is at ``start``)."""
        if any(not 0 < m < tokens for m in self.at) or list(self.at) != sorted(set(self.at)):
            raise ValueError(f"marks {self.at} must be ascending positions inside a forward of {tokens} tokens")
        if self.at[0] < start:
            raise ValueError(f"marks {self.at} must lie after the forward's last jump, at {start}")
        cuts = [start, *self.at, tokens]
        return list(zip(cuts[:-1], cuts[1:], strict=True))

    def after(self, jumps: torch.Tensor) -> int:
        """Where the state is recorded from in a forward with these jumps (``SegmentJumps.at``): the first mark,
        which must lie after the last of them."""
        last = int(jumps[-1]) if jumps.numel() else 0
        if self.at[0] < last:
            raise ValueError(f"marks {self.at} must lie after the forward's last jump, at {last}")
        return self.at[0]

    def linear(self, layers: list[int]) -> list[dict[int, LinearLayerState]]:
        """Per mark, each of ``layers``' state there."""
        for i in layers:
            if len(self.conv.get(i, ())) != len(self.at) or len(self.recurrent.get(i, ())) != len(self.at):
                raise ValueError(f"linear layer {i} recorded no state at the marks {self.at}")
        return [
            {i: LinearLayerState(self.conv[i][j], self.recurrent[i][j]) for i in layers} for j in range(len(self.at))
        ]


class _KVBuffer:
    """One attention layer's K, V, positions and owed rotations, in tensors with room to grow."""

    def __init__(
        self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor, shift: torch.Tensor, capacity: int = 0
    ) -> None:
        self.keys, self.values, self.positions, self.shift = keys, values, positions, shift
        self.size = keys.shape[2]
        if capacity > self.size:
            self._grow(capacity)

    def append(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor, shift: torch.Tensor) -> None:
        n = keys.shape[2]
        if self.size + n > self.keys.shape[2]:
            self._grow(max(self.size + n, 2 * self.keys.shape[2], 64))
        end = self.size + n
        self.keys[:, :, self.size : end] = keys
        self.values[:, :, self.size : end] = values
        self.positions[self.size : end] = positions
        self.shift[self.size : end] = shift
        self.size = end

    def _grow(self, cap: int) -> None:
        self.keys = self._grown(self.keys, cap, dim=2)
        self.values = self._grown(self.values, cap, dim=2)
        self.positions = self._grown(self.positions, cap, dim=0)
        self.shift = self._grown(self.shift, cap, dim=0)

    def _grown(self, t: torch.Tensor, cap: int, dim: int) -> torch.Tensor:
        shape = list(t.shape)
        shape[dim] = cap
        out = t.new_empty(shape)
        out.narrow(dim, 0, self.size).copy_(t.narrow(dim, 0, self.size))
        return out

    def view(self) -> AttentionLayerKV:
        n = self.size
        return AttentionLayerKV(self.keys[:, :, :n], self.values[:, :, :n], self.positions[:n], self.shift[:n])


class RequestState:
    """Per-layer state for incremental prefill and decode; ``seq_len`` counts the tokens it holds.

    Like the KV buffers, a linear layer's state left by a batched decode step is written in place by the next
    one; whoever keeps a state's tensors past a step clones them (as the prefix cache does)."""

    def __init__(self, config: HybridConfig) -> None:
        self.config = config
        self._linear: dict[int, LinearLayerState] = {}
        self._kv: dict[int, _KVBuffer] = {}
        self._reserve = 0
        self._seq_len = 0
        # Set to {} by a probe (``deviation``) to keep each attention layer's queries of the last forward and
        # their softmax scale; None (the default) keeps nothing.
        self.queries: dict[int, tuple[torch.Tensor, float]] | None = None

    @property
    def seq_len(self) -> int:
        return self._seq_len

    @property
    def linear_layer_ids(self) -> list[int]:
        return [i for i, t in enumerate(self.config.layer_types) if t in (LINEAR, HYBRID)]

    @property
    def attention_layer_ids(self) -> list[int]:
        return [i for i, t in enumerate(self.config.layer_types) if t in (FULL, HYBRID)]

    def linear(self, idx: int) -> LinearLayerState | None:
        return self._linear.get(idx)

    def attention(self, idx: int) -> AttentionLayerKV | None:
        buffer = self._kv.get(idx)
        return buffer.view() if buffer is not None else None

    # -- written by the model's layers ------------------------------------------------------------

    def set_linear(self, idx: int, conv: torch.Tensor, recurrent: torch.Tensor, scratch: bool = False) -> None:
        """``scratch``: the tensors are this state's own (``LinearLayerState.scratch``)."""
        self._linear[idx] = LinearLayerState(conv=conv, recurrent=recurrent, scratch=scratch)

    def append_kv(
        self,
        idx: int,
        keys: torch.Tensor,
        values: torch.Tensor,
        positions: torch.Tensor,
        shift: torch.Tensor | None = None,
    ) -> AttentionLayerKV:
        """Add keys rotated at ``positions - shift`` (``shift`` None: already at ``positions``). They go
        into a buffer that grows geometrically, so a decode step copies one token, not the whole KV."""
        if shift is None:
            shift = torch.zeros_like(positions)
        buffer = self._kv.get(idx)
        if buffer is None:
            buffer = self._kv[idx] = _KVBuffer(keys, values, positions, shift, self._reserve)
        else:
            buffer.append(keys, values, positions, shift)
        return buffer.view()

    def reserve(self, tokens: int) -> None:
        """Room for ``tokens`` keys in every attention layer's buffer from its first append: a request
        that knows its prompt's length copies its KV once."""
        self._reserve = tokens

    def advance(self, tokens: int) -> None:
        """Count ``tokens`` that a forward has just written into every layer."""
        self._seq_len += tokens

    # -- written by the engine's parts --------------------------------------------------------------

    def restore(self, seq_len: int, linear: Mapping[int, LinearLayerState], kv: Mapping[int, AttentionLayerKV]) -> None:
        """Become the state of a cached prefix of ``seq_len`` tokens (an empty state only)."""
        if self._seq_len or self._linear or self._kv:
            raise ValueError("restore needs an empty request state")
        for i, state in linear.items():
            self.set_linear(i, state.conv.clone(), state.recurrent.clone())
        for i, layer in kv.items():
            self.append_kv(i, layer.keys, layer.values, layer.positions, layer.shift)
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
