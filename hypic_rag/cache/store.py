"""The segment store: an in-memory LRU with a byte budget in front of an optional persistent tier.

It holds both parts of a cached segment (``entry.py``): the shared ``SegmentEntry`` under the
segment's key and each ``RemainderEntry`` under a key of its own, so a request with another seam
width adds a small entry instead of replacing the segment's. A corrupt or mismatched entry (bad
bytes, another model's, or one that does not fit this model's layout: ``validate.py``) is dropped
and reported as a miss, so the caller recomputes it; it is never used and never an error the caller
sees.

A persistent tier that fails (a full or read-only disk, a damaged index, a server that is down) is
bypassed: the failure is counted (``tier_errors``), logged once, and the tier is tried again after
``retry_s`` seconds; meanwhile requests are served from memory or recomputed.
"""

from __future__ import annotations

import logging
import time
from typing import Any, TypeVar

import torch

from .disk import BytesTier, ForeignPath, PickledValue
from .entry import CacheEntry, CorruptEntry, RemainderEntry, SegmentEntry
from .keys import remainder_key
from .lru import ByteLRU, Space, memory_space
from .validate import EntryLayout

E = TypeVar("E", SegmentEntry, RemainderEntry)
log = logging.getLogger("hypic_rag.cache")
COUNTERS = ("memory_hits", "disk_hits", "misses", "corrupt", "writes", "tier_errors")


class SegmentStore:
    def __init__(
        self,
        fingerprint: str,
        memory: ByteLRU | Space | int = 2 << 30,
        disk: BytesTier | None = None,
        device: torch.device | str = "cpu",
        layout: EntryLayout | None = None,
        retry_s: float = 30.0,
    ) -> None:
        """Entries read from ``disk`` are checked against ``layout`` (the model's) and placed on ``device``.
        ``memory``: the engine's shared LRU (one budget for all its caches), or a budget of its own."""
        if isinstance(memory, int) and memory < 0:
            raise ValueError("memory_bytes must be >= 0")
        self.device = torch.device(device)
        self.fingerprint = fingerprint
        self.disk = disk
        self.layout = layout
        self.retry_s = retry_s
        self._memory: Space[CacheEntry] = memory_space(memory, "segment")
        self._disk_down_until = 0.0
        self._warned = False
        self.counters = dict.fromkeys(COUNTERS, 0)

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
        data = self._tier(lambda disk: disk.get(key), corrupt=True, key=key)
        if data is None:
            return None
        try:
            entry = kind.from_bytes(data, self.fingerprint)
            if entry.token_ids != token_ids:
                raise CorruptEntry("token ids differ: a key collision")
            if self.layout is not None:
                self.layout.check(entry)
        except CorruptEntry:
            self._drop(key)
            return None
        return entry.to(self.device) if self.device.type != "cpu" else entry

    def _tier(self, call: Any, *, corrupt: bool = False, key: str = "") -> Any:
        """``call(disk)``, or None while the tier is down or when it fails (counted, logged once, retried later)."""
        if self.disk is None or time.monotonic() < self._disk_down_until:
            return None
        try:
            return call(self.disk)
        except (PickledValue, ForeignPath):
            if corrupt:  # the tier deleted the record already; count it
                self.counters["corrupt"] += 1
            return None
        except Exception as exc:  # any failure of the tier: the request goes on without it
            self.counters["tier_errors"] += 1
            self._disk_down_until = time.monotonic() + self.retry_s
            if not self._warned:
                self._warned = True
                log.warning(
                    "segment cache tier failed (%s: %s); bypassing it for %.0f s", type(exc).__name__, exc, self.retry_s
                )
            return None

    def _drop(self, key: str) -> None:
        self.counters["corrupt"] += 1
        self._memory.pop(key)
        self._tier(lambda disk: disk.delete(key))

    def _put(self, key: str, entry: CacheEntry) -> None:
        self.counters["writes"] += 1
        self._memory.put(key, entry)
        if self.disk is not None:
            self._tier(lambda disk: disk.set(key, entry.to_bytes(self.fingerprint)))

    def clear(self) -> None:
        self._memory.clear()
        self._tier(lambda disk: disk.clear())

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
            disk = self._tier(lambda disk: disk.stats())
            out["disk"] = disk if disk is not None else {"available": False}
        return out
