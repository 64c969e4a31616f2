from __future__ import annotations

from dataclasses import dataclass

import pytest

from hypic_rag.cache.lru import ByteLRU


@dataclass
class Blob:
    nbytes: int


def test_least_recently_used_goes_first_and_oversized_values_are_not_kept():
    lru: ByteLRU[Blob] = ByteLRU(100)
    lru.put("a", Blob(40))
    lru.put("b", Blob(40))
    assert lru.get("a") is not None  # now b is the oldest
    lru.put("c", Blob(40))
    assert "a" in lru and "c" in lru and "b" not in lru
    assert lru.used == 80 and lru.evictions == 1
    lru.put("huge", Blob(101))
    assert "huge" not in lru and lru.used == 80
    lru.put("a", Blob(10))  # replacing a value re-counts its size
    assert lru.used == 50
    lru.clear()
    assert len(lru) == 0 and lru.used == 0
    with pytest.raises(ValueError, match=">= 0 bytes"):
        ByteLRU(-1)
