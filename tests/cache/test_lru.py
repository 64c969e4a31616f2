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


def test_spaces_share_one_budget_and_count_apart():
    lru: ByteLRU[Blob] = ByteLRU(100)
    segments, prefixes = lru.space("segment"), lru.space("prefix")
    segments.put("a", Blob(40))
    prefixes.put("a", Blob(40))  # the same key in another space is another value
    assert "a" in segments and "a" in prefixes and len(segments) == len(prefixes) == 1
    segments.put("b", Blob(40))  # over budget: the least recently used of either space goes
    assert "a" not in segments and "a" in prefixes and lru.used == 80
    assert (len(segments), segments.used, len(prefixes), prefixes.used) == (1, 40, 1, 40)
    prefixes.clear()
    assert len(prefixes) == 0 and "b" in segments and lru.used == 40
    with pytest.raises(ValueError, match="space name"):
        lru.space("a/b")
