"""One bad key is a miss for that key alone: a Redis key of another type (``WRONGTYPE`` is a reply, not a
connection fault) or a disk row that cannot be read is dropped and rewritten, and the tier stays on for every
other key. Against a real redis-server on loopback."""

from __future__ import annotations

import sqlite3

import pytest
import torch

from hypic_rag.cache import segment_key
from hypic_rag.cache.ownership import SUBFOLDER
from hypic_rag.cache.remote import PREFIX
from hypic_rag.testing.redis import RedisServer

from .conftest import DOCS, QUESTION, engine, same, segments


@pytest.fixture
def redis_url(tmp_path):
    with RedisServer(tmp_path / "redis") as server:
        yield server.url


def _ask(reader, docs=DOCS):
    out = reader.generate(segments(docs), QUESTION, max_new_tokens=1)
    if reader.segment_store.remote is not None:
        reader.segment_store.remote.flush()
    return out


def _key(reader, doc=DOCS[1]) -> str:
    return segment_key(reader.segment_ids(segments([doc])[0]), reader.fingerprint, torch.float32)


def test_a_wrongly_typed_redis_key_is_one_miss_then_rewritten(redis_url, oracle):
    writer = engine(cache_url=redis_url)
    _ask(writer)
    client = writer.segment_store.remote.client
    key = PREFIX + _key(writer)
    client.delete(key)
    client.rpush(key, b"x")
    for round_ in range(4):  # fresh engines, as replicas or restarts would be
        out = _ask(engine(cache_url=redis_url))
        assert out.stats["tier_errors"] == 0, round_
        assert same(out.prompt_logits, oracle())
        if round_ == 0:  # the bad key alone missed, and was dropped and rewritten
            assert out.stats["corrupt"] == 1 and out.stats["miss_segments"] == 1 and out.stats["remote_hits"] >= 2
        else:
            assert out.stats["corrupt"] == 0 and out.stats["hit_segments"] == 3
    assert client.type(key) == b"string"


def test_other_reply_errors_of_one_key_leave_the_tier_on(redis_url, oracle):
    writer = engine(cache_url=redis_url)
    _ask(writer)
    client = writer.segment_store.remote.client
    for doc, make in zip(DOCS, (client.sadd, client.lpush, lambda k, v: client.hset(k, "f", v)), strict=True):
        key = PREFIX + _key(writer, doc)
        client.delete(key)
        make(key, b"x")
    out = _ask(engine(cache_url=redis_url))
    assert out.stats["tier_errors"] == 0 and out.stats["corrupt"] >= 3 and same(out.prompt_logits, oracle())
    assert _ask(engine(cache_url=redis_url), DOCS[::-1]).stats["hit_segments"] == 3


@pytest.mark.parametrize("damage", ["an integer value", "a text value", "a folder for its file", "an unknown mode"])
def test_an_unreadable_disk_row_is_one_miss_then_rewritten(tmp_path, oracle, damage):
    folder = tmp_path / "cache"
    writer = engine(cache_dir=folder)
    _ask(writer)
    key = _key(writer)
    with sqlite3.connect(folder / SUBFOLDER / "cache.db") as db:
        (filename,) = db.execute("SELECT filename FROM Cache WHERE key=?", (key,)).fetchone()
        if damage == "an integer value":
            db.execute("UPDATE Cache SET mode=0, filename=NULL, value=7 WHERE key=?", (key,))
        elif damage == "a text value":
            db.execute("UPDATE Cache SET mode=0, filename=NULL, value='text' WHERE key=?", (key,))
        elif damage == "an unknown mode":
            db.execute("UPDATE Cache SET mode=9 WHERE key=?", (key,))
        else:
            (folder / SUBFOLDER / filename).unlink()
            (folder / SUBFOLDER / filename).mkdir()
    out = _ask(engine(cache_dir=folder))
    assert out.stats["tier_errors"] == 0 and out.stats["disk_hits"] >= 2 and out.stats["miss_segments"] == 1
    assert same(out.prompt_logits, oracle())
    again = _ask(engine(cache_dir=folder), DOCS[::-1])
    assert again.stats["tier_errors"] == 0 and again.stats["hit_segments"] == 3
