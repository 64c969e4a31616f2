"""Entries round-trip bit-exact through bytes, and every kind of damage is detected."""

from __future__ import annotations

import pytest
import torch

from hypic_rag.cache import (
    AttentionEntry,
    CorruptEntry,
    LinearEntry,
    LinearRemainder,
    RemainderEntry,
    SegmentEntry,
)


def make_entry(seed: int = 0, dtype: torch.dtype = torch.bfloat16) -> SegmentEntry:
    gen = torch.Generator().manual_seed(seed)
    entry = SegmentEntry((5, 9, 300, 7))
    entry.linear[0] = LinearEntry(
        b=torch.randn(4, 16, 8, generator=gen),
        p=torch.randn(4, 16, 16, generator=gen),
        conv_tail=torch.randn(72, 3, generator=gen).to(dtype),
    )
    entry.attention[1] = AttentionEntry(
        torch.randn(2, 4, 16, generator=gen).to(dtype), torch.randn(2, 4, 16, generator=gen).to(dtype)
    )
    return entry


def make_remainder(seed: int = 0, seam: int = 2) -> RemainderEntry:
    gen = torch.Generator().manual_seed(seed)
    rest = RemainderEntry((5, 9, 300, 7), seam)
    rest.linear[0] = LinearRemainder(b=torch.randn(4, 16, 8, generator=gen), p=torch.randn(4, 16, 16, generator=gen))
    return rest


def assert_same(a: SegmentEntry | RemainderEntry, b: SegmentEntry | RemainderEntry) -> None:
    assert type(a) is type(b) and a.token_ids == b.token_ids and getattr(a, "seam", 0) == getattr(b, "seam", 0)
    layers = ("linear", "attention") if isinstance(a, SegmentEntry) else ("linear",)
    for group in layers:
        x, y = getattr(a, group), getattr(b, group)
        assert x.keys() == y.keys()
        for i in x:
            for name, t in vars(x[i]).items():
                u = getattr(y[i], name)
                assert t.dtype == u.dtype and torch.equal(t, u), (group, i, name)


@pytest.mark.parametrize("make", [make_entry, make_remainder])
def test_bytes_round_trip_is_bit_exact(make):
    entry = make()
    assert_same(type(entry).from_bytes(entry.to_bytes("fp"), "fp"), entry)


def test_a_remainder_is_not_read_as_a_segment_entry_nor_the_reverse():
    with pytest.raises(CorruptEntry, match="'remainder' entry where a 'segment' one"):
        SegmentEntry.from_bytes(make_remainder().to_bytes("fp"), "fp")
    with pytest.raises(CorruptEntry, match="'segment' entry where a 'remainder' one"):
        RemainderEntry.from_bytes(make_entry().to_bytes("fp"), "fp")


@pytest.mark.parametrize(
    "damage,message",
    [
        (lambda b: b[:-10], "checksum"),
        (lambda b: b[:40] + bytes([b[40] ^ 1]) + b[41:], "checksum"),
        (lambda b: b"NOTHYPIC" + b[8:], "not a hypic-rag"),
        (lambda b: b[:20], "not a hypic-rag"),
    ],
)
def test_damage_is_detected(damage, message):
    with pytest.raises(CorruptEntry, match=message):
        SegmentEntry.from_bytes(damage(make_entry().to_bytes("fp")), "fp")


def test_another_model_cannot_read_an_entry():
    with pytest.raises(CorruptEntry, match="another format version or model"):
        SegmentEntry.from_bytes(make_entry().to_bytes("model-a"), "model-b")
