"""The shared tier: segment entries in Redis, so that replicas on several machines prefill a document once.

It stores the same checksummed bytes as the disk tier (no pickle; keys carry the model fingerprint, and so do
the bytes, which are checked on every read), under ``hypic:`` keys. Expiry is Redis's own: run the server with
``maxmemory`` and ``maxmemory-policy allkeys-lru``, which keeps the documents in use and bounds the footprint;
a TTL (``ttl_s``) is offered but off by default, since entries never go stale (they are content-addressed) and
a timer would evict hot entries as readily as cold ones.

Every call is bounded by ``timeout_s``. Writes go through a background thread, so a request that made a large
entry never waits for the network (a full write queue drops the write, counted). A failed call raises; the
segment store counts it and bypasses the tier for a while, then tries again, and redis-py reconnects by itself.
A key of another type is a fault of that key alone: it is dropped and counted as corrupt, the tier stays on.
"""

from __future__ import annotations

import queue
import threading
from typing import Any
from urllib.parse import urlparse

from .tier import UnreadableKey

PREFIX = "hypic:"
TIMEOUT_S = 0.5  # every call to the server, connecting included


def check_url(url: str) -> str:
    """``redis://host:port/db`` (or ``rediss://``, ``unix://``), else a ValueError."""
    if not isinstance(url, str) or urlparse(url).scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"cache_url must be redis://host:port/db (or rediss://, unix://), got {url!r}")
    return url


def client(url: str, timeout_s: float = TIMEOUT_S) -> Any:
    """A redis-py client for ``url`` whose every call, connecting included, is bounded by ``timeout_s``."""
    import redis

    return redis.Redis.from_url(
        check_url(url), socket_timeout=timeout_s, socket_connect_timeout=timeout_s, health_check_interval=30
    )


class RedisTier:
    """A ``BytesTier`` on a Redis server."""

    def __init__(
        self, url: str, *, timeout_s: float = TIMEOUT_S, ttl_s: int | None = None, max_pending: int = 64
    ) -> None:
        if not timeout_s > 0 or (ttl_s is not None and ttl_s < 1):
            raise ValueError("timeout_s must be > 0 and ttl_s >= 1 or None")
        self.url = check_url(url)
        self.ttl_s = ttl_s
        self.client = client(url, timeout_s)
        self.dropped_writes = 0
        self.write_errors = 0
        self._pending: queue.Queue[tuple[str, bytes] | threading.Event] = queue.Queue(maxsize=max_pending)
        self._writer = threading.Thread(target=self._write_loop, name="hypic-redis-writer", daemon=True)
        self._writer.start()

    def get(self, key: str) -> bytes | None:
        """The bytes under ``key``; a key of another type (``WRONGTYPE``, a reply about that key, not a fault of
        the connection) is deleted, so the next write puts the entry back, and reported as ``UnreadableKey``."""
        from redis.exceptions import ResponseError

        try:
            value = self.client.get(PREFIX + key)
        except ResponseError as exc:
            if not str(exc).startswith("WRONGTYPE"):
                raise
            self.client.delete(PREFIX + key)
            raise UnreadableKey(f"Redis key {PREFIX + key} is not a string: dropped") from None
        return value if isinstance(value, bytes) else None

    def set(self, key: str, value: bytes) -> bool:
        """Queued for the writer thread; dropped (and counted, False) when the queue is full."""
        try:
            self._pending.put_nowait((key, value))
        except queue.Full:
            self.dropped_writes += 1
            return False
        return True

    def delete(self, key: str) -> None:
        self.client.delete(PREFIX + key)

    def check(self) -> None:
        """A ping: raises what any call would raise while the server cannot be reached (for start-up and health)."""
        self.client.ping()

    def clear(self) -> int:
        self.flush()
        removed = 0
        for batch in _batches(self.client.scan_iter(match=PREFIX + "*", count=500), 500):
            removed += int(self.client.delete(*batch))
        return removed

    def stats(self) -> dict[str, Any]:
        info = self.client.info("memory")
        return {
            "url": redacted(self.url),
            "bytes": int(info.get("used_memory", 0)),
            "entries": sum(1 for _ in self.client.scan_iter(match=PREFIX + "*", count=1000)),
            "dropped_writes": self.dropped_writes,
            "write_errors": self.write_errors,
        }

    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until the queued writes are done (tests, shutdown)."""
        done = threading.Event()
        try:
            self._pending.put(done, timeout=timeout_s)  # the writer sets it when it gets there
        except queue.Full:
            return
        done.wait(timeout_s)

    def close(self) -> None:
        self.flush(5.0)
        self.client.close()

    def _write_loop(self) -> None:
        while True:
            item = self._pending.get()
            if isinstance(item, threading.Event):
                item.set()
                continue
            key, value = item
            try:
                self.client.set(PREFIX + key, value, ex=self.ttl_s)
            except Exception:  # the next read will find the tier down and the store will count it
                self.write_errors += 1


def _batches(items: Any, size: int) -> Any:
    batch: list = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def redacted(url: str) -> str:
    """``url`` without its password, for logs and warnings."""
    parsed = urlparse(url)
    if parsed.password:
        return url.replace(f":{parsed.password}@", ":***@")
    return url
