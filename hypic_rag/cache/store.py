"""The segment store: an in-memory LRU with a byte budget in front of an optional persistent tier.

It holds both parts of a cached segment (``entry.py``): the shared ``SegmentEntry`` under the
segment's key and each ``RemainderEntry`` under a key of its own, so a request with another seam
width adds a small entry instead of replacing the segment's. A corrupt or mismatched entry (bad
bytes, another model's, or one that does not fit this model's layout: ``validate.py``) is dropped
and reported as a miss, so the caller recomputes it; it is never used and never an error the caller
sees.

Persistent tiers (``tier.BytesTier``) are looked up in order, the local disk then the shared remote tier
(``remote.py``); a hit is copied to the faster tiers. A persistent tier that fails (a full or read-only disk, a damaged
index, a server that is down) is bypassed: the failure is counted (``tier_errors``), logged once, and
the tier is tried again after ``retry_s`` seconds; meanwhile requests are served from memory or
recomputed.

Under the memory tier's ``value`` policy the disk tier is gated too: while it has room it takes every write, and once
full (a write would evict) it takes only a segment looked up at least twice (``DISK_ADMIT_LOOKUPS``, by the memory
tier's frequency sketch), so one-off documents do not push out what recurs there either (``disk_refused``); the
shared remote tier takes every write, since another replica may be the one that sees it again.

Entries are kept in ``entry_dtype`` in every tier (``entry.py``) and widened to the compute dtypes when handed out.
One that does not fit its dtype (a float16 state past 65504) is not stored (``unstorable``) and its request uses it
as computed.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, OrderedDict
from typing import Any, TypeVar

import torch

from .disk import ForeignPath, PickledValue
from .entry import CachedSegment, CacheEntry, CorruptEntry, RemainderEntry, SegmentEntry
from .keys import remainder_key
from .lru import ByteLRU, Space, memory_space
from .seal import seal, unseal
from .tier import BytesTier, UnreadableKey
from .validate import EntryLayout

E = TypeVar("E", SegmentEntry, RemainderEntry)
log = logging.getLogger("hypic_rag.cache")
TIERS = ("disk", "remote")  # the lookup order after memory
UNKEPT_KEYS = 4096  # enough to answer for a request's own writes; older keys count as kept where a tier is up
COUNTERS = (
    "memory_hits",
    "disk_hits",
    "remote_hits",
    "misses",
    "corrupt",
    "writes",
    "tier_errors",
    "unstorable",
    "disk_refused",
)
DISK_ADMIT_LOOKUPS = 2  # lookups of a segment before a full disk tier takes it


class _Tier:
    """A persistent tier and its health: down until ``down_until`` after a failure."""

    def __init__(self, name: str, tier: BytesTier) -> None:
        self.name, self.tier = name, tier
        self.down_until = 0.0
        self.warned = False
        self.reason: str | None = None  # why its last call failed; None once one succeeds


class SegmentStore:
    def __init__(
        self,
        fingerprint: str,
        memory: ByteLRU | Space | int = 2 << 30,
        disk: BytesTier | None = None,
        device: torch.device | str = "cpu",
        layout: EntryLayout | None = None,
        retry_s: float = 30.0,
        remote: BytesTier | None = None,
        entry_dtype: torch.dtype = torch.float32,
        model_dtype: torch.dtype = torch.float32,
        secret: bytes | None = None,
    ) -> None:
        """Lookups go memory, then ``disk``, then ``remote`` (a shared tier), and a hit is copied to the faster
        tiers. Entries read from a tier are checked against ``layout`` (the model's) and placed on ``device``.
        ``memory``: the engine's shared LRU (one budget for all its caches), or a budget of its own. Entries are
        kept in ``entry_dtype`` and handed out in the compute dtypes (fp32 states, ``model_dtype`` KV); pass a
        ``fingerprint`` that names the entry dtype (``keys.entry_fingerprint``). With a ``secret``, what the
        persistent tiers hold is sealed with it (``seal.py``) and an entry without its seal is refused."""
        self.device = torch.device(device)
        self.fingerprint = fingerprint
        self.layout = layout
        self.entry_dtype, self.model_dtype = entry_dtype, model_dtype
        self.retry_s = retry_s
        self.secret = secret
        self._memory: Space[CacheEntry] = memory_space(memory, "segment")
        self._tiers: dict[str, _Tier] = {}
        self.disk, self.remote = disk, remote
        self.counters = dict.fromkeys(COUNTERS, 0)
        # keys whose last write no tier kept (the last UNKEPT_KEYS of them): what ``held_nbytes`` leaves out
        self._unkept: OrderedDict[str, None] = OrderedDict()
        self.lookups: Counter[tuple[str, str]] = Counter()  # (segment kind, "hit" or "miss")

    @property
    def disk(self) -> BytesTier | None:
        return self._tiers["disk"].tier if "disk" in self._tiers else None

    @disk.setter
    def disk(self, tier: BytesTier | None) -> None:
        self._set_tier("disk", tier)

    @property
    def remote(self) -> BytesTier | None:
        return self._tiers["remote"].tier if "remote" in self._tiers else None

    @remote.setter
    def remote(self, tier: BytesTier | None) -> None:
        self._set_tier("remote", tier)

    def _set_tier(self, name: str, tier: BytesTier | None) -> None:
        self._tiers.pop(name, None)
        if tier is not None:
            self._tiers[name] = _Tier(name, tier)
        self._tiers = {n: self._tiers[n] for n in TIERS if n in self._tiers}

    def get(self, key: str, token_ids: tuple[int, ...], kind: str | None = None) -> SegmentEntry | None:
        """The shared part of the segment cached under ``key``; ``kind`` (the segment's: document, tool, turn)
        counts the lookup in the hit ratio by kind (None: a lookup that is not a request's, uncounted)."""
        entry = self._get(key, token_ids, SegmentEntry, key)
        if kind is not None:
            self.lookups[kind, "hit" if entry is not None else "miss"] += 1
        return entry

    def get_remainder(self, key: str, token_ids: tuple[int, ...], seam: int) -> RemainderEntry | None:
        """The remainder after ``seam`` tokens of the segment cached under ``key``."""
        entry = self._get(remainder_key(key, seam), token_ids, RemainderEntry, key)
        if entry is not None and entry.seam != seam:
            self._drop(remainder_key(key, seam))
            return None
        return entry

    def put(self, key: str, entry: SegmentEntry) -> SegmentEntry:
        """Store ``entry``; returns it as a later ``get`` will give it (rounded to ``entry_dtype``)."""
        return self._put(key, entry, key)

    def put_remainder(self, key: str, entry: RemainderEntry) -> RemainderEntry:
        if entry.derived:  # a view of its entry: nothing of its own to keep
            return entry
        return self._put(remainder_key(key, entry.seam), entry, key)

    def held_nbytes(self, key: str, cached: CachedSegment) -> int:
        """The bytes the store keeps for a segment it handed out under ``key`` (in ``entry_dtype``): its entry and
        stored remainder where a tier keeps them, nothing for what memory refused and no tier took (or that did
        not fit the dtype)."""
        held = cached.entry.nbytes_as(self.entry_dtype) if self._holds(key) else 0
        rest = cached.remainder
        if rest is not None and not rest.derived and self._holds(remainder_key(key, rest.seam)):
            held += rest.nbytes_as(self.entry_dtype)
        return held

    def _holds(self, key: str) -> bool:
        """Memory holds it, or its last write was taken by a persistent tier (which keeps it by its own rules)."""
        return key in self._memory or (key not in self._unkept and bool(self._tiers))

    def _get(self, key: str, token_ids: tuple[int, ...], kind: type[E], segment: str) -> E | None:
        """``segment``: the key of the segment the entry belongs to, which the admission policy counts once a
        lookup of the segment itself (a remainder's lookup follows its segment's: counted again, a segment with a
        stored remainder would weigh twice one whose remainders are derived)."""
        entry = self._memory.get(key, segment, count=kind is SegmentEntry)
        if entry is not None:
            if isinstance(entry, kind) and entry.token_ids == token_ids:
                self.counters["memory_hits"] += 1
                return self._widened(entry)
            self._memory.pop(key, "corrupt")
            self.counters["corrupt"] += 1
        faster: list[_Tier] = []
        for tier in self._tiers.values():
            found, data = self._read(tier, key, token_ids, kind)
            if found is not None:
                self.counters[f"{tier.name}_hits"] += 1
                self._memory.put(key, found, segment)
                for up in faster:  # promoted: the next lookup finds it nearer
                    self._call(up, lambda t, data=data: t.set(key, data))
                return self._widened(found)
            faster.append(tier)
        self.counters["misses"] += 1
        return None

    def _read(self, tier: _Tier, key: str, token_ids: tuple[int, ...], kind: type[E]) -> tuple[E | None, bytes]:
        data = self._call(tier, lambda t: t.get(key), corrupt=True)
        if data is None:
            return None, b""
        try:
            entry = kind.from_bytes(unseal(data, self.secret) if self.secret else data, self.fingerprint)
            if entry.token_ids != token_ids:
                raise CorruptEntry("token ids differ: a key collision")
            if self.layout is not None:
                self.layout.check(entry)
        except CorruptEntry:
            self.counters["corrupt"] += 1
            self._call(tier, lambda t: t.delete(key))
            return None, b""
        return (entry.to(self.device) if self.device.type != "cpu" else entry), data

    def _call(self, tier: _Tier, call: Any, *, corrupt: bool = False) -> Any:
        """``call(tier)``, or None while the tier is down or when it fails (counted, logged once, retried later)."""
        if time.monotonic() < tier.down_until:
            return None
        try:
            out = call(tier.tier)
            tier.reason = None
            return out
        except (PickledValue, ForeignPath, UnreadableKey):
            if corrupt:  # the tier deleted the record already; count it
                self.counters["corrupt"] += 1
            return None
        except Exception as exc:  # any failure of the tier: the request goes on without it
            self.counters["tier_errors"] += 1
            tier.down_until = time.monotonic() + self.retry_s
            tier.reason = f"{type(exc).__name__}: {exc}"
            if not tier.warned:
                tier.warned = True
                log.warning(
                    "segment cache %s tier failed (%s: %s); bypassing it for %.0f s",
                    tier.name,
                    type(exc).__name__,
                    exc,
                    self.retry_s,
                )
            return None

    def _drop(self, key: str) -> None:
        self.counters["corrupt"] += 1
        self._memory.pop(key, "corrupt")
        for tier in self._tiers.values():
            self._call(tier, lambda t: t.delete(key))

    def _put(self, key: str, entry: E, segment: str) -> E:
        stored = entry.stored_as(self.entry_dtype)
        if stored is not entry and not stored.finite():
            self.counters["unstorable"] += 1
            self._kept(key, False)
            return entry
        self.counters["writes"] += 1
        kept = self._memory.put(key, stored, segment)
        if self._tiers:
            data = stored.to_bytes(self.fingerprint)
            if self.secret:
                data = seal(data, self.secret)
            for tier in self._tiers.values():
                if not self._admits(tier, segment, len(data)):
                    self.counters[f"{tier.name}_refused"] += 1
                    continue
                kept |= bool(self._call(tier, lambda t: t.set(key, data) is not False))
        self._kept(key, kept)
        return self._widened(stored)

    def _admits(self, tier: _Tier, segment: str, nbytes: int) -> bool:
        """Whether ``tier`` takes a write of ``nbytes`` for ``segment``: the disk tier, under the value policy, only
        while it has room or for a segment looked up at least ``DISK_ADMIT_LOOKUPS`` times."""
        room = getattr(tier.tier, "has_room", None)
        if tier.name != "disk" or room is None or not self._memory.counts_lookups:
            return True
        if self._memory.frequency(segment) >= DISK_ADMIT_LOOKUPS:
            return True
        has = self._call(tier, lambda t: room(nbytes))
        return has is None or bool(has)  # a tier that is down refuses nothing: its write is skipped as down

    def _kept(self, key: str, kept: bool) -> None:
        self._unkept.pop(key, None)
        if not kept:
            self._unkept[key] = None
            if len(self._unkept) > UNKEPT_KEYS:
                self._unkept.popitem(last=False)

    def _widened(self, entry: E) -> E:
        return entry if self.entry_dtype == torch.float32 else entry.widened(self.model_dtype)

    def clear(self) -> None:
        self._memory.clear()
        for tier in self._tiers.values():
            self._call(tier, lambda t: t.clear())

    def __contains__(self, key: str) -> bool:
        return key in self._memory

    def memory_keys(self) -> list[str]:
        """The segment keys the memory tier holds (remainders aside), least recently used first: what a fleet's
        router learns a replica holds."""
        return [k for k, entry in self._memory.items() if isinstance(entry, SegmentEntry)]

    def hit_ratio_by_kind(self) -> dict[str, float]:
        """Per segment kind, the share of its entry lookups that some tier answered."""
        kinds = {kind for kind, _ in self.lookups}
        return {k: self.lookups[k, "hit"] / (self.lookups[k, "hit"] + self.lookups[k, "miss"]) for k in sorted(kinds)}

    def check_tiers(self) -> dict[str, str | None]:
        """Ask each persistent tier that can be asked (a ``check`` method: the shared tier's ping) whether it
        answers now; one that fails is bypassed as a failed lookup would be. ``tier_status`` after it."""
        for tier in self._tiers.values():
            if hasattr(tier.tier, "check"):
                self._call(tier, lambda t: t.check())
        return self.tier_status()

    def tier_status(self) -> dict[str, str | None]:
        """Each persistent tier's reason for being bypassed (its last failure), None for one in use; no call."""
        return {name: tier.reason for name, tier in self._tiers.items()}

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "memory_entries": len(self._memory),
            "memory_bytes": self._memory.used,
            "evictions": self._memory.evictions,
            "policy": self._memory.lru.policy,
            "admitted": self._memory.lru.admitted,
            "refused": dict(self._memory.lru.refused),
            "evicted": dict(self._memory.lru.evicted),
            "hit_ratio_by_kind": self.hit_ratio_by_kind(),
            **self.counters,
        }
        for tier in self._tiers.values():
            found = self._call(tier, lambda t: t.stats())
            out[tier.name] = found if found is not None else {"available": False}
        return out
