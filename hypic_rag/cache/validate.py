"""What an entry must look like to be used by one model: its layers, shapes, dtypes, finite values and token ids.

A checksum proves that bytes were not damaged after they were written, not that the writer wrote the right
thing: a writer with a bug, an older format or a hostile writer can produce well-checksummed entries with a
missing layer, a wrong shape or NaN states, which would be used silently (wrong logits) or fail deep inside the
model. So every entry read from a shared tier is checked against the layout the model's config implies before it
is used; one that does not fit is corrupt (dropped, counted, recomputed).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..model import HybridModel
from ..model.config import FULL, HYBRID
from .entry import CacheEntry, CorruptEntry, LinearTokens, SegmentEntry


@dataclass(frozen=True)
class EntryLayout:
    """The shapes and dtypes of one model's entries (``L`` is the segment's length): per linear layer its
    mixer's shapes (``b``, ``p`` in the mixer's operator form, ``conv_tail``), per attention layer K and V;
    ``tokens``, per linear layer whose mixer can keep a segment as its tokens, each field's ``(heads, width)``."""

    linear: tuple[tuple[int, tuple[tuple[str, tuple[int, ...]], ...]], ...]
    attention_layers: tuple[int, ...]
    kv_heads: int
    head_dim: int
    vocab_size: int
    dtypes: frozenset[torch.dtype]  # fp32 (states, operators), the model's dtype (KV, conv tails), the entry dtype
    tokens: tuple[tuple[int, tuple[tuple[str, tuple[int, int]], ...]], ...] = ()

    @classmethod
    def of(cls, model: HybridModel, entry_dtype: torch.dtype = torch.float32) -> EntryLayout:
        config = model.config
        shapes = {i: tuple(mixer.state_shapes().items()) for i, mixer in model.linear_mixers().items()}
        mixers = model.linear_mixers().items()
        tokens = {i: tuple(m.token_shapes().items()) for i, m in mixers if hasattr(m, "token_shapes")}
        return cls(
            linear=tuple(sorted(shapes.items())),
            attention_layers=tuple(i for i, t in enumerate(config.layer_types) if t in (FULL, HYBRID)),
            kv_heads=config.num_key_value_heads,
            head_dim=config.head_dim,
            vocab_size=config.vocab_size,
            dtypes=frozenset({torch.float32, model.dtype, entry_dtype}),
            tokens=tuple(sorted(tokens.items())),
        )

    @property
    def linear_layers(self) -> tuple[int, ...]:
        return tuple(i for i, _ in self.linear)

    def check(self, entry: CacheEntry) -> None:
        """Raise ``CorruptEntry`` unless ``entry`` fits this model exactly."""
        n = len(entry.token_ids)
        if n == 0 or any(not 0 <= i < self.vocab_size for i in entry.token_ids):
            raise CorruptEntry("token ids outside the vocabulary, or none")
        if tuple(sorted(entry.linear)) != self.linear_layers:
            raise CorruptEntry(f"linear layers {sorted(entry.linear)}, expected {list(self.linear_layers)}")
        covered = n if isinstance(entry, SegmentEntry) else n - entry.seam  # the tokens its operators span
        expected: list[tuple[str, torch.Tensor, tuple[int, ...]]] = []
        token_shapes = dict(self.tokens)
        for i, shapes in self.linear:
            lin = entry.linear[i]
            if isinstance(lin, LinearTokens):
                if i not in token_shapes:
                    raise CorruptEntry(f"linear layer {i} kept as tokens, a form its mixer does not have")
                for name, (heads, width) in token_shapes[i]:
                    expected.append((f"tokens.{i}.{name}", getattr(lin, name), (heads, covered, width)))
                expected.append((f"tokens.{i}.conv_tail", lin.conv_tail, dict(shapes)["conv_tail"]))
                continue
            for name, shape in shapes:
                if hasattr(lin, name):
                    expected.append((f"linear.{i}.{name}", getattr(lin, name), shape))
        if isinstance(entry, SegmentEntry):
            if tuple(sorted(entry.attention)) != self.attention_layers:
                raise CorruptEntry(
                    f"attention layers {sorted(entry.attention)}, expected {list(self.attention_layers)}"
                )
            kv = (self.kv_heads, n, self.head_dim)
            for i, att in entry.attention.items():
                expected += [(f"attention.{i}.keys", att.keys, kv), (f"attention.{i}.values", att.values, kv)]
        elif not 0 < entry.seam < n:
            raise CorruptEntry(f"a remainder after {entry.seam} of {n} tokens")
        for name, tensor, shape in expected:
            if tuple(tensor.shape) != shape:
                raise CorruptEntry(f"{name} has shape {tuple(tensor.shape)}, expected {shape}")
            if tensor.dtype not in self.dtypes:
                raise CorruptEntry(f"{name} is {tensor.dtype}")
            if not bool(torch.isfinite(tensor).all()):
                raise CorruptEntry(f"{name} holds non-finite values")
            if name.endswith(".gates") and not _gates_in_range(tensor):
                raise CorruptEntry(f"{name} holds a log gate above 0 or a beta outside [0, 2]")


def _gates_in_range(gates: torch.Tensor) -> bool:
    """Log gates are ``-exp(A) softplus(.) <= 0`` and betas ``sigmoid(.)`` times at most 2 (OLMo's scale): any
    other value would make the rule grow its state, which no layer of ours can write."""
    g, beta = gates[..., 0], gates[..., 1]
    return bool((g <= 0).all()) and bool(((beta >= 0) & (beta <= 2)).all())
