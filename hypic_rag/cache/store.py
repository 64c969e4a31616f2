"""The segment store: an in-memory LRU with a byte budget in front of an optional persistent tier.

A corrupt or mismatched entry is dropped and reported as a miss, so the caller recomputes it; it is
never used and never an error the caller sees.
"""

from __future__ import annotations

from typing import Any

import torch

from .disk import BytesTier, PickledValue
from .entry import CorruptEntry, SegmentEntry
from .lru import ByteLRU


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
        self._memory: ByteLRU[SegmentEntry] = ByteLRU(memory_bytes)
        self.counters = {"memory_hits": 0, "disk_hits": 0, "misses": 0, "corrupt": 0}

    def get(self, key: str, token_ids: tuple[int, ...]) -> SegmentEntry | None:
        entry = self._memory.get(key)
        if entry is not None:
            if entry.token_ids == token_ids:
                self.counters["memory_hits"] += 1
                return entry
            self._memory.pop(key)
            self.counters["corrupt"] += 1
        if self.disk is not None:
            entry = self._from_disk(key, token_ids)
            if entry is not None:
                self.counters["disk_hits"] += 1
                self._memory.put(key, entry)
                return entry
        self.counters["misses"] += 1
        return None

    def _from_disk(self, key: str, token_ids: tuple[int, ...]) -> SegmentEntry | None:
        assert self.disk is not None
        try:
            data = self.disk.get(key)
            if data is None:
                return None
            entry = SegmentEntry.from_bytes(data, self.fingerprint)
            if entry.token_ids != token_ids:
                raise CorruptEntry("token ids differ: a key collision")
            return entry.to(self.device) if self.device.type != "cpu" else entry
        except (CorruptEntry, PickledValue):
            self.counters["corrupt"] += 1
            self.disk.delete(key)
            return None

    def put(self, key: str, entry: SegmentEntry) -> None:
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
