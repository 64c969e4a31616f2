"""Least-recently-used values under a byte budget: the memory tier of segments and of prefixes.

An engine has one budget for all its in-memory caches: each cache holds a ``Space`` of one ``ByteLRU`` (its
keys under its own prefix, its own counts), and eviction is across all of them, least recently used first.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, Protocol, TypeVar


class Sized(Protocol):
    @property
    def nbytes(self) -> int: ...


V = TypeVar("V", bound=Sized)


class ByteLRU(Generic[V]):
    """A value larger than the whole budget is not kept; inserting evicts the least recently used."""

    def __init__(self, budget: int) -> None:
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
            raise ValueError(f"memory_bytes (the memory budget) must be an integer >= 0 bytes, got {budget!r}")
        self.budget = budget
        self.used = 0
        self.evictions = 0
        self._items: OrderedDict[str, tuple[V, int]] = OrderedDict()
        self._spaces: dict[str, list[int]] = {}  # space -> [entries, bytes]

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

    def get(self, key: str) -> V | None:
        """The value, now most recently used; None when absent."""
        item = self._items.get(key)
        if item is None:
            return None
        self._items.move_to_end(key)
        return item[0]

    def put(self, key: str, value: V) -> None:
        self.pop(key)
        size = value.nbytes
        if size > self.budget:
            return
        self._items[key] = (value, size)
        self.used += size
        self._count(key, size, 1)
        while self.used > self.budget:
            old_key, (_, old) = self._items.popitem(last=False)
            self.used -= old
            self._count(old_key, old, -1)
            self.evictions += 1

    def pop(self, key: str) -> None:
        item = self._items.pop(key, None)
        if item is not None:
            self.used -= item[1]
            self._count(key, item[1], -1)

    def clear(self, prefix: str = "") -> None:
        """Forget every value, or only those whose key starts with ``prefix``."""
        if not prefix:
            self._items.clear()
            self._spaces.clear()
            self.used = 0
            return
        for key in [k for k in self._items if k.startswith(prefix)]:
            self.pop(key)

    def __contains__(self, key: str) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)


class Space(Generic[V]):
    """One cache's share of a ``ByteLRU``: the same operations, on its own keys."""

    def __init__(self, lru: ByteLRU[V], prefix: str) -> None:
        self.lru, self.prefix = lru, prefix

    def get(self, key: str) -> V | None:
        return self.lru.get(self.prefix + key)

    def put(self, key: str, value: V) -> None:
        self.lru.put(self.prefix + key, value)

    def pop(self, key: str) -> None:
        self.lru.pop(self.prefix + key)

    def clear(self) -> None:
        self.lru.clear(self.prefix)

    def __contains__(self, key: str) -> bool:
        return self.prefix + key in self.lru

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
