"""An engine's caches open from its cache settings in one place: the tiers asked for, the memory budget, and entries
filed under a fingerprint that a secret or an entry dtype changes."""

from __future__ import annotations

from hypic_rag import Engine
from hypic_rag.cache.stores import open_stores
from hypic_rag.settings import CacheSettings


def test_the_tiers_asked_for_and_a_sealed_or_narrower_entry_filed_apart(tmp_path):
    model = Engine.from_pretrained().model
    plain = open_stores(CacheSettings(memory_bytes=1 << 20), model, "weights")
    assert plain.memory.budget == 1 << 20 and plain.segments.disk is None and plain.segments.remote is None
    sealed = open_stores(CacheSettings(cache_dir=tmp_path, cache_secret="k" * 16), model, "weights")
    narrow = open_stores(CacheSettings(entry_dtype="bfloat16"), model, "weights")
    assert len({plain.fingerprint, sealed.fingerprint, narrow.fingerprint}) == 3
    assert sealed.segments.disk is not None and "+sealed:" in sealed.fingerprint and "+sealed:" not in plain.fingerprint
