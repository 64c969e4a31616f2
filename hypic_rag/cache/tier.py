"""What the segment store needs from a persistent tier: bytes by key. The local disk (``disk.DiskCacheTier``) and
the shared Redis tier (``remote.RedisTier``) implement it; anything else that keeps bytes (a shared filesystem,
an object store) can too.

A tier stores the entries' checksummed bytes (``entry.py``) and never interprets them; the store checks every
read, so a tier need not be trusted. Any call may raise: the store counts the failure and bypasses the tier
for a while, except for ``UnreadableKey``: one key that cannot be read is a miss for that key alone.
"""

from __future__ import annotations

from typing import Any, Protocol


class UnreadableKey(ValueError):
    """A key the tier holds but cannot read as bytes (a Redis key of another type): the tier has dropped it, so
    it is a miss for that key alone, and the tier stays on for the others."""


class BytesTier(Protocol):
    def get(self, key: str) -> bytes | None: ...
    def set(self, key: str, value: bytes) -> bool | None: ...  # False: the write was not taken
    def delete(self, key: str) -> None: ...
    def clear(self) -> int: ...
    def stats(self) -> dict[str, Any]: ...
