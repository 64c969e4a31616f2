"""Cached segments (docs/design.md §7) and their byte format.

An entry comes in two parts, so that requests with different seam widths share one copy of what
does not depend on the seam:

- ``SegmentEntry``, the shared part: per linear layer the zero-start end state ``b``, the transition
  operator ``p`` and the conv tail (``LinearEntry``); per attention layer K rotated at positions ``0..L-1`` and V.
  A Gated DeltaNet layer of a segment short enough that its delta-rule inputs take fewer numbers than ``b`` and
  ``p`` keeps those instead (``LinearTokens``: keys, values, gates, conv tail; ``kernels.algebra.DeltaTokens``
  says why they determine both), under its own tensor prefix ``tokens``.
- ``RemainderEntry``, one per seam width ``w`` (seam variant B): per linear layer the end state and
  operator of the segment's tokens ``[w, L)``, its remainder, which carry the state the seam recomputed
  to the end. An entry whose linear layers all keep their tokens derives every remainder from them
  (``SegmentEntry.derived_remainder``: a view, stored nowhere and counted in no byte total).

A ``CachedSegment`` is the two together, as one request uses them: the entry, and the remainder of the seam
width its plan composes (or none).

An entry is kept in its store's ``entry_dtype`` (``ENTRY_DTYPES``: float32 as computed, or bfloat16/float16 at half
the bytes) and widened back to the compute dtypes when used (``widened``): states and operators fp32, conv tails and
KV the model's dtype, so the math never runs in 16 bits.

Both carry the token ids, to catch key collisions. Bytes are ``MAGIC | sha256(payload) | payload``
where the payload is a safetensors blob: raw tensors and a JSON header, nothing executable, so a
tampered or truncated entry is detected, never unpickled.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from ..kernels.algebra import DeltaTokens

FORMAT_VERSION = 4
MAGIC = b"HYPIC\x00\x02\x00"


ENTRY_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def entry_dtype(name: str | torch.dtype) -> torch.dtype:
    """The dtype an entry is kept in, from its name (or a dtype); a ``ValueError`` naming the choices."""
    if isinstance(name, torch.dtype) and name in ENTRY_DTYPES.values():
        return name
    if isinstance(name, str) and name.removeprefix("torch.") in ENTRY_DTYPES:
        return ENTRY_DTYPES[name.removeprefix("torch.")]
    raise ValueError(f"entry_dtype must be one of {', '.join(ENTRY_DTYPES)}, got {name!r}")


def _cast(group: object, dtypes: dict[str, torch.dtype]) -> object:
    """A copy of a per-layer group with each named tensor in its dtype (no copy where it already is)."""
    return type(group)(**{k: t.to(dtypes.get(k, t.dtype)) for k, t in vars(group).items()})


KEPT_FP32 = ("gates",)  # fields no entry dtype narrows


def _nbytes_as(groups: dict[int, object], dtype: torch.dtype) -> int:
    size = torch.finfo(dtype).bits // 8
    return sum(
        t.numel() * (t.element_size() if name in KEPT_FP32 else size)
        for g in groups.values()
        for name, t in vars(g).items()
    )


def _finite(groups: dict[int, object]) -> bool:
    return all(bool(torch.isfinite(t).all()) for g in groups.values() for t in vars(g).values())


STATE_FIELDS = ("b", "p")  # fp32 when used; the other fields (conv tails, KV) are in the model's dtype


class CorruptEntry(ValueError):
    """Bytes that do not decode to a valid entry."""


@dataclass
class LinearEntry:
    b: torch.Tensor  # [H, K, V] fp32
    p: torch.Tensor  # [H, K, K] fp32
    conv_tail: torch.Tensor  # [conv_dim, kernel - 1]


@dataclass
class LinearTokens:
    keys: torch.Tensor  # [H_k, L, K]: the delta rule's L2-normalised keys, per key head
    values: torch.Tensor  # [H_v, L, V]
    gates: torch.Tensor  # [H_v, L, 2] fp32 in every entry dtype: each token's log gate g and beta
    conv_tail: torch.Tensor  # [conv_dim, kernel - 1]

    def operator(self) -> DeltaTokens:
        """The segment's map, keys repeated to the value heads (as the layer repeats them), all fp32."""
        rep = self.values.shape[0] // self.keys.shape[0]
        keys = self.keys.float() if rep == 1 else self.keys.float().repeat_interleave(rep, dim=0)
        gates = self.gates.float()
        return DeltaTokens(keys, self.values.float(), gates[..., 0], gates[..., 1])

    def suffix(self, start: int) -> LinearTokens:
        """Tokens ``[start, L)``: the remainder after a seam of ``start`` tokens (its conv tail is the segment's)."""
        return LinearTokens(self.keys[:, start:], self.values[:, start:], self.gates[:, start:], self.conv_tail)


LINEAR_PREFIXES = {"linear": LinearEntry, "tokens": LinearTokens}


@dataclass
class AttentionEntry:
    keys: torch.Tensor  # [kv_heads, L, head_dim], rotated at positions 0..L-1
    values: torch.Tensor  # [kv_heads, L, head_dim]


@dataclass
class LinearRemainder:
    b: torch.Tensor  # [H, K, V] fp32: the remainder's zero-start end state
    p: torch.Tensor  # [H, K, K] fp32: the remainder's operator


def _tensors_nbytes(groups: dict[int, object]) -> int:
    return sum(t.nbytes for g in groups.values() for t in vars(g).values())


def _encode(kind: str, tensors: dict[str, torch.Tensor], meta: dict[str, str], fingerprint: str) -> bytes:
    meta = {"format": str(FORMAT_VERSION), "kind": kind, "fingerprint": fingerprint, **meta}
    payload = st_save({k: t.detach().cpu().contiguous() for k, t in tensors.items()}, metadata=meta)
    return MAGIC + hashlib.sha256(payload).digest() + payload


def _decode(data: bytes, kind: str, fingerprint: str) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """Verified metadata and tensors of an entry of ``kind``; ``CorruptEntry`` on any mismatch."""
    head = len(MAGIC) + 32
    if not isinstance(data, bytes) or len(data) < head + 8 or not data.startswith(MAGIC):
        raise CorruptEntry("not a hypic-rag segment entry")
    payload = data[head:]
    if hashlib.sha256(payload).digest() != data[len(MAGIC) : head]:
        raise CorruptEntry("checksum mismatch")
    try:
        (n,) = struct.unpack("<Q", payload[:8])
        meta = json.loads(payload[8 : 8 + n]).get("__metadata__", {})
        tensors = st_load(payload)
    except Exception as exc:  # safetensors raises its own error types
        raise CorruptEntry(f"unreadable payload: {exc}") from exc
    if meta.get("format") != str(FORMAT_VERSION) or meta.get("fingerprint") != fingerprint:
        raise CorruptEntry("entry of another format version or model")
    if meta.get("kind") != kind:
        raise CorruptEntry(f"a {meta.get('kind')!r} entry where a {kind!r} one was expected")
    if "token_ids" not in tensors:
        raise CorruptEntry("entry without token ids")
    return meta, tensors


def _layers(tensors: dict[str, torch.Tensor], cls: type, prefix: str) -> dict[int, object]:
    """``{prefix}.{layer}.{field}`` tensors grouped into one ``cls`` per layer."""
    fields: dict[int, dict[str, torch.Tensor]] = {}
    for name, t in tensors.items():
        parts = name.split(".")
        if len(parts) != 3 or not parts[1].isdigit():
            raise CorruptEntry(f"unexpected tensor {name!r}")
        if parts[0] == prefix:
            fields.setdefault(int(parts[1]), {})[parts[2]] = t
    try:
        return {i: cls(**f) for i, f in fields.items()}
    except TypeError as exc:
        raise CorruptEntry(f"entry fields do not match: {exc}") from exc


def _flatten(prefix: str, groups: dict[int, object]) -> dict[str, torch.Tensor]:
    return {f"{prefix}.{i}.{name}": t for i, g in groups.items() for name, t in vars(g).items()}


def _flatten_linear(groups: dict[int, object]) -> dict[str, torch.Tensor]:
    """Each linear layer under the prefix of its form (``LINEAR_PREFIXES``)."""
    out: dict[str, torch.Tensor] = {}
    for prefix, cls in LINEAR_PREFIXES.items():
        out |= _flatten(prefix, {i: g for i, g in groups.items() if type(g) is cls})
    return out


def _linear_layers(tensors: dict[str, torch.Tensor]) -> dict[int, object]:
    """The linear layers of every form; a layer in two forms is corrupt."""
    out: dict[int, object] = {}
    for prefix, cls in LINEAR_PREFIXES.items():
        found = _layers(tensors, cls, prefix)
        if found.keys() & out.keys():
            raise CorruptEntry(f"linear layers {sorted(found.keys() & out.keys())} stored in two forms")
        out |= found
    return out


def _moved(group: object, device: torch.device | str) -> object:
    return type(group)(**{k: t.to(device) for k, t in vars(group).items()})


@dataclass
class SegmentEntry:
    """The seam-independent part of a cached segment."""

    KIND: ClassVar[str] = "segment"

    token_ids: tuple[int, ...]
    linear: dict[int, LinearEntry | LinearTokens] = field(default_factory=dict)
    attention: dict[int, AttentionEntry] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def prefill_tokens(self) -> int:
        """The tokens a hit saves prefilling: what the memory tier's value policy weighs it by."""
        return len(self.token_ids)

    @property
    def nbytes(self) -> int:
        return _tensors_nbytes(self.linear) + _tensors_nbytes(self.attention)

    def to(self, device: torch.device | str) -> SegmentEntry:
        return SegmentEntry(
            self.token_ids,
            {i: _moved(e, device) for i, e in self.linear.items()},
            {i: _moved(e, device) for i, e in self.attention.items()},
        )

    @property
    def derives_remainders(self) -> bool:
        """Whether every linear layer keeps its tokens, so any remainder is a view of this entry."""
        return bool(self.linear) and all(isinstance(e, LinearTokens) for e in self.linear.values())

    def derived_remainder(self, seam: int) -> RemainderEntry | None:
        """The remainder after ``seam`` tokens as a view of this entry (None unless it ``derives_remainders`` and
        ``0 < seam < L``)."""
        if not self.derives_remainders or not 0 < seam < len(self):
            return None
        linear = {i: e.suffix(seam) for i, e in self.linear.items()}
        return RemainderEntry(self.token_ids, seam, linear, derived=True)

    def stored_as(self, dtype: torch.dtype) -> SegmentEntry:
        """This entry as a store of ``entry_dtype`` keeps it: float32 as computed, else every tensor in ``dtype``
        but the gates of a layer kept as tokens (a few numbers per token, in the exponent of every state)."""
        if dtype == torch.float32:
            return self
        every = dict.fromkeys(("b", "p", "conv_tail", "keys", "values"), dtype)
        linear = {i: _cast(e, every) for i, e in self.linear.items()}
        return SegmentEntry(self.token_ids, linear, {i: _cast(e, every) for i, e in self.attention.items()})

    def widened(self, model_dtype: torch.dtype) -> SegmentEntry:
        """The compute dtypes back: states, operators and a layer's tokens fp32, conv tails and KV ``model_dtype``."""
        linear_dtypes = dict.fromkeys(("b", "p", "keys", "values", "gates"), torch.float32)
        linear_dtypes["conv_tail"] = model_dtype
        kv = {"keys": model_dtype, "values": model_dtype}
        linear = {i: _cast(e, linear_dtypes) for i, e in self.linear.items()}
        return SegmentEntry(self.token_ids, linear, {i: _cast(e, kv) for i, e in self.attention.items()})

    def nbytes_as(self, dtype: torch.dtype) -> int:
        """The bytes this entry holds when kept as ``stored_as(dtype)`` keeps it."""
        if dtype == torch.float32:
            return self.nbytes
        return _nbytes_as(self.linear, dtype) + _nbytes_as(self.attention, dtype)

    def finite(self) -> bool:
        return _finite(self.linear) and _finite(self.attention)

    def to_bytes(self, fingerprint: str) -> bytes:
        tensors = {"token_ids": torch.tensor(self.token_ids, dtype=torch.int64)}
        tensors |= _flatten_linear(self.linear) | _flatten("attention", self.attention)
        return _encode(self.KIND, tensors, {}, fingerprint)

    @classmethod
    def from_bytes(cls, data: bytes, fingerprint: str) -> SegmentEntry:
        """Decode and verify; raise ``CorruptEntry`` on any mismatch."""
        _, tensors = _decode(data, cls.KIND, fingerprint)
        ids = tuple(tensors.pop("token_ids").tolist())
        return cls(ids, _linear_layers(tensors), _layers(tensors, AttentionEntry, "attention"))


@dataclass
class RemainderEntry:
    """The operators of a segment's tokens after its first ``seam`` ones, per linear layer. ``derived``: a view of
    an entry that keeps its tokens (``SegmentEntry.derived_remainder``), never stored."""

    KIND: ClassVar[str] = "remainder"

    token_ids: tuple[int, ...]
    seam: int
    linear: dict[int, LinearRemainder | LinearTokens] = field(default_factory=dict)
    derived: bool = False

    @property
    def nbytes(self) -> int:
        return _tensors_nbytes(self.linear)

    @property
    def prefill_tokens(self) -> int:
        return len(self.token_ids) - self.seam

    def to(self, device: torch.device | str) -> RemainderEntry:
        moved = {i: _moved(e, device) for i, e in self.linear.items()}
        return RemainderEntry(self.token_ids, self.seam, moved, self.derived)

    def stored_as(self, dtype: torch.dtype) -> RemainderEntry:
        if dtype == torch.float32:
            return self
        every = dict.fromkeys(STATE_FIELDS, dtype)
        return RemainderEntry(self.token_ids, self.seam, {i: _cast(e, every) for i, e in self.linear.items()})

    def widened(self, model_dtype: torch.dtype) -> RemainderEntry:
        fp32 = dict.fromkeys(STATE_FIELDS, torch.float32)
        return RemainderEntry(self.token_ids, self.seam, {i: _cast(e, fp32) for i, e in self.linear.items()})

    def nbytes_as(self, dtype: torch.dtype) -> int:
        return self.nbytes if dtype == torch.float32 else _nbytes_as(self.linear, dtype)

    def finite(self) -> bool:
        return _finite(self.linear)

    def to_bytes(self, fingerprint: str) -> bytes:
        if self.derived:
            raise ValueError("a derived remainder is a view of its entry and is never stored")
        tensors = {"token_ids": torch.tensor(self.token_ids, dtype=torch.int64)} | _flatten("linear", self.linear)
        return _encode(self.KIND, tensors, {"seam": str(self.seam)}, fingerprint)

    @classmethod
    def from_bytes(cls, data: bytes, fingerprint: str) -> RemainderEntry:
        """Decode and verify; raise ``CorruptEntry`` on any mismatch."""
        meta, tensors = _decode(data, cls.KIND, fingerprint)
        ids = tuple(tensors.pop("token_ids").tolist())
        try:
            seam = int(meta["seam"])
        except (KeyError, ValueError) as exc:
            raise CorruptEntry(f"remainder entry without a valid seam: {exc}") from exc
        return cls(ids, seam, _layers(tensors, LinearRemainder, "linear"))


CacheEntry = SegmentEntry | RemainderEntry


@dataclass(frozen=True)
class CachedSegment:
    """A segment's entry and the remainder a request composes (None where its plan composes none), as the
    store gave them or a prefill just made them."""

    entry: SegmentEntry
    remainder: RemainderEntry | None = None

    @property
    def _held_remainder(self) -> RemainderEntry | None:
        return self.remainder if self.remainder is not None and not self.remainder.derived else None

    @property
    def nbytes(self) -> int:
        """The bytes it holds (a remainder derived from the entry holds none of its own)."""
        rest = self._held_remainder
        return self.entry.nbytes + (rest.nbytes if rest is not None else 0)

    def nbytes_as(self, dtype: torch.dtype) -> int:
        """The bytes a store of ``entry_dtype`` ``dtype`` holds for this segment."""
        rest = self._held_remainder
        return self.entry.nbytes_as(dtype) + (rest.nbytes_as(dtype) if rest is not None else 0)
