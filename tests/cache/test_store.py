"""The memory and disk tiers: round trips, budgets, and what happens to bad entries."""

from __future__ import annotations

import pickle

import diskcache
import pytest
import torch

from hypic_rag import Engine, Segment
from hypic_rag.cache import DiskCacheTier, EntryLayout, PickledValue, SegmentStore, segment_key
from hypic_rag.cache.keys import entry_fingerprint
from hypic_rag.cache.lru import ByteLRU

from .test_entry import assert_same, make_entry, make_remainder


def test_memory_tier_returns_the_entry_it_was_given():
    store = SegmentStore("fp")
    entry = make_entry()
    store.put("k", entry)
    assert store.get("k", entry.token_ids) is entry
    assert store.get("k", (1, 2)) is None  # same key, other ids: a collision is a miss
    assert store.counters["corrupt"] == 1


def test_memory_budget_evicts_least_recently_used():
    a, b, c = make_entry(1), make_entry(2), make_entry(3)
    store = SegmentStore("fp", memory=2 * a.nbytes)
    store.put("a", a)
    store.put("b", b)
    store.get("a", a.token_ids)
    store.put("c", c)
    assert "a" in store and "c" in store and "b" not in store
    assert store.stats()["memory_bytes"] <= 2 * a.nbytes and store.stats()["evictions"] == 1


def test_disk_tier_round_trip_is_bit_exact(tmp_path):
    entry = make_entry()
    SegmentStore("fp", disk=DiskCacheTier(tmp_path)).put("k", entry)
    fresh = SegmentStore("fp", disk=DiskCacheTier(tmp_path))  # a new process would start like this
    got = fresh.get("k", entry.token_ids)
    assert got is not None and fresh.counters["disk_hits"] == 1
    assert_same(got, entry)
    assert fresh.get("k", entry.token_ids) is got  # promoted to memory


def test_remainders_of_several_seams_live_beside_one_entry(tmp_path):
    entry, two, three = make_entry(), make_remainder(1, seam=2), make_remainder(2, seam=3)
    store = SegmentStore("fp", disk=DiskCacheTier(tmp_path))
    store.put("k", entry)
    store.put_remainder("k", two)
    store.put_remainder("k", three)
    assert store.get("k", entry.token_ids) is entry
    assert store.get_remainder("k", entry.token_ids, 2) is two and store.get_remainder("k", entry.token_ids, 3) is three
    assert store.get_remainder("k", entry.token_ids, 5) is None
    fresh = SegmentStore("fp", disk=DiskCacheTier(tmp_path))
    assert_same(fresh.get_remainder("k", entry.token_ids, 3), three)
    assert_same(fresh.get("k", entry.token_ids), entry)
    assert fresh.counters["disk_hits"] == 2 and fresh.counters["corrupt"] == 0


def test_disk_tier_refuses_values_that_are_not_bytes(tmp_path):
    tier = DiskCacheTier(tmp_path)
    with pytest.raises(ValueError, match="bytes only"):
        tier.set("k", {"not": "bytes"})  # type: ignore[arg-type]


class Tripwire:
    """Unpickling this would flip the flag: the store must never do it."""

    fired = False

    def __reduce__(self):
        return (Tripwire._fire, ())

    @staticmethod
    def _fire():
        Tripwire.fired = True
        return "pwned"


def test_a_pickled_value_in_the_disk_tier_is_refused_and_dropped(tmp_path):
    tier = DiskCacheTier(tmp_path)
    tier.stats()  # its folder made
    with diskcache.Cache(str(tier.folder)) as plain:
        plain.set("k", Tripwire())  # what a default diskcache.Cache writes: a pickle
    with pytest.raises(PickledValue):
        tier.get("k")
    store = SegmentStore("fp", disk=tier)
    with diskcache.Cache(str(tier.folder)) as plain:
        plain.set("k2", Tripwire())
    assert store.get("k2", (1,)) is None and store.counters["corrupt"] == 1
    assert not Tripwire.fired
    assert tier.get("k2") is None  # deleted
    assert pickle.dumps(1)  # pickle itself is untouched; only the tier refuses it


def test_a_corrupted_disk_entry_is_recomputed_and_the_answer_is_still_right(checkpoint, tmp_path):
    path = checkpoint("qwen3_next")
    segs = [Segment(token_ids=list(range(10 + 7 * i, 50 + 7 * i))) for i in range(3)]
    query = Segment(token_ids=[3, 4, 5], kind="query")
    writer = Engine.from_pretrained(path, cache_dir=tmp_path, min_cached_tokens=0)
    expected = writer.prompt_logits(segs, query, mode="hypic")
    tier = DiskCacheTier(tmp_path)
    key = segment_key(segs[1].token_ids, writer.fingerprint, torch.float32)
    data = tier.get(key)
    assert data is not None
    tier.set(key, data[:-100] + bytes(100))  # zero the tail of one entry
    reader = Engine.from_pretrained(path, cache_dir=tmp_path, min_cached_tokens=0)
    out = reader.generate(segs, query, mode="hypic", max_new_tokens=1)
    counters = reader.segment_store.counters
    # Segment 0's entry and segment 2's entry and remainder come from disk; segment 1's entry is corrupt.
    assert counters["corrupt"] == 1 and counters["disk_hits"] == 3
    assert out.stats["hit_segments"] == 2 and out.stats["miss_segments"] == 1
    # recomputed alone where the writer prefilled the three together: the same up to this CPU's fp32 rounding,
    # which a zeroed tail (or any read of it) would be far outside
    torch.testing.assert_close(reader.prompt_logits(segs, query, mode="hypic"), expected, rtol=0, atol=1e-4)


_WORKER = """
import sys, torch
from hypic_rag.cache import AttentionEntry, DiskCacheTier, SegmentEntry, SegmentStore

def entry(seed):
    gen = torch.Generator().manual_seed(seed)
    e = SegmentEntry((seed, 1, 2))
    e.attention[1] = AttentionEntry(torch.randn(2, 64, 16, generator=gen), torch.randn(2, 64, 16, generator=gen))
    return e

directory, worker = sys.argv[1], int(sys.argv[2])
tier = DiskCacheTier(directory)
for r in range(20):
    SegmentStore("fp", disk=tier).put(f"k{r % 4}", entry(r % 4))
    seed = (r + worker) % 4
    got = SegmentStore("fp", disk=tier).get(f"k{seed}", (seed, 1, 2))
    if got is not None and not torch.equal(got.attention[1].keys, entry(seed).attention[1].keys):
        sys.exit(3)
"""


def test_several_processes_share_the_disk_tier(tmp_path):
    import subprocess
    import sys

    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, str(tmp_path), str(w)]) for w in range(3)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0, 0]
    store = SegmentStore("fp", disk=DiskCacheTier(tmp_path))
    for seed in range(4):
        got = store.get(f"k{seed}", (seed, 1, 2))
        assert got is not None
        gen = torch.Generator().manual_seed(seed)
        assert torch.equal(got.attention[1].keys, torch.randn(2, 64, 16, generator=gen))
    assert store.counters["corrupt"] == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_entries_of_every_dtype_round_trip_through_disk_validated(tmp_path, dtype):
    entry, rest = make_entry(dtype=torch.float32), make_remainder()
    fp = entry_fingerprint("fp", dtype)
    layout = EntryLayout(
        ((0, (("b", (4, 16, 8)), ("p", (4, 16, 16)), ("conv_tail", (72, 3)))),),
        (1,),
        2,
        16,
        400,
        frozenset({torch.float32, dtype}),
    )
    writer = SegmentStore(fp, disk=DiskCacheTier(tmp_path), entry_dtype=dtype, layout=layout)
    given = writer.put("k", entry)
    writer.put_remainder("k", rest)
    assert given.linear[0].b.dtype == torch.float32  # handed out in the compute dtype
    assert writer.stats()["memory_bytes"] == entry.nbytes_as(dtype) + rest.nbytes_as(dtype)
    reader = SegmentStore(fp, disk=DiskCacheTier(tmp_path), entry_dtype=dtype, layout=layout)
    got, got_rest = reader.get("k", entry.token_ids), reader.get_remainder("k", entry.token_ids, rest.seam)
    assert reader.counters["disk_hits"] == 2 and reader.counters["corrupt"] == 0
    assert_same(got, given)
    assert torch.equal(got_rest.linear[0].p, rest.linear[0].p.to(dtype).float())
    other = torch.bfloat16 if dtype != torch.bfloat16 else torch.float16
    stranger = SegmentStore(entry_fingerprint("fp", other), disk=DiskCacheTier(tmp_path), entry_dtype=other)
    assert stranger.get("k", entry.token_ids) is None  # another dtype's entry is never read as this one's
    assert stranger.counters["corrupt"] == 1


def test_a_tampered_16_bit_entry_on_disk_is_dropped(tmp_path):
    entry = make_entry(dtype=torch.float32)
    fp = entry_fingerprint("fp", torch.bfloat16)
    tier = DiskCacheTier(tmp_path)
    SegmentStore(fp, disk=tier, entry_dtype=torch.bfloat16).put("k", entry)
    cache = diskcache.Cache(str(tier.folder))
    data = bytearray(cache.get("k"))
    data[-3] ^= 0xFF
    cache.set("k", bytes(data))
    cache.close()
    fresh = SegmentStore(fp, disk=DiskCacheTier(tmp_path), entry_dtype=torch.bfloat16)
    assert fresh.get("k", entry.token_ids) is None and fresh.counters["corrupt"] == 1


def test_a_float16_entry_out_of_range_is_not_stored_and_used_as_computed():
    entry = make_entry(dtype=torch.float32)
    entry.linear[0].b[0, 0, 0] = 1e6
    store = SegmentStore(entry_fingerprint("fp", torch.float16), entry_dtype=torch.float16)
    assert store.put("k", entry) is entry
    assert "k" not in store and store.counters["unstorable"] == 1


def test_a_one_off_segment_is_refused_under_pressure_and_admitted_once_it_recurs():
    a, b, c = make_entry(1), make_entry(2), make_entry(3)
    store = SegmentStore("fp", memory=ByteLRU(2 * a.nbytes, "value"))
    for key, entry in (("a", a), ("b", b)):
        for _ in range(3):
            store.get(key, entry.token_ids, "document")
        store.put(key, entry)
    assert store.get("a", a.token_ids, "document") is a
    assert store.get("c", c.token_ids, "tool") is None
    assert store.put("c", c) is c  # handed back to its request, but not kept: seen once, it needs room
    assert "c" not in store and "a" in store and "b" in store
    assert store.stats()["refused"] == {"frequency": 1}
    seen = store._memory.frequency("c")
    store.get_remainder("c", c.token_ids, 2)  # follows its segment's lookup in a request: not counted again
    assert store._memory.frequency("c") == seen
    for _ in range(4):  # it recurs
        store.get("c", c.token_ids)
    store.put("c", c)
    stats = store.stats()
    assert "c" in store and stats["evicted"] == {"capacity": 1} and stats["policy"] == "value"
    assert stats["hit_ratio_by_kind"] == {"document": 1 / 7, "tool": 0.0}


def _tokens_case(checkpoint, tmp_path, dtype: str = "float32"):
    """A qwen3_5_text engine on a disk cache whose first segments keep their tokens (under 22 tokens on this
    checkpoint) beside a dense one, and the logits a first request gets."""
    path = checkpoint("qwen3_5_text")
    segs = [Segment(token_ids=list(range(10 + 7 * i, 10 + 7 * i + n))) for i, n in enumerate((15, 18, 30))]
    query = Segment(token_ids=[3, 4, 5], kind="query")
    writer = Engine.from_pretrained(path, cache_dir=tmp_path, min_cached_tokens=0, seam=4, entry_dtype=dtype)
    expected = writer.prompt_logits(segs, query, mode="hypic")
    return path, segs, query, writer, expected


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_entries_kept_as_tokens_round_trip_through_disk_validated(checkpoint, tmp_path, dtype):
    from hypic_rag.cache import LinearTokens

    path, segs, query, writer, expected = _tokens_case(checkpoint, tmp_path, dtype)
    reader = Engine.from_pretrained(path, cache_dir=tmp_path, min_cached_tokens=0, seam=4, entry_dtype=dtype)
    out = reader.generate(segs, query, mode="hypic", max_new_tokens=1)
    counters = reader.segment_store.counters
    # three entries and the dense segment's remainder; the others' remainders are derived, not read
    assert counters["disk_hits"] == 4 and counters["corrupt"] == 0 and out.stats["hit_segments"] == 3
    assert float((out.prompt_logits - expected).abs().max()) <= 1e-5
    key = segment_key(segs[1].token_ids, reader.fingerprint, torch.float32)
    entry = reader.segment_store.get(key, tuple(segs[1].token_ids))
    assert all(isinstance(e, LinearTokens) for e in entry.linear.values())


@pytest.mark.parametrize("damage", ["old format", "log gate above 0", "keys of another length"])
def test_an_old_or_damaged_entry_kept_as_tokens_is_recomputed_not_used(checkpoint, tmp_path, monkeypatch, damage):
    import hypic_rag.cache.entry as entry_module
    from hypic_rag.cache import SegmentEntry

    path, segs, query, writer, expected = _tokens_case(checkpoint, tmp_path)
    tier = DiskCacheTier(tmp_path)
    key = segment_key(segs[1].token_ids, writer.fingerprint, torch.float32)
    entry = SegmentEntry.from_bytes(tier.get(key), writer.fingerprint)
    layer = next(iter(entry.linear))
    if damage == "old format":
        monkeypatch.setattr(entry_module, "FORMAT_VERSION", entry_module.FORMAT_VERSION - 1)
    elif damage == "log gate above 0":
        entry.linear[layer].gates[0, 0, 0] = 0.5
    else:
        entry.linear[layer].keys = entry.linear[layer].keys[:, 1:]
    tier.set(key, entry.to_bytes(writer.fingerprint))  # well checksummed: only the format or the layout tells
    monkeypatch.undo()
    reader = Engine.from_pretrained(path, cache_dir=tmp_path, min_cached_tokens=0, seam=4)
    out = reader.generate(segs, query, mode="hypic", max_new_tokens=1)
    assert reader.segment_store.counters["corrupt"] == 1
    assert out.stats["hit_segments"] == 2 and out.stats["miss_segments"] == 1
    assert float((out.prompt_logits - expected).abs().max()) <= 1e-5  # recomputed alone, not in the first batch


def test_held_bytes_count_only_what_some_tier_kept(tmp_path):
    from hypic_rag.cache import CachedSegment

    a, b, rest = make_entry(1), make_entry(2), make_remainder(1, seam=2)
    store = SegmentStore("fp", memory=ByteLRU(2 * a.nbytes, "value"))
    for _ in range(3):
        store.get("a", a.token_ids, "document")
    store.put("a", a)
    store.put_remainder("a", rest)
    assert store.held_nbytes("a", CachedSegment(a, rest)) == a.nbytes + rest.nbytes
    store.put("b", b)  # seen once, no room: refused, and no other tier
    assert "b" not in store and store.held_nbytes("b", CachedSegment(b)) == 0
    with_disk = SegmentStore("fp", memory=ByteLRU(a.nbytes, "value"), disk=DiskCacheTier(tmp_path))
    for _ in range(3):
        with_disk.get("a", a.token_ids, "document")
    with_disk.put("a", a)
    with_disk.put("b", b)  # the memory tier refuses it; the disk tier keeps it
    assert "b" not in with_disk and with_disk.held_nbytes("b", CachedSegment(b)) == b.nbytes
    big = make_entry(3, dtype=torch.float32)
    big.linear[0].b[0, 0, 0] = 1e6  # past float16's range: kept nowhere, in any tier
    half = SegmentStore(entry_fingerprint("fp", torch.float16), entry_dtype=torch.float16, disk=DiskCacheTier(tmp_path))
    half.put("c", big)
    assert half.counters["unstorable"] == 1 and half.held_nbytes("c", CachedSegment(big)) == 0


def test_a_request_counts_in_cache_bytes_only_the_entries_kept(checkpoint):
    path = checkpoint("qwen3_5_text")
    segs = [Segment(token_ids=list(range(10 + 40 * i, 40 + 40 * i))) for i in range(3)]
    query = Segment(token_ids=[3, 4, 5], kind="query")
    roomy = Engine.from_pretrained(path, min_cached_tokens=0)
    everything = roomy.generate(segs, query, max_new_tokens=1).stats["cache_bytes"]
    # room for about one segment: the value policy keeps the first and refuses the others, seen once
    tight = Engine.from_pretrained(path, min_cached_tokens=0, memory_bytes=everything // 3 + 1)
    out = tight.generate(segs, query, max_new_tokens=1)
    held = tight.segment_store.stats()["memory_bytes"]
    assert out.stats["miss_segments"] == 3 and 0 < out.stats["cache_bytes"] <= held < everything


def test_a_full_disk_tier_takes_a_one_off_segment_only_once_it_recurs(tmp_path):
    entries = {name: make_entry(seed) for seed, name in enumerate("abc")}
    first = SegmentStore("fp", memory=ByteLRU(1, "value"), disk=DiskCacheTier(tmp_path))
    for name in "ab":  # while the disk has room it takes everything, seen once or not
        first.put(name, entries[name])
    full = DiskCacheTier(tmp_path, size_limit=first.stats()["disk"]["bytes"] + 1)  # no room for one more
    store = SegmentStore("fp", memory=ByteLRU(1, "value"), disk=full)  # memory too small to keep any
    # a request looks the segment up, misses and stores what it computed: seen once, the full disk refuses it
    assert store.get("c", entries["c"].token_ids, "document") is None
    store.put("c", entries["c"])
    assert store.counters["disk_refused"] == 1 and full.get("c") is None
    assert full.get("a") is not None and full.get("b") is not None  # nothing recurring was pushed out
    assert store.get("c", entries["c"].token_ids, "document") is None  # it recurs
    store.put("c", entries["c"])
    assert store.counters["disk_refused"] == 1 and full.get("c") is not None
    assert SegmentStore("fp", disk=full).get("c", entries["c"].token_ids) is not None
    plain = SegmentStore("fp", memory=ByteLRU(1, "lru"), disk=DiskCacheTier(tmp_path / "lru", size_limit=1))
    plain.put("c", entries["c"])  # under the lru policy the disk tier keeps its own LRU and takes every write
    assert plain.counters["disk_refused"] == 0


def test_a_write_an_off_or_failing_disk_did_not_take_is_neither_held_nor_refused(tmp_path):
    import time

    from hypic_rag.cache import CachedSegment

    tier = DiskCacheTier(tmp_path / "off")
    tier._off_until = time.monotonic() + 1e6  # what a nearly full disk does: the tier is off and drops writes
    store = SegmentStore("fp", memory=ByteLRU(1, "lru"), disk=tier)  # memory too small to keep anything
    entry = make_entry(0)
    store.put("a", entry)
    assert tier.get("a") is None and store.held_nbytes("a", CachedSegment(entry)) == 0

    flaky = DiskCacheTier(tmp_path / "flaky")
    real, calls = flaky.set, []

    def set_once_failing(key, value):
        calls.append(key)
        if len(calls) == 1:
            raise OSError("disk hiccup")
        return real(key, value)

    flaky.set = set_once_failing
    store = SegmentStore("fp", memory=ByteLRU(1 << 30, "value"), disk=flaky)
    for i, name in enumerate("abcd"):
        store.put(name, make_entry(i))
    assert store.counters["tier_errors"] == 1 and store.counters["disk_refused"] == 0  # down, not full
