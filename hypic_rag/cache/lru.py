"""Least-recently-used values under a byte budget: the memory tier of segments and of prefixes."""

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
        if budget < 0:
            raise ValueError("the memory budget must be >= 0 bytes")
        self.budget = budget
        self.used = 0
        self.evictions = 0
        self._items: OrderedDict[str, tuple[V, int]] = OrderedDict()

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
        while self.used > self.budget:
            _, (_, old) = self._items.popitem(last=False)
            self.used -= old
            self.evictions += 1

    def pop(self, key: str) -> None:
        item = self._items.pop(key, None)
        if item is not None:
            self.used -= item[1]

    def clear(self) -> None:
        self._items.clear()
        self.used = 0

    def __contains__(self, key: str) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)
