"""The seal on persistent entries: made and checked with the deployment's secret, refused without it."""

from __future__ import annotations

import pytest

from hypic_rag.cache.entry import CorruptEntry
from hypic_rag.cache.seal import MAGIC, seal, secret_bytes, secret_id, unseal

SECRET = b"0123456789abcdef0123"


def test_a_sealed_entry_unseals_to_its_bytes_and_nothing_else_does():
    data = b"entry bytes" * 10
    sealed = seal(data, SECRET)
    assert sealed.startswith(MAGIC) and unseal(sealed, SECRET) == data
    for bad, message in (
        (data, "not sealed"),  # written without a secret
        (seal(data, b"another secret, 16+ bytes"), "not the cache secret's"),
        (sealed[:-1] + bytes([sealed[-1] ^ 1]), "not the cache secret's"),  # the bytes changed under the seal
        (sealed[: len(MAGIC) + 5], "not sealed"),
    ):
        with pytest.raises(CorruptEntry, match=message):
            unseal(bad, SECRET)


def test_a_secret_is_long_enough_and_named_without_being_shown():
    assert secret_bytes("x" * 16) == b"x" * 16
    for short in ("", "too short", b"15 bytes, short"):
        with pytest.raises(ValueError, match="at least 16 bytes"):
            secret_bytes(short)
    name = secret_id(SECRET)
    assert len(name) == 16 and name != secret_id(b"0123456789abcdef0124") and SECRET.hex()[:8] not in name


def test_the_disk_tier_holds_sealed_entries_and_refuses_others(tmp_path):
    from hypic_rag import Engine, Segment
    from hypic_rag.cache import segment_key

    docs = [Segment("Ana Lee lives in Oslo and works as a baker in a small shop."), Segment("Bo Ek lives in Rome.")]
    engine = Engine.from_pretrained(cache_dir=tmp_path, cache_secret=SECRET, min_cached_tokens=1)
    engine.generate(docs, "Where does Ana live?", max_new_tokens=1)
    disk = engine.segment_store.disk
    key = segment_key(engine.segment_ids(docs[0]), engine.fingerprint, engine.model.dtype)
    sealed = disk.get(key)
    assert sealed.startswith(MAGIC)
    disk.set(key, unseal(sealed, SECRET))  # the same bytes, unsealed: as one without the secret could write them
    reader = Engine.from_pretrained(cache_dir=tmp_path, cache_secret=SECRET, min_cached_tokens=1)
    out = reader.generate(docs[::-1], "Where does Ana live?", max_new_tokens=1)
    assert out.stats["corrupt"] == 1 and out.stats["disk_hits"] >= 1
