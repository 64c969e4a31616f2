"""The disk tier owns only what it wrote: a cache folder that holds other files keeps them (the tier lives in its
own marked subfolder), a subfolder it did not make, a symlinked folder or a symlinked index is refused with a
ValueError, an inspection command deletes nothing, and the weight-digest file beside the tier survives."""

from __future__ import annotations

import hashlib
import os
import sqlite3

import pytest

from hypic_rag.cache import default_cache_dir
from hypic_rag.cli import main as cli

from .conftest import QUESTION, engine, segments


def _tree(folder) -> dict[str, str]:
    """Every file under ``folder`` (links not followed) and a digest of its bytes."""
    out = {}
    for dirpath, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(dirpath, name)
            out[os.path.relpath(path, folder)] = hashlib.sha256(open(path, "rb").read()).hexdigest()
    return out


def _user_files(folder) -> dict[str, str]:
    (folder / "notes" / "sub").mkdir(parents=True)
    (folder / "thesis.tex").write_text("x\n")
    (folder / "notes" / "sub" / "deep.md").write_text("y\n")
    (folder / "empty").mkdir()
    return _tree(folder)


def test_a_folder_holding_other_files_keeps_every_one_and_still_caches(tmp_path):
    folder = tmp_path / "d"
    before = _user_files(folder)
    engine(cache_dir=folder).generate(segments(), QUESTION, max_new_tokens=1)
    again = engine(cache_dir=folder).generate(segments(), QUESTION, max_new_tokens=1)
    assert again.stats["disk_hits"] >= 3  # the cache works beside them
    after = _tree(folder)
    assert {name: after.get(name) for name in before} == before
    assert (folder / "empty").is_dir() and (folder / "notes" / "sub").is_dir()


def test_cache_stats_deletes_nothing(tmp_path, capsys):
    folder = tmp_path / "d"
    engine(cache_dir=folder).generate(segments(), QUESTION, max_new_tokens=1)
    _user_files(folder)
    sub = next(folder.rglob("cache.db")).parent
    stray = sub / "ab" / "cd" / ("0" * 28 + ".val")  # ours by its shape, but an inspection removes nothing
    stray.parent.mkdir(parents=True, exist_ok=True)
    stray.write_bytes(b"half a value")
    os.utime(stray, (1, 1))
    before = _tree(folder)
    assert cli(["cache", "stats", "--cache-dir", str(folder)]) == 0
    assert '"entries"' in capsys.readouterr().out
    after = _tree(folder)
    assert set(before) <= set(after)  # the index may be written to (WAL), but no file goes
    assert {name: after[name] for name in before if "cache.db" not in name} == {
        name: digest for name, digest in before.items() if "cache.db" not in name
    }


def test_a_symlinked_cache_folder_is_refused(tmp_path):
    system = tmp_path / "etc"
    (system / "ssh").mkdir(parents=True)
    for name, text in (("hosts", "127.0.0.1 localhost\n"), ("hostname", "box\n"), ("ssh/sshd_config", "Port 22\n")):
        (system / name).write_text(text)
    before = _tree(system)
    link = tmp_path / "cache"
    link.symlink_to(system, target_is_directory=True)
    with pytest.raises(ValueError, match="symlink"):
        engine(cache_dir=link).generate(segments(), QUESTION, max_new_tokens=1)
    with pytest.raises(SystemExit):
        cli(["cache", "stats", "--cache-dir", str(link)])
    assert _tree(system) == before


def _user_db(path) -> bytes:
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE grades (name TEXT, mark INTEGER)")
        db.execute("INSERT INTO grades VALUES ('ana', 6)")
    return path.read_bytes()


def test_a_symlinked_index_is_refused_and_the_file_it_names_untouched(tmp_path):
    folder = tmp_path / "d"
    engine(cache_dir=folder).generate(segments(), QUESTION, max_new_tokens=1)
    sub = next(folder.rglob("cache.db")).parent
    user = tmp_path / "grades.sqlite"
    original = _user_db(user)
    for name in ("cache.db", "cache.db-wal", "cache.db-shm"):
        (sub / name).unlink(missing_ok=True)
    (sub / "cache.db").symlink_to(user)
    with pytest.raises(ValueError, match="symlink"):
        engine(cache_dir=folder).generate(segments(), QUESTION, max_new_tokens=1)
    assert user.read_bytes() == original and not (tmp_path / "grades.sqlite-wal").exists()


def test_an_index_link_planted_at_the_top_is_never_opened(tmp_path):
    folder = tmp_path / "d"
    folder.mkdir()
    user = tmp_path / "grades.sqlite"
    original = _user_db(user)
    (folder / "cache.db").symlink_to(user)
    engine(cache_dir=folder).generate(segments(), QUESTION, max_new_tokens=1)
    assert user.read_bytes() == original and not (tmp_path / "grades.sqlite-wal").exists()


def test_a_subfolder_the_tier_did_not_make_is_refused(tmp_path):
    folder = tmp_path / "d"
    engine(cache_dir=tmp_path / "probe").segment_store.stats()  # where the tier keeps its files
    (name,) = [p.name for p in (tmp_path / "probe").iterdir() if p.is_dir()]
    (folder / name).mkdir(parents=True)
    (folder / name / "notes.txt").write_text("mine\n")
    with pytest.raises(ValueError, match="did not"):
        engine(cache_dir=folder)
    assert (folder / name / "notes.txt").read_text() == "mine\n"


def test_the_weight_digest_file_survives_a_cache_in_the_default_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HYPIC_CACHE_DIR", str(tmp_path / "home"))
    reader = engine(cache_dir=default_cache_dir())  # from_pretrained writes the digests there first
    digests = set(default_cache_dir().glob("*digest*"))
    assert digests
    reader.generate(segments(), QUESTION, max_new_tokens=1)
    engine(cache_dir=default_cache_dir()).generate(segments(), QUESTION, max_new_tokens=1)
    assert all(file.exists() for file in digests)


def test_a_folder_another_engine_is_marking_at_that_moment_is_not_refused(tmp_path, monkeypatch):
    from hypic_rag.cache import ownership

    folder = tmp_path / "cache" / ownership.SUBFOLDER
    folder.mkdir(parents=True)  # made by another engine, which marks it and opens its index next
    real, raced = ownership._marked, []

    def racing(path):
        found = real(path)  # not yet marked when looked at ...
        if not raced:
            raced.append(path)
            ownership.claim(path)  # ... then the other engine marks it and writes its index
            (path / "cache.db").write_bytes(b"")
        return found

    monkeypatch.setattr(ownership, "_marked", racing)
    assert ownership.tier_folder(tmp_path / "cache") == folder
