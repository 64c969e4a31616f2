"""The disk tier under faults and tampering: a path-traversal row, a garbage index, a full, read-only or deleted
folder, orphaned files, killed writers. Every request still answers exactly as a cache-less engine does, and no
file outside the cache is touched."""

from __future__ import annotations

import errno
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
import torch

from hypic_rag.cache import DiskCacheTier, segment_key
from hypic_rag.cache.ownership import SUBFOLDER
from hypic_rag.cli import main as cli

from .conftest import DOCS, QUESTION, engine, same, segments


def _warm(folder) -> None:
    engine(cache_dir=folder).generate(segments(), QUESTION, max_new_tokens=1)


@pytest.mark.parametrize("target", ["../victim.txt", "ab/../../victim.txt", "{abs}"])
def test_a_path_traversal_row_deletes_nothing_outside_the_cache(tmp_path, oracle, target):
    folder, victim = tmp_path / "cache", tmp_path / "victim.txt"
    victim.write_text("precious")
    _warm(folder)
    reader = engine(cache_dir=folder)
    reader.segment_store.stats()  # the tier is open (and swept) before the row is rewritten
    key = segment_key(reader.segment_ids(segments()[1]), reader.fingerprint, torch.float32)
    with sqlite3.connect(folder / SUBFOLDER / "cache.db") as db:
        name = str(victim) if target == "{abs}" else target
        assert db.execute("UPDATE Cache SET filename=?, mode=2 WHERE key=?", (name, key)).rowcount == 1
    out = reader.generate(segments(), QUESTION, max_new_tokens=1)
    assert victim.read_text() == "precious"
    assert out.stats["corrupt"] == 1 and out.stats["miss_segments"] == 1
    assert same(out.prompt_logits, oracle())
    reader.clear_cache()  # clearing walks every row: still nothing outside is removed
    assert victim.read_text() == "precious"


def test_a_garbage_index_degrades_to_recompute_and_the_cli_explains(tmp_path, oracle, capsys):
    folder = tmp_path / "cache"
    _warm(folder)
    (folder / SUBFOLDER / "cache.db").write_bytes(os.urandom(4096))
    for extra in ("cache.db-wal", "cache.db-shm"):
        (folder / SUBFOLDER / extra).unlink(missing_ok=True)
    reader = engine(cache_dir=folder)
    out = reader.generate(segments(), QUESTION, max_new_tokens=1)
    assert out.stats["tier_errors"] >= 1 and same(out.prompt_logits, oracle())
    with pytest.raises(SystemExit) as exc:
        cli(["cache", "stats", "--cache-dir", str(folder)])
    assert exc.value.code == 2 and "cannot read the segment cache" in capsys.readouterr().err
    assert cli(["cache", "clear", "--cache-dir", str(folder)]) == 0  # rebuilds the damaged index
    assert "rebuilt" in capsys.readouterr().out
    assert engine(cache_dir=folder).generate(segments(), QUESTION, max_new_tokens=1).stats["tier_errors"] == 0


class ReadOnly(DiskCacheTier):
    """The folder turned read-only: every write fails as the OS reports it (root ignores chmod, so the fault is
    injected at the tier's edge; reads go to the real folder)."""

    def set(self, key, value):
        raise OSError(errno.EROFS, "Read-only file system")

    def delete(self, key):
        raise OSError(errno.EROFS, "Read-only file system")


def test_a_read_only_folder_is_bypassed_then_retried(tmp_path, oracle, caplog):
    reader = engine(cache_dir=tmp_path / "cache")
    reader.segment_store.disk = ReadOnly(tmp_path / "cache")
    reader.segment_store.retry_s = 0.2
    with caplog.at_level("WARNING", logger="hypic_rag.cache"):
        first = reader.generate(segments(), QUESTION, max_new_tokens=1)
        second = reader.generate(segments(DOCS[::-1]), QUESTION, max_new_tokens=1)
    assert first.stats["tier_errors"] == 1  # then bypassed: no second error while it is down
    assert second.stats["tier_errors"] == 0 and second.stats["hit_segments"] == 3  # served from memory
    assert len([r for r in caplog.records if "bypassing" in r.message]) == 1  # logged once
    assert same(first.prompt_logits, oracle()) and same(second.prompt_logits, oracle(DOCS[::-1]))
    time.sleep(0.25)
    reader.clear_cache()
    third = reader.generate(segments(), QUESTION, max_new_tokens=1)
    assert third.stats["tier_errors"] == 1  # retried after retry_s, and still failing
    reader.segment_store.disk = DiskCacheTier(tmp_path / "cache")
    time.sleep(0.25)
    reader.clear_cache()
    assert reader.generate(segments(), QUESTION, max_new_tokens=1).stats["tier_errors"] == 0  # back


def test_a_folder_deleted_mid_run(tmp_path, oracle):
    import shutil

    folder = tmp_path / "cache"
    reader = engine(cache_dir=folder)
    reader.generate(segments(DOCS[1::-1]), QUESTION, max_new_tokens=1)  # not the next prompt's beginning
    shutil.rmtree(folder)
    out = reader.generate(segments(), QUESTION, max_new_tokens=1)
    assert same(out.prompt_logits, oracle())


_FULL_DISK = """
import json, resource, signal, sys, torch
from hypic_rag import Engine, Segment
docs = json.loads(sys.argv[2])
bare = Engine.from_pretrained(min_cached_tokens=1)
expected = bare.prompt_logits([Segment(d) for d in docs], "Where does Bo Ek live?")
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing us
resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))
cached = Engine.from_pretrained(cache_dir=sys.argv[1], min_cached_tokens=1)
out = cached.generate([Segment(d) for d in docs], "Where does Bo Ek live?", max_new_tokens=1)
print(json.dumps({"equal": bool(torch.equal(out.prompt_logits, expected)), "tier_errors": out.stats["tier_errors"]}))
"""


def test_a_full_disk_degrades(tmp_path):
    run = subprocess.run(
        [sys.executable, "-c", _FULL_DISK, str(tmp_path / "cache"), json.dumps(DOCS)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result == {"equal": True, "tier_errors": 1}


def test_orphaned_files_of_a_killed_writer_are_swept(tmp_path):
    folder = tmp_path / "cache"
    _warm(folder)
    orphan = folder / SUBFOLDER / "ab" / "cd" / ("0" * 28 + ".val")
    orphan.parent.mkdir(parents=True, exist_ok=True)
    orphan.write_bytes(b"half a value")
    os.utime(orphan, (1, 1))  # old: a fresh file without its row may be a live writer's
    engine(cache_dir=folder).generate(segments(), QUESTION, max_new_tokens=1)
    assert not orphan.exists()


_WRITER = """
import sys
from hypic_rag import Engine, Segment
engine = Engine.from_pretrained(cache_dir=sys.argv[1], min_cached_tokens=1)
print("ready", flush=True)
i = 0
while True:
    i += 1
    engine.generate([Segment(f"Person {i} lives in town {i} and works as a clerk number {i}.")], "Where?",
                    max_new_tokens=1)
"""


def test_writers_killed_mid_write_leave_a_usable_cache(tmp_path, oracle):
    folder = tmp_path / "cache"
    _warm(folder)
    for round_ in range(3):
        writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(folder)], stdout=subprocess.PIPE, text=True)
        assert writer.stdout.readline().strip() == "ready"
        time.sleep(0.5 + 0.3 * round_)
        writer.send_signal(signal.SIGKILL)
        writer.wait(30)
        reader = engine(cache_dir=folder)
        out = reader.generate(segments(DOCS[::-1]), QUESTION, max_new_tokens=1)
        assert out.stats["tier_errors"] == 0 and same(out.prompt_logits, oracle(DOCS[::-1]))


def test_engines_in_threads_share_one_folder(tmp_path, oracle):
    from concurrent.futures import ThreadPoolExecutor

    folder = tmp_path / "cache"
    orders = [DOCS, DOCS[::-1], DOCS[1:] + DOCS[:1], DOCS[2:] + DOCS[:2]]
    expected = [oracle(order) for order in orders]  # the oracle's engine stays in this thread

    def work(i):
        mine = engine(cache_dir=folder)  # one engine per thread, one folder for all
        outs = [mine.generate(segments(orders[i]), QUESTION, max_new_tokens=1) for _ in range(3)]
        return [(same(o.prompt_logits, expected[i]), o.stats["tier_errors"], o.stats["corrupt"]) for o in outs]

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(work, range(4)))
    assert all(row == (True, 0, 0) for rows in results for row in rows), results
