"""Exact prefix caching at whole-segment boundaries: the baseline vLLM and SGLang offer for hybrids.

A node per cached prefix of segments holds the linear states (conv tail + recurrent state) at its
boundary and the KV of its own last segment; a prompt reuses the longest chain of nodes that matches
its leading segments exactly, so reuse stops at the first segment that moved.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..model.state import AttentionLayerKV, LinearLayerState, RequestState
from .lru import ByteLRU, Space, memory_space


@dataclass
class PrefixNode:
    seq_len: int
    linear: dict[int, LinearLayerState]
    kv: dict[int, AttentionLayerKV]  # this segment's tokens only

    @property
    def nbytes(self) -> int:
        lin = sum(s.conv.nbytes + s.recurrent.nbytes for s in self.linear.values())
        return lin + sum(k.nbytes for k in self.kv.values())


class PrefixStore:
    """Prefix nodes keyed by the chain of segments that leads to them, in a byte-budget LRU."""

    def __init__(self, fingerprint: str, memory: ByteLRU | Space | int = 1 << 30) -> None:
        """``memory``: the engine's shared LRU (one budget for all its caches), or a budget of its own."""
        self.fingerprint = fingerprint
        self._nodes: Space[PrefixNode] = memory_space(memory, "prefix")

    def chain_keys(self, segments: Sequence[Sequence[int]]) -> list[str]:
        keys, h = [], hashlib.sha256(self.fingerprint.encode())
        for ids in segments:
            h = h.copy()
            h.update(torch.tensor([len(ids), *ids], dtype=torch.int64).numpy().tobytes())
            keys.append(h.hexdigest())
        return keys

    def longest(self, keys: Sequence[str]) -> int:
        """How many leading segments are cached. Every node of the chain counts as looked up, so the memory
        tier's admission sees a prefix recur even while its nodes are not kept."""
        for key in keys:
            self._nodes.note(key)
        depth = 0
        while depth < len(keys) and keys[depth] in self._nodes:
            depth += 1
        return depth

    def restore(self, keys: Sequence[str], state: RequestState) -> None:
        """Load the chain ``keys`` (all cached) into an empty request ``state``."""
        nodes = [self._nodes.get(k) for k in keys]
        assert all(n is not None for n in nodes), "restore takes a chain that longest() found"
        last = nodes[-1]
        kv = {}
        for i in last.kv:
            parts = [n.kv[i] for n in nodes]
            kv[i] = AttentionLayerKV(
                torch.cat([p.keys for p in parts], dim=2),
                torch.cat([p.values for p in parts], dim=2),
                torch.cat([p.positions for p in parts]),
                torch.cat([p.shift for p in parts]),
            )
        state.restore(last.seq_len, last.linear, kv)

    def snapshot(self, key: str, state: RequestState, start: int) -> None:
        """Record the boundary ``state`` is at, with the KV of tokens from ``start`` on."""
        if self._nodes.get(key) is not None:
            return
        linear, kv = {}, {}
        for i in state.linear_layer_ids:
            layer = state.linear(i)
            if layer is not None:
                linear[i] = LinearLayerState(layer.conv.clone(), layer.recurrent.clone())
        for i in state.attention_layer_ids:
            layer = state.attention(i)
            if layer is not None:
                sel = layer.positions >= start
                kv[i] = AttentionLayerKV(
                    layer.keys[:, :, sel].clone(),
                    layer.values[:, :, sel].clone(),
                    layer.positions[sel].clone(),
                    layer.shift[sel].clone(),
                )
        self._nodes.put(key, PrefixNode(state.seq_len, linear, kv))

    def clear(self) -> None:
        self._nodes.clear()

    def stats(self) -> dict[str, int]:
        return {"prefix_nodes": len(self._nodes), "prefix_bytes": self._nodes.used}
