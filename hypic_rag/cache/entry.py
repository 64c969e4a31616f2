"""A cached segment (HYPIC.md §7) and its byte format.

Per linear layer: the zero-start end state ``b``, the transition operator ``p`` and the conv tail;
with a seam, also the operator of the remainder after it (variant B). Per attention layer: K rotated
at positions ``0..L-1`` and V. The token ids travel with the entry to catch key collisions.

Bytes are ``MAGIC | sha256(payload) | payload`` where the payload is a safetensors blob: raw tensors
and a JSON header, nothing executable, so a tampered or truncated entry is detected, never unpickled.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, field

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

FORMAT_VERSION = 1
MAGIC = b"HYPIC\x00\x01\x00"


class CorruptEntry(ValueError):
    """Bytes that do not decode to a valid entry."""


@dataclass
class LinearEntry:
    b: torch.Tensor  # [H, K, V] fp32
    p: torch.Tensor  # [H, K, K] fp32
    conv_tail: torch.Tensor  # [conv_dim, kernel - 1]
    p_rest: torch.Tensor | None = None
    b_rest: torch.Tensor | None = None


@dataclass
class AttentionEntry:
    keys: torch.Tensor  # [kv_heads, L, head_dim], rotated at positions 0..L-1
    values: torch.Tensor  # [kv_heads, L, head_dim]


@dataclass
class SegmentEntry:
    token_ids: tuple[int, ...]
    seam: int  # the remainder operators cover tokens [seam, L); 0 when there are none
    linear: dict[int, LinearEntry] = field(default_factory=dict)
    attention: dict[int, AttentionEntry] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def nbytes(self) -> int:
        total = 0
        for lin in self.linear.values():
            total += sum(t.nbytes for t in (lin.b, lin.p, lin.conv_tail, lin.p_rest, lin.b_rest) if t is not None)
        for att in self.attention.values():
            total += att.keys.nbytes + att.values.nbytes
        return total

    def to(self, device: torch.device | str) -> SegmentEntry:
        def mv(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        return SegmentEntry(
            self.token_ids,
            self.seam,
            {
                i: LinearEntry(mv(e.b), mv(e.p), mv(e.conv_tail), mv(e.p_rest), mv(e.b_rest))
                for i, e in self.linear.items()
            },
            {i: AttentionEntry(mv(e.keys), mv(e.values)) for i, e in self.attention.items()},
        )

    # -- bytes ---------------------------------------------------------------------------------

    def to_bytes(self, fingerprint: str) -> bytes:
        tensors: dict[str, torch.Tensor] = {"token_ids": torch.tensor(self.token_ids, dtype=torch.int64)}
        for i, e in self.linear.items():
            for name in ("b", "p", "conv_tail", "p_rest", "b_rest"):
                t = getattr(e, name)
                if t is not None:
                    tensors[f"linear.{i}.{name}"] = t.detach().cpu().contiguous()
        for i, e in self.attention.items():
            tensors[f"attention.{i}.keys"] = e.keys.detach().cpu().contiguous()
            tensors[f"attention.{i}.values"] = e.values.detach().cpu().contiguous()
        meta = {"format": str(FORMAT_VERSION), "seam": str(self.seam), "fingerprint": fingerprint}
        payload = st_save(tensors, metadata=meta)
        return MAGIC + hashlib.sha256(payload).digest() + payload

    @classmethod
    def from_bytes(cls, data: bytes, fingerprint: str) -> SegmentEntry:
        """Decode and verify; raise ``CorruptEntry`` on any mismatch."""
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
        entry = cls(tuple(tensors.pop("token_ids").tolist()), int(meta["seam"]))
        linear: dict[int, dict[str, torch.Tensor]] = {}
        attention: dict[int, dict[str, torch.Tensor]] = {}
        for name, t in tensors.items():
            kind, idx, field_name = name.split(".")
            (linear if kind == "linear" else attention).setdefault(int(idx), {})[field_name] = t
        try:
            entry.linear = {i: LinearEntry(**f) for i, f in linear.items()}
            entry.attention = {i: AttentionEntry(**f) for i, f in attention.items()}
        except TypeError as exc:
            raise CorruptEntry(f"entry fields do not match: {exc}") from exc
        return entry
