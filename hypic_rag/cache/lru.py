"""The memory tier of segments and of prefixes: values under a byte budget, kept least-recently-used or by value.

An engine has one budget for all its in-memory caches: each cache holds a ``Space`` of one ``ByteLRU`` (its
keys under its own prefix, its own counts), and eviction is across all of them.

``policy="lru"`` evicts the least recently used. ``policy="value"`` resists floods of one-off segments:

- admission (TinyLFU): a frequency sketch (``FrequencySketch``) counts every lookup; a new value that needs room
  is admitted only when its key has been looked up more often than every value it would push out, so a segment
  seen once cannot evict segments seen often, and is admitted once it recurs;
- eviction by value (GreedyDual-Size-Frequency): each value's priority is the clock plus its frequency times
  the prefill it saves (its ``prefill_tokens``, which prefill time is proportional to) over its bytes; the
  lowest goes first, and the clock rises to each evicted priority so that values not used lately age out.

Hand-written: the Python caches that implement TinyLFU (theine, cachebox) bound a count of entries, not bytes,
take no per-value cost, and cannot share one budget across several caches' spaces.
"""

from __future__ import annotations

import hashlib
import heapq
from collections import Counter, OrderedDict
from typing import Generic, Protocol, TypeVar

POLICIES = ("lru", "value")


class Sized(Protocol):
    @property
    def nbytes(self) -> int: ...


V = TypeVar("V", bound=Sized)


class FrequencySketch:
    """TinyLFU's count-min sketch: ``depth`` rows of 4-bit counters (saturating at 15), every counter halved
    after ``10 * width`` increments, so that frequencies follow what is popular now, in fixed memory."""

    def __init__(self, width: int = 1 << 14, depth: int = 4) -> None:
        if width < 1 or width & (width - 1):
            raise ValueError(f"the sketch width is a power of two, got {width}")
        self.rows = [bytearray(width) for _ in range(depth)]
        self.mask = width - 1
        self.samples, self.period = 0, 10 * width

    def _slots(self, key: str) -> list[int]:
        digest = hashlib.blake2b(key.encode(), digest_size=4 * len(self.rows)).digest()
        return [int.from_bytes(digest[4 * r : 4 * r + 4], "little") & self.mask for r in range(len(self.rows))]

    def increment(self, key: str) -> None:
        for row, slot in zip(self.rows, self._slots(key), strict=True):
            if row[slot] < 15:
                row[slot] += 1
        self.samples += 1
        if self.samples >= self.period:
            self.rows = [bytearray(c >> 1 for c in row) for row in self.rows]
            self.samples //= 2

    def estimate(self, key: str) -> int:
        return min(row[slot] for row, slot in zip(self.rows, self._slots(key), strict=True))


def _density(value: Sized, size: int) -> float:
    """The prefill a value saves per byte it holds; values that do not say how much, 1 per byte."""
    tokens = getattr(value, "prefill_tokens", None)
    return (tokens if tokens else 1) / max(size, 1)


def check_memory(budget: int, policy: str) -> None:
    """A memory tier's budget (``memory_bytes``) and policy (``cache_policy``), or a ``ValueError`` naming them."""
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
        raise ValueError(f"memory_bytes (the memory budget) must be an integer >= 0 bytes, got {budget!r}")
    if policy not in POLICIES:
        raise ValueError(f"unknown cache_policy {policy!r}; expected one of {', '.join(POLICIES)}")


class ByteLRU(Generic[V]):
    """A value larger than the whole budget is not kept; inserting evicts by ``policy`` (``POLICIES``).

    ``seen_as`` (on ``get`` and ``put``) is the key the frequency sketch counts, where several values belong to
    one thing that recurs (a segment's entry and its remainders)."""

    def __init__(self, budget: int, policy: str = "lru") -> None:
        check_memory(budget, policy)
        self.budget = budget
        self.policy = policy
        self.used = 0
        self.evicted: Counter[str] = Counter()  # by reason: "capacity" (room for another value), "corrupt"
        self.refused: Counter[str] = Counter()  # by reason: "frequency" (not admitted), "oversize"
        self.admitted = 0
        self._items: OrderedDict[str, tuple[V, int]] = OrderedDict()
        self._spaces: dict[str, list[int]] = {}  # space -> [entries, bytes]
        self.sketch = FrequencySketch() if policy == "value" else None
        self.clock = 0.0  # GreedyDual's inflation: the priority of the last value evicted
        self._row: dict[str, int] = {}  # key -> the order of its one live heap row
        self._seen: dict[str, str] = {}
        self._heap: list[tuple[float, int, str]] = []  # (priority, order, key); rows not in _row are stale
        self._order = 0

    @property
    def evictions(self) -> int:
        return self.evicted["capacity"]

    def space(self, name: str) -> Space[V]:
        """A view of this LRU for one cache: keys under ``name``, counted apart, evicted with all the others."""
        if not name or "/" in name:
            raise ValueError(f"a space name is non-empty and has no '/', got {name!r}")
        return Space(self, name + "/")

    def _count(self, key: str, size: int, sign: int) -> None:
        at = key.find("/")
        if at > 0:
            counts = self._spaces.setdefault(key[: at + 1], [0, 0])
            counts[0] += sign
            counts[1] += sign * size

    def usage(self, prefix: str) -> tuple[int, int]:
        """Entries and bytes held under ``prefix``."""
        counts = self._spaces.get(prefix, (0, 0))
        return counts[0], counts[1]

    def frequency(self, key: str) -> int:
        """How often ``key`` was looked up lately, as the sketch estimates it (0 under ``lru``)."""
        return self.sketch.estimate(key) if self.sketch is not None else 0

    def _rank(self, key: str, value: V, size: int) -> None:
        priority = self.clock + max(self.frequency(self._seen[key]), 1) * _density(value, size)
        self._order += 1
        self._row[key] = self._order
        heapq.heappush(self._heap, (priority, self._order, key))
        if len(self._heap) > 4 * len(self._items) + 64:  # drop the stale rows
            self._heap = [(p, o, k) for p, o, k in self._heap if self._row.get(k) == o]
            heapq.heapify(self._heap)

    def note(self, key: str) -> None:
        """Count a lookup of ``key`` without reading it: a value not yet kept that a caller wanted."""
        if self.sketch is not None:
            self.sketch.increment(key)

    def get(self, key: str, seen_as: str | None = None, count: bool = True) -> V | None:
        """The value, now most recently used (or ranked higher); None when absent. Counts the lookup unless
        ``count`` is False (a second lookup of the same thing, which must not weigh twice)."""
        if self.sketch is not None and count:
            self.sketch.increment(seen_as or key)
        item = self._items.get(key)
        if item is None:
            return None
        self._items.move_to_end(key)
        if self.sketch is not None:
            self._rank(key, *item)
        return item[0]

    def put(self, key: str, value: V, seen_as: str | None = None) -> bool:
        """Keep ``value`` under ``key`` if the policy admits it; whether it did."""
        self.pop(key)
        size = value.nbytes
        if size > self.budget:
            self.refused["oversize"] += 1
            return False
        if self.sketch is not None and not self._make_room(seen_as or key, size):
            self.refused["frequency"] += 1
            return False
        self.admitted += 1
        self._items[key] = (value, size)
        self.used += size
        self._count(key, size, 1)
        if self.sketch is not None:
            self._seen[key] = seen_as or key
            self._rank(key, value, size)
        while self.used > self.budget:  # lru; the value policy made room already
            self.pop(next(iter(self._items)), "capacity")
        return True

    def _make_room(self, seen_as: str, size: int) -> bool:
        """Evict the lowest-priority values until ``size`` bytes fit, if the newcomer was looked up more often
        than each of them; else evict nothing and refuse it."""
        victims: list[tuple[float, int, str]] = []
        freed = self.budget - self.used
        while freed < size and self._heap:
            row = heapq.heappop(self._heap)
            if self._row.get(row[2]) == row[1] and row[2] in self._items:
                victims.append(row)
                freed += self._items[row[2]][1]
        frequency = self.frequency(seen_as)
        others = [k for _, _, k in victims if self._seen[k] != seen_as]  # not its own other parts
        if freed < size or any(frequency <= self.frequency(self._seen[k]) for k in others):
            for row in victims:
                heapq.heappush(self._heap, row)
            return False
        for priority, _, k in victims:
            self.clock = max(self.clock, priority)
            self.pop(k, "capacity")
        return True

    def pop(self, key: str, reason: str | None = None) -> None:
        """Forget ``key``; a ``reason`` counts it as an eviction for that reason."""
        item = self._items.pop(key, None)
        if item is not None:
            if reason is not None:
                self.evicted[reason] += 1
            self.used -= item[1]
            self._count(key, item[1], -1)
            self._row.pop(key, None)
            self._seen.pop(key, None)

    def clear(self, prefix: str = "") -> None:
        """Forget every value, or only those whose key starts with ``prefix``."""
        if not prefix:
            self._items.clear()
            self._spaces.clear()
            self._row.clear()
            self._seen.clear()
            self._heap.clear()
            self.used = 0
            return
        for key in [k for k in self._items if k.startswith(prefix)]:
            self.pop(key)

    def __contains__(self, key: str) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def items_under(self, prefix: str) -> list[tuple[str, V]]:
        """The keys under ``prefix`` (without it) and their values, least recently used first."""
        return [(k[len(prefix) :], v) for k, (v, _) in self._items.items() if k.startswith(prefix)]


class Space(Generic[V]):
    """One cache's share of a ``ByteLRU``: the same operations, on its own keys."""

    def __init__(self, lru: ByteLRU[V], prefix: str) -> None:
        self.lru, self.prefix = lru, prefix

    def note(self, key: str) -> None:
        self.lru.note(self.prefix + key)

    def get(self, key: str, seen_as: str | None = None, count: bool = True) -> V | None:
        return self.lru.get(self.prefix + key, self.prefix + (seen_as or key), count)

    def put(self, key: str, value: V, seen_as: str | None = None) -> bool:
        return self.lru.put(self.prefix + key, value, self.prefix + (seen_as or key))

    def pop(self, key: str, reason: str | None = None) -> None:
        self.lru.pop(self.prefix + key, reason)

    def clear(self) -> None:
        self.lru.clear(self.prefix)

    def __contains__(self, key: str) -> bool:
        return self.prefix + key in self.lru

    def items(self) -> list[tuple[str, V]]:
        return self.lru.items_under(self.prefix)

    @property
    def counts_lookups(self) -> bool:
        """Whether the LRU's policy keeps a frequency sketch (``value``; not ``lru``)."""
        return self.lru.sketch is not None

    def frequency(self, key: str) -> int:
        """How often ``key`` of this space was looked up lately (the sketch's estimate; 0 under ``lru``)."""
        return self.lru.frequency(self.prefix + key)

    def __len__(self) -> int:
        return self.lru.usage(self.prefix)[0]

    @property
    def used(self) -> int:
        return self.lru.usage(self.prefix)[1]

    @property
    def budget(self) -> int:
        return self.lru.budget

    @property
    def evictions(self) -> int:
        return self.lru.evictions


def memory_space(memory: ByteLRU | Space | int, name: str) -> Space:
    """A cache's memory: a space of a shared LRU, or of an LRU of its own of ``memory`` bytes."""
    if isinstance(memory, Space):
        return memory
    if isinstance(memory, ByteLRU):
        return memory.space(name)
    return ByteLRU(memory).space(name)
