"""The local persistent tier (a ``tier.BytesTier``): raw bytes on diskcache.

diskcache pickles any value that is not bytes, and unpickles what it reads (GHSA-w8v5-vhqr-4h9v), so
``RawBytesDisk`` refuses to store anything but bytes and refuses to read a pickled record. The
default ``cull_limit`` of 10 can wipe the whole cache in one eviction; we cull one entry at a time.

diskcache opens and deletes whatever file its index row names, relative to the folder: a row rewritten to
``../victim.txt`` would make a cache read delete a file outside the cache. ``RawBytesDisk`` only touches
files whose name has the shape diskcache itself gives them (``ab/cd/<28 hex>.val``) and whose real path is
inside the folder; any other row is corrupt. diskcache's own repair (``Cache.check(fix=True)``) deletes every
file of the folder its index does not name, so it is never run: the tier keeps to a subfolder it marked as its
own and sweeps only its own files (``ownership.py``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path
from typing import Any

import diskcache
from diskcache.core import MODE_PICKLE

from .ownership import INDEX, VALUE_NAME, claim, remove_empty_dirs, sweep_orphans, tier_folder, value_files
from .space import MIN_FREE_BYTES, RECHECK_S, default_budget, free_bytes

log = logging.getLogger("hypic_rag.cache")


class PickledValue(ValueError):
    """A record in the disk tier that would need unpickling."""


class ForeignPath(ValueError):
    """An index row that names a file diskcache would not have written: outside the folder, or not its shape."""


class RawBytesDisk(diskcache.Disk):
    def store(self, value: Any, read: bool, key: Any = diskcache.core.UNKNOWN) -> Any:
        if read or not isinstance(value, bytes):
            raise ValueError(f"the segment tier stores bytes only, not {type(value).__name__}")
        return super().store(value, read, key=key)

    def _write(self, full_path: str, iterator: Any, mode: str, encoding: str | None = None) -> Any:
        """diskcache's write, less the partial file a failed one (a full disk) leaves: the file was made by this
        very write (``xb``), so it is ours to remove, and it would hold the last free bytes."""
        try:
            return super()._write(full_path, iterator, mode, encoding)
        except OSError:
            if "x" in mode:
                with contextlib.suppress(OSError):
                    os.remove(full_path)
            raise

    def fetch(self, mode: int, filename: str | None, value: Any, read: bool) -> Any:
        if mode == MODE_PICKLE:
            raise PickledValue("refusing to unpickle a value from the segment tier")
        if filename is not None:
            self._own(filename)
        return super().fetch(mode, filename, value, read)

    def remove(self, file_path: str) -> None:
        try:
            self._own(file_path)
        except ForeignPath:
            return  # never delete what we did not write; the row itself is deleted by the caller
        super().remove(file_path)

    def _own(self, filename: str) -> None:
        """Raise ``ForeignPath`` unless ``filename`` is one diskcache would write, inside the folder."""
        root = os.path.realpath(self._directory)
        full = os.path.realpath(os.path.join(root, filename))
        if not VALUE_NAME.fullmatch(filename) or os.path.commonpath([root, full]) != root:
            raise ForeignPath(f"the cache index names a file outside the cache: {filename!r}")


class DiskCacheTier:
    """diskcache with LRU eviction under ``size_limit`` bytes; safe across processes (SQLite WAL).

    Its files live in a subfolder of ``directory`` that it made and marked (``ownership.py``): the rest of
    ``directory`` is never read or touched, and a subfolder it did not mark, or a symlinked folder or index, is
    a ValueError. The folder is opened on first use, not at construction, so an engine starts even when the
    disk does not (the store then counts the failure and retries later). Opening sweeps the value files a
    killed writer left without an index row (``sweep=False``: nothing is removed, for inspection).

    ``size_limit`` defaults to a share of the free space (``space.py``); on a nearly full disk the tier stays
    off, with one warning: reads miss, writes are dropped, and the engine answers from memory."""

    def __init__(self, directory: str | Path, size_limit: int | None = None, *, sweep: bool = True) -> None:
        if "://" in str(directory):
            raise ValueError(f"cache_dir is a folder, not {str(directory)!r}: pass a Redis URL as cache_url")
        directory = Path(directory).expanduser()
        given = size_limit if size_limit is not None else 1
        if isinstance(given, bool) or not isinstance(given, int) or given < 1:
            raise ValueError(f"the disk tier's size limit must be a positive byte count, got {size_limit!r}")
        self.directory = directory
        self.folder = tier_folder(directory)
        self.size_limit = size_limit
        self.sweep = sweep
        self._opened: diskcache.Cache | None = None
        self._off_until = 0.0  # the disk was nearly full: off until then
        self._warned = False

    @property
    def _diskcache(self) -> diskcache.Cache | None:
        """The open cache; None while the disk is nearly full."""
        if self._opened is None:
            if time.monotonic() < self._off_until:
                return None
            tier_folder(self.directory)  # again: the folder may have changed since construction
            free = free_bytes(self.folder)
            if free < MIN_FREE_BYTES:
                self._off_until = time.monotonic() + RECHECK_S
                if not self._warned:
                    self._warned = True
                    log.warning(
                        "only %d bytes free on the disk of %s: the disk tier is off and answers come from memory "
                        "(it looks again every %.0f s; `hypic-rag cache clear` empties it)",
                        free,
                        self.folder,
                        RECHECK_S,
                    )
                return None
            held = sum(info.st_size for _, info in value_files(self.folder))
            claim(self.folder)
            cache = diskcache.Cache(
                str(self.folder),
                disk=RawBytesDisk,
                size_limit=self.size_limit or default_budget(free, held),
                cull_limit=1,
                eviction_policy="least-recently-used",
            )
            if self.sweep:
                rows = cache._sql("SELECT filename FROM Cache WHERE filename IS NOT NULL").fetchall()
                sweep_orphans(self.folder, {name for (name,) in rows})
            self._opened = cache
        return self._opened

    def get(self, key: str) -> bytes | None:
        """The stored bytes, or None; a pickled record, or one naming a file outside the cache, is deleted
        (the row, never the file it names) and reported as ``PickledValue`` / ``ForeignPath``."""
        cache = self._diskcache
        if cache is None:
            return None
        try:
            value = cache.get(key, default=None)
        except (PickledValue, ForeignPath):
            self.delete(key)
            raise
        return value if value is None or isinstance(value, bytes) else None

    def set(self, key: str, value: bytes) -> bool:
        """Whether the write was taken (not while the tier is off)."""
        cache = self._diskcache
        if cache is None:
            return False
        cache.set(key, value)
        return True

    def delete(self, key: str) -> None:
        cache = self._diskcache
        if cache is not None:
            cache.delete(key)

    def clear(self) -> int:
        cache = self._diskcache
        return cache.clear() if cache is not None else self.reset()  # a full disk: remove without opening

    def has_room(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more fit under the size limit without evicting anything (False while the tier is off)."""
        cache = self._diskcache
        return cache is not None and cache.volume() + nbytes <= cache.size_limit

    def stats(self) -> dict[str, Any]:
        cache = self._diskcache
        where = {"directory": str(self.directory), "folder": str(self.folder)}
        if cache is None:
            return {**where, "available": False, "free_bytes": free_bytes(self.folder)}
        return {**where, "entries": len(cache), "bytes": cache.volume(), "size_limit": cache.size_limit}

    def reset(self) -> int:
        """Remove the index and every value file of ours, however damaged the index is (it is not read):
        the folder becomes an empty cache. Returns the number of value files removed."""
        self.close()
        tier_folder(self.directory)
        removed = 0
        for name in INDEX:
            (self.folder / name).unlink(missing_ok=True)
        for name, _ in value_files(self.folder):
            (self.folder / name).unlink(missing_ok=True)
            removed += 1
        remove_empty_dirs(self.folder)
        return removed

    def close(self) -> None:
        if self._opened is not None:
            self._opened.close()
            self._opened = None

    def __del__(self) -> None:  # pragma: no cover - best effort at interpreter exit
        try:
            self.close()
        except Exception:
            pass


def default_cache_dir() -> Path:
    return Path(os.environ.get("HYPIC_CACHE_DIR", Path.home() / ".cache" / "hypic-rag"))
