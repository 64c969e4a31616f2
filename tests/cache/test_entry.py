"""Entries round-trip bit-exact through bytes, and every kind of damage is detected."""

from __future__ import annotations

import pytest
import torch

from hypic_rag.cache import AttentionEntry, CorruptEntry, LinearEntry, SegmentEntry


def make_entry(seed: int = 0, rest: bool = True, dtype: torch.dtype = torch.bfloat16) -> SegmentEntry:
    gen = torch.Generator().manual_seed(seed)
    entry = SegmentEntry((5, 9, 300, 7), seam=2 if rest else 0)
    entry.linear[0] = LinearEntry(
        b=torch.randn(4, 16, 8, generator=gen),
        p=torch.randn(4, 16, 16, generator=gen),
        conv_tail=torch.randn(72, 3, generator=gen).to(dtype),
        p_rest=torch.randn(4, 16, 16, generator=gen) if rest else None,
        b_rest=torch.randn(4, 16, 8, generator=gen) if rest else None,
    )
    entry.attention[1] = AttentionEntry(
        torch.randn(2, 4, 16, generator=gen).to(dtype), torch.randn(2, 4, 16, generator=gen).to(dtype)
    )
    return entry


def assert_same(a: SegmentEntry, b: SegmentEntry) -> None:
    assert a.token_ids == b.token_ids and a.seam == b.seam
    assert a.linear.keys() == b.linear.keys() and a.attention.keys() == b.attention.keys()
    for i in a.linear:
        for name in ("b", "p", "conv_tail", "p_rest", "b_rest"):
            x, y = getattr(a.linear[i], name), getattr(b.linear[i], name)
            assert (x is None and y is None) or (x.dtype == y.dtype and torch.equal(x, y))
    for i in a.attention:
        assert torch.equal(a.attention[i].keys, b.attention[i].keys)
        assert torch.equal(a.attention[i].values, b.attention[i].values)


@pytest.mark.parametrize("rest", [True, False])
def test_bytes_round_trip_is_bit_exact(rest):
    entry = make_entry(rest=rest)
    assert_same(SegmentEntry.from_bytes(entry.to_bytes("fp"), "fp"), entry)


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
