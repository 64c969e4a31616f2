from __future__ import annotations

from dataclasses import dataclass

import pytest

from hypic_rag.cache.lru import ByteLRU, FrequencySketch


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


@dataclass
class Entry:
    nbytes: int
    prefill_tokens: int


def _seen(lru: ByteLRU, key: str, times: int) -> None:
    for _ in range(times):
        lru.get(key)


def test_a_one_off_value_is_refused_under_pressure_and_admitted_once_it_recurs():
    lru: ByteLRU[Entry] = ByteLRU(100, "value")
    for key in "ab":
        _seen(lru, key, 3)
        assert lru.put(key, Entry(50, 50))  # room: admitted whatever its count
    lru.get("once")
    assert not lru.put("once", Entry(50, 50))  # needs room, seen once: b and a stay
    assert "once" not in lru and "a" in lru and "b" in lru and lru.refused["frequency"] == 1
    _seen(lru, "often", 4)
    assert lru.put("often", Entry(50, 50))  # seen more often than the one it pushes out
    assert "often" in lru and lru.used == 100 and lru.evicted["capacity"] == 1
    assert lru.refused["frequency"] == 1 and lru.admitted == 3


def test_eviction_weighs_the_prefill_a_value_saves_per_byte():
    lru: ByteLRU[Entry] = ByteLRU(100, "value")
    for key, tokens in (("cheap", 5), ("dear", 500)):
        _seen(lru, key, 2)
        lru.put(key, Entry(50, tokens))
    _seen(lru, "new", 3)
    assert lru.put("new", Entry(50, 50))
    assert "cheap" not in lru and "dear" in lru  # equally frequent: the one that saves less per byte went


def test_the_value_policy_keeps_the_budget_and_its_counts_under_churn():
    lru: ByteLRU[Entry] = ByteLRU(100, "value")
    space = lru.space("s")
    for i in range(300):
        key = f"k{(i * 7) % 11}"
        space.get(key)
        space.put(key, Entry(30 + i % 20, 10 + i % 5))
        assert space.used == lru.used <= 100 and len(space) == len(lru)
    assert lru.evicted["capacity"] > 0 and lru.refused["frequency"] > 0
    with pytest.raises(ValueError, match="unknown cache_policy 'lfu'"):
        ByteLRU(10, "lfu")


def test_the_sketch_counts_and_ages():
    sketch = FrequencySketch(width=64)
    for _ in range(20):
        sketch.increment("hot")
    sketch.increment("cold")
    assert sketch.estimate("hot") == 15 and sketch.estimate("cold") >= 1 and sketch.estimate("never") <= 1
    for i in range(640):  # a period of other keys halves every counter
        sketch.increment(f"x{i}")
    assert sketch.estimate("hot") < 15


def test_a_noted_lookup_counts_for_admission():
    lru: ByteLRU[Entry] = ByteLRU(50, "value")
    lru.get("old")
    lru.put("old", Entry(50, 50))
    for _ in range(2):
        lru.space("p").note("new")  # wanted twice, never read: a prefix chain that recurs
    assert lru.space("p").put("new", Entry(50, 50)) and "old" not in lru


def test_a_hot_value_keeps_one_live_heap_row_and_each_victim_counts_once():
    lru: ByteLRU[Entry] = ByteLRU(100, "value")
    lru.put("hot", Entry(50, 50))
    lru.put("warm", Entry(50, 50))
    for _ in range(500):  # its frequency saturates and the clock stands still: every row has one priority
        lru.get("hot")
    assert len(lru._heap) <= 4 * len(lru) + 64  # stale rows are dropped, not kept and re-sorted on every get
    assert lru.put("hot-part", Entry(100, 500), seen_as="hot")  # needs both out: each evicted once
    assert list(lru._items) == ["hot-part"] and lru.used == 100 and lru.evicted["capacity"] == 2
