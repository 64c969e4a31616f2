"""The segment store: an in-memory LRU with a byte budget in front of an optional persistent tier.

It holds both parts of a cached segment (``entry.py``): the shared ``SegmentEntry`` under the
segment's key and each ``RemainderEntry`` under a key of its own, so a request with another seam
width adds a small entry instead of replacing the segment's. A corrupt or mismatched entry is
dropped and reported as a miss, so the caller recomputes it; it is never used and never an error
the caller sees.
"""

from __future__ import annotations

from typing import Any, TypeVar

import torch

from .disk import BytesTier, PickledValue
from .entry import CacheEntry, CorruptEntry, RemainderEntry, SegmentEntry
from .keys import remainder_key
from .lru import ByteLRU

E = TypeVar("E", SegmentEntry, RemainderEntry)


class SegmentStore:
    def __init__(
        self,
        fingerprint: str,
        memory_bytes: int = 2 << 30,
        disk: BytesTier | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        """Entries read from ``disk`` are placed on ``device``, the model's."""
        if memory_bytes < 0:
            raise ValueError("memory_bytes must be >= 0")
        self.device = torch.device(device)
        self.fingerprint = fingerprint
        self.disk = disk
        self._memory: ByteLRU[CacheEntry] = ByteLRU(memory_bytes)
        self.counters = {"memory_hits": 0, "disk_hits": 0, "misses": 0, "corrupt": 0, "writes": 0}

    def get(self, key: str, token_ids: tuple[int, ...]) -> SegmentEntry | None:
        """The shared part of the segment cached under ``key``."""
        return self._get(key, token_ids, SegmentEntry)

    def get_remainder(self, key: str, token_ids: tuple[int, ...], seam: int) -> RemainderEntry | None:
        """The remainder after ``seam`` tokens of the segment cached under ``key``."""
        entry = self._get(remainder_key(key, seam), token_ids, RemainderEntry)
        if entry is not None and entry.seam != seam:
            self._drop(remainder_key(key, seam))
            return None
        return entry

    def put(self, key: str, entry: SegmentEntry) -> None:
        self._put(key, entry)

    def put_remainder(self, key: str, entry: RemainderEntry) -> None:
        self._put(remainder_key(key, entry.seam), entry)

    def _get(self, key: str, token_ids: tuple[int, ...], kind: type[E]) -> E | None:
        entry = self._memory.get(key)
        if entry is not None:
            if isinstance(entry, kind) and entry.token_ids == token_ids:
                self.counters["memory_hits"] += 1
                return entry
            self._memory.pop(key)
            self.counters["corrupt"] += 1
        if self.disk is not None:
            found = self._from_disk(key, token_ids, kind)
            if found is not None:
                self.counters["disk_hits"] += 1
                self._memory.put(key, found)
                return found
        self.counters["misses"] += 1
        return None

    def _from_disk(self, key: str, token_ids: tuple[int, ...], kind: type[E]) -> E | None:
        assert self.disk is not None
        try:
            data = self.disk.get(key)
            if data is None:
                return None
            entry = kind.from_bytes(data, self.fingerprint)
            if entry.token_ids != token_ids:
                raise CorruptEntry("token ids differ: a key collision")
            return entry.to(self.device) if self.device.type != "cpu" else entry
        except (CorruptEntry, PickledValue):
            self._drop(key)
            return None

    def _drop(self, key: str) -> None:
        self.counters["corrupt"] += 1
        self._memory.pop(key)
        if self.disk is not None:
            self.disk.delete(key)

    def _put(self, key: str, entry: CacheEntry) -> None:
        self.counters["writes"] += 1
        self._memory.put(key, entry)
        if self.disk is not None:
            self.disk.set(key, entry.to_bytes(self.fingerprint))

    def clear(self) -> None:
        self._memory.clear()
        if self.disk is not None:
            self.disk.clear()

    def __contains__(self, key: str) -> bool:
        return key in self._memory

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "memory_entries": len(self._memory),
            "memory_bytes": self._memory.used,
            "evictions": self._memory.evictions,
            **self.counters,
        }
        if self.disk is not None:
            out["disk"] = self.disk.stats()
        return out
