"""The local persistent tier (a ``tier.BytesTier``): raw bytes on diskcache.

diskcache pickles any value that is not bytes, and unpickles what it reads (GHSA-w8v5-vhqr-4h9v), so
``RawBytesDisk`` refuses to store anything but bytes and refuses to read a pickled record. The
default ``cull_limit`` of 10 can wipe the whole cache in one eviction; we cull one entry at a time.

diskcache opens and deletes whatever file its index row names, relative to the folder: a row rewritten to
``../victim.txt`` would make a cache read delete a file outside the cache. ``RawBytesDisk`` only touches
files whose name has the shape diskcache itself gives them (``ab/cd/<28 hex>.val``) and whose real path is
inside the folder; any other row is corrupt.
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path
from typing import Any

import diskcache
from diskcache.core import MODE_PICKLE


class PickledValue(ValueError):
    """A record in the disk tier that would need unpickling."""


class ForeignPath(ValueError):
    """An index row that names a file diskcache would not have written: outside the folder, or not its shape."""


# The names diskcache's ``Disk.filename`` gives: two levels of two hex digits, then 28 hex digits and ``.val``.
_OWN_NAME = re.compile(r"[0-9a-f]{2}/[0-9a-f]{2}/[0-9a-f]{28}\.val")


class RawBytesDisk(diskcache.Disk):
    def store(self, value: Any, read: bool, key: Any = diskcache.core.UNKNOWN) -> Any:
        if read or not isinstance(value, bytes):
            raise ValueError(f"the segment tier stores bytes only, not {type(value).__name__}")
        return super().store(value, read, key=key)

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
        if not _OWN_NAME.fullmatch(filename) or os.path.commonpath([root, full]) != root:
            raise ForeignPath(f"the cache index names a file outside the cache: {filename!r}")


class DiskCacheTier:
    """diskcache with LRU eviction under ``size_limit`` bytes; safe across processes (SQLite WAL).

    The folder is opened on first use, not at construction, so an engine starts even when the disk does not
    (the store then counts the failure and retries later). Opening sweeps files a killed writer left behind
    without an index row (``Cache.check(fix=True)``)."""

    def __init__(self, directory: str | Path, size_limit: int = 8 << 30) -> None:
        if "://" in str(directory):
            raise ValueError(f"cache_dir is a folder, not {str(directory)!r}: pass a Redis URL as cache_url")
        directory = Path(directory).expanduser()
        if directory.exists() and not directory.is_dir():
            raise ValueError(f"cache_dir {str(directory)!r} is a file, not a folder")
        if isinstance(size_limit, bool) or not isinstance(size_limit, int) or size_limit < 1:
            raise ValueError(f"the disk tier's size limit must be a positive byte count, got {size_limit!r}")
        self.directory = directory
        self.size_limit = size_limit
        self._opened: diskcache.Cache | None = None

    @property
    def _diskcache(self) -> diskcache.Cache:
        if self._opened is None:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            cache = diskcache.Cache(
                str(self.directory),
                disk=RawBytesDisk,
                size_limit=self.size_limit,
                cull_limit=1,
                eviction_policy="least-recently-used",
            )
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # diskcache warns about each orphan it removes
                cache.check(fix=True)
            self._opened = cache
        return self._opened

    def get(self, key: str) -> bytes | None:
        """The stored bytes, or None; a pickled record, or one naming a file outside the cache, is deleted
        (the row, never the file it names) and reported as ``PickledValue`` / ``ForeignPath``."""
        try:
            value = self._diskcache.get(key, default=None)
        except (PickledValue, ForeignPath):
            self.delete(key)
            raise
        return value if value is None or isinstance(value, bytes) else None

    def set(self, key: str, value: bytes) -> None:
        self._diskcache.set(key, value)

    def delete(self, key: str) -> None:
        self._diskcache.delete(key)

    def clear(self) -> int:
        return self._diskcache.clear()

    def stats(self) -> dict[str, Any]:
        return {"directory": str(self.directory), "entries": len(self._diskcache), "bytes": self._diskcache.volume()}

    def reset(self) -> int:
        """Remove the index and every value file of ours, however damaged the index is (it is not read):
        the folder becomes an empty cache. Returns the number of value files removed."""
        self.close()
        removed = 0
        for name in ("cache.db", "cache.db-wal", "cache.db-shm"):
            (self.directory / name).unlink(missing_ok=True)
        for file in self.directory.glob("*/*/*.val"):
            if _OWN_NAME.fullmatch(file.relative_to(self.directory).as_posix()) and not file.is_symlink():
                file.unlink()
                removed += 1
        for sub in sorted(self.directory.glob("*/*"), reverse=True) + sorted(self.directory.glob("*")):
            if sub.is_dir() and not any(sub.iterdir()):
                sub.rmdir()
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
