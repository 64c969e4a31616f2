"""The persistent tier: raw bytes on diskcache, behind an interface another store can implement.

diskcache pickles any value that is not bytes, and unpickles what it reads (GHSA-w8v5-vhqr-4h9v), so
``RawBytesDisk`` refuses to store anything but bytes and refuses to read a pickled record. The
default ``cull_limit`` of 10 can wipe the whole cache in one eviction; we cull one entry at a time.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol

import diskcache
from diskcache.core import MODE_PICKLE


class PickledValue(ValueError):
    """A record in the disk tier that would need unpickling."""


class BytesTier(Protocol):
    """What the segment store needs from a persistent tier (diskcache, Redis, a shared filesystem)."""

    def get(self, key: str) -> bytes | None: ...
    def set(self, key: str, value: bytes) -> None: ...
    def delete(self, key: str) -> None: ...
    def clear(self) -> int: ...
    def stats(self) -> dict[str, Any]: ...


class RawBytesDisk(diskcache.Disk):
    def store(self, value: Any, read: bool, key: Any = diskcache.core.UNKNOWN) -> Any:
        if read or not isinstance(value, bytes):
            raise ValueError(f"the segment tier stores bytes only, not {type(value).__name__}")
        return super().store(value, read, key=key)

    def fetch(self, mode: int, filename: str | None, value: Any, read: bool) -> Any:
        if mode == MODE_PICKLE:
            raise PickledValue("refusing to unpickle a value from the segment tier")
        return super().fetch(mode, filename, value, read)


class DiskCacheTier:
    """diskcache with LRU eviction under ``size_limit`` bytes; safe across processes (SQLite WAL)."""

    def __init__(self, directory: str | Path, size_limit: int = 8 << 30) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.directory = directory
        self._cache = diskcache.Cache(
            str(directory),
            disk=RawBytesDisk,
            size_limit=size_limit,
            cull_limit=1,
            eviction_policy="least-recently-used",
        )

    def get(self, key: str) -> bytes | None:
        """The stored bytes, or None; a pickled record is deleted and reported as ``PickledValue``."""
        try:
            value = self._cache.get(key, default=None)
        except PickledValue:
            self.delete(key)
            raise
        return value if value is None or isinstance(value, bytes) else None

    def set(self, key: str, value: bytes) -> None:
        self._cache.set(key, value)

    def delete(self, key: str) -> None:
        self._cache.delete(key)

    def clear(self) -> int:
        return self._cache.clear()

    def stats(self) -> dict[str, Any]:
        return {"directory": str(self.directory), "entries": len(self._cache), "bytes": self._cache.volume()}

    def close(self) -> None:
        self._cache.close()

    def __del__(self) -> None:  # pragma: no cover - best effort at interpreter exit
        try:
            self._cache.close()
        except Exception:
            pass


def default_cache_dir() -> Path:
    return Path(os.environ.get("HYPIC_CACHE_DIR", Path.home() / ".cache" / "hypic-rag"))
