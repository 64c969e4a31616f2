"""The disk tier and the space it has: its budget defaults to a share of the free space (so a small volume never
fills), a nearly full disk turns it off with a warning and the engine answers from memory (no failed open, no
index written into the last bytes), and what a killed writer left is swept: only the tier's own files, old ones.
The free space is what ``shutil.disk_usage`` reports, replaced here by a small volume's figures."""

from __future__ import annotations

import os
import shutil
from collections import namedtuple

import pytest

from hypic_rag.cache import DiskCacheTier
from hypic_rag.cache.ownership import SUBFOLDER

from .conftest import QUESTION, engine, same, segments

Usage = namedtuple("Usage", "total used free")
GiB = 1 << 30


@pytest.fixture
def free_space(monkeypatch):
    """``free_space(n)``: every disk reports ``n`` bytes free."""

    def report(n: int) -> None:
        monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(n * 4, n * 3, n))

    return report


@pytest.mark.parametrize(("free", "budget"), [(1 * GiB, GiB // 10), (40 * GiB, 4 * GiB), (500 * GiB, 8 * GiB)])
def test_the_default_budget_is_a_tenth_of_the_free_space_up_to_8_gib(tmp_path, free_space, free, budget):
    free_space(free)
    tier = DiskCacheTier(tmp_path / "cache")
    assert abs(tier.stats()["size_limit"] - budget) <= budget // 1000
    assert DiskCacheTier(tmp_path / "other", 12345).stats()["size_limit"] == 12345  # given: kept


def test_a_nearly_full_disk_serves_from_memory_with_a_warning(tmp_path, free_space, oracle, caplog):
    free_space(92 << 10)
    folder = tmp_path / "cache"
    reader = engine(cache_dir=folder)
    with caplog.at_level("WARNING", logger="hypic_rag.cache"):
        first = reader.generate(segments(), QUESTION, max_new_tokens=1)
        second = reader.generate(segments(), QUESTION, max_new_tokens=1)
    assert first.stats["tier_errors"] == 0 and same(first.prompt_logits, oracle())
    assert second.stats["hit_segments"] == 3 and second.stats["disk_hits"] == 0  # from memory
    warned = [r.message for r in caplog.records if "free" in r.message]
    assert len(warned) == 1 and "memory" in warned[0]
    assert not (folder / SUBFOLDER / "cache.db").exists()  # the last bytes are left to others
    assert reader.segment_store.stats()["disk"]["available"] is False


def _old(path) -> None:
    os.utime(path, (1, 1))


def test_what_a_killed_writer_left_is_swept_and_nothing_else(tmp_path):
    folder = tmp_path / "cache"
    engine(cache_dir=folder).generate(segments(), QUESTION, max_new_tokens=1)
    own = folder / SUBFOLDER
    partial = own / "ab" / "cd" / ("1" * 28 + ".val")
    fresh = own / "ab" / "cd" / ("2" * 28 + ".val")  # a live writer's, its row not yet committed
    partial.parent.mkdir(parents=True, exist_ok=True)
    partial.write_bytes(b"half")
    fresh.write_bytes(b"being written")
    _old(partial)
    outside = tmp_path / "precious.val"
    outside.write_bytes(b"precious")
    linked = own / "ab" / "cd" / ("3" * 28 + ".val")
    linked.symlink_to(outside)
    foreign = [own / "notes.txt", own / "zz" / "yy" / ("4" * 28 + ".val"), own / "ab" / "readme"]
    for file in foreign:
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text("mine")
        _old(file)
    engine(cache_dir=folder).generate(segments(), QUESTION, max_new_tokens=1)
    assert not partial.exists()
    assert fresh.exists() and linked.is_symlink() and outside.read_bytes() == b"precious"
    assert all(file.read_text() == "mine" for file in foreign)


def test_a_write_the_disk_runs_out_on_leaves_no_partial_file(tmp_path):
    """A full disk fails a value file's write midway: the bytes written so far would take the last free space
    and hold no entry, so the file is removed before the error goes on (the store counts it and serves from
    memory)."""
    import errno

    tier = DiskCacheTier(tmp_path, size_limit=1 << 20, sweep=False)
    disk = tier._diskcache.disk
    target = tier.folder / "ab" / "cd" / "0123456789abcdef0123456789abcd.val"

    def chunks():
        yield b"x" * 4096
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        disk._write(str(target), chunks(), "xb")
    assert not target.exists()
    tier.close()
