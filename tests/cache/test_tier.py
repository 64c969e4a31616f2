"""The byte-tier interface (hypic_rag.cache.tier): both persistent tiers implement every method of it with its
parameters, and a tier of plain bytes written to that interface alone serves the segment store."""

from __future__ import annotations

import inspect

import pytest

from hypic_rag.cache import BytesTier, DiskCacheTier, SegmentEntry, SegmentStore
from hypic_rag.cache.remote import RedisTier

METHODS = [name for name in vars(BytesTier) if not name.startswith("_")]


def test_the_interface_names_what_the_store_calls():
    assert sorted(METHODS) == ["clear", "delete", "get", "set", "stats"]


@pytest.mark.parametrize("tier", [DiskCacheTier, RedisTier])
@pytest.mark.parametrize("method", METHODS)
def test_each_tier_implements_the_interface(tier, method):
    wanted = list(inspect.signature(getattr(BytesTier, method)).parameters)
    assert list(inspect.signature(getattr(tier, method)).parameters) == wanted


class DictTier:
    """Bytes in a dict: the smallest ``BytesTier``."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def get(self, key: str) -> bytes | None:
        return self.data.get(key)

    def set(self, key: str, value: bytes) -> None:
        self.data[key] = value

    def delete(self, key: str) -> None:
        self.data.pop(key, None)

    def clear(self) -> int:
        n = len(self.data)
        self.data.clear()
        return n

    def stats(self) -> dict:
        return {"entries": len(self.data)}


def test_a_tier_written_to_the_interface_serves_the_store():
    tier = DictTier()
    entry = SegmentEntry((5, 6, 7))
    SegmentStore("fp", memory=1 << 20, disk=tier).put("k", entry)
    fresh = SegmentStore("fp", memory=1 << 20, disk=tier)  # an empty memory tier: the hit comes from the bytes
    found = fresh.get("k", (5, 6, 7))
    assert found is not None and found.token_ids == (5, 6, 7) and fresh.counters["disk_hits"] == 1
    tier.set(next(iter(tier.data)), b"garbage")
    assert SegmentStore("fp", memory=1 << 20, disk=tier).get("k", (5, 6, 7)) is None  # corrupt: a miss
