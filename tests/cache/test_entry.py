"""Entries round-trip bit-exact through bytes, and every kind of damage is detected."""

from __future__ import annotations

import hashlib

import pytest
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from hypic_rag.cache import (
    AttentionEntry,
    CachedSegment,
    CorruptEntry,
    LinearEntry,
    LinearRemainder,
    LinearTokens,
    RemainderEntry,
    SegmentEntry,
)
from hypic_rag.cache.entry import FORMAT_VERSION, MAGIC, entry_dtype


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


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_an_entry_kept_in_16_bits_holds_half_the_state_bytes_and_widens_back(name):
    dtype = entry_dtype(name)
    entry = make_entry(dtype=torch.float32)
    kept = entry.stored_as(dtype)
    assert all(t.dtype == dtype for g in (*kept.linear.values(), *kept.attention.values()) for t in vars(g).values())
    assert kept.nbytes == entry.nbytes // 2 == entry.nbytes_as(dtype)
    back = kept.widened(torch.float32)
    for i, lin in entry.linear.items():
        for name_, t in vars(lin).items():
            u = getattr(back.linear[i], name_)
            assert u.dtype == torch.float32 and torch.equal(u, t.to(dtype).float())  # rounded once, no more
    rest = make_remainder()
    assert rest.stored_as(dtype).nbytes == rest.nbytes // 2
    assert rest.stored_as(dtype).widened(torch.float32).linear[0].p.dtype == torch.float32
    assert_same(SegmentEntry.from_bytes(kept.to_bytes("fp"), "fp"), kept)  # the bytes keep the dtype


def test_float32_entries_are_kept_as_they_are():
    entry = make_entry()
    assert entry.stored_as(torch.float32) is entry and entry.nbytes_as(torch.float32) == entry.nbytes


@pytest.mark.parametrize("bad", ["fp8", "float64", torch.int8, None])
def test_an_unknown_entry_dtype_is_a_value_error(bad):
    with pytest.raises(ValueError, match="entry_dtype must be one of float32, bfloat16, float16"):
        entry_dtype(bad)


def test_a_float16_state_past_its_range_is_not_finite():
    entry = make_entry(dtype=torch.float32)
    entry.linear[0].b[0, 0, 0] = 1e6
    assert entry.finite() and not entry.stored_as(torch.float16).finite()


def make_tokens_entry(seed: int = 0) -> SegmentEntry:
    """An entry whose one linear layer keeps its 4 tokens (2 key heads, 4 value heads, K = 16, V = 8)."""
    gen = torch.Generator().manual_seed(seed)
    entry = make_entry(seed, dtype=torch.float32)
    gates = torch.stack((-torch.rand(4, 4, generator=gen), torch.rand(4, 4, generator=gen)), dim=-1)
    keys, values = torch.randn(2, 4, 16, generator=gen), torch.randn(4, 4, 8, generator=gen)
    entry.linear[0] = LinearTokens(keys, values, gates, entry.linear[0].conv_tail)
    return entry


def test_an_entry_kept_as_tokens_round_trips_and_derives_its_remainders():
    entry = make_tokens_entry()
    assert_same(SegmentEntry.from_bytes(entry.to_bytes("fp"), "fp"), entry)
    rest = entry.derived_remainder(3)
    assert rest.derived and rest.seam == 3 and rest.linear[0].keys.shape == (2, 1, 16)
    assert entry.derived_remainder(4) is None and entry.derived_remainder(0) is None  # no tokens after the seam
    assert CachedSegment(entry, rest).nbytes == entry.nbytes  # a view holds no bytes of its own
    with pytest.raises(ValueError, match="never stored"):
        rest.to_bytes("fp")
    assert make_entry().derived_remainder(2) is None  # dense layers keep their remainders apart


def test_a_16_bit_entry_kept_as_tokens_keeps_its_gates_in_float32():
    entry = make_tokens_entry()
    kept = entry.stored_as(torch.bfloat16)
    lin = kept.linear[0]
    assert lin.keys.dtype == lin.values.dtype == torch.bfloat16 and torch.equal(lin.gates, entry.linear[0].gates)
    assert kept.nbytes == entry.nbytes_as(torch.bfloat16) < entry.nbytes
    assert kept.widened(torch.float32).linear[0].keys.dtype == torch.float32


def test_a_layer_stored_in_two_forms_is_corrupt():
    entry, dense = make_tokens_entry(), make_entry()
    tensors = st_load(entry.to_bytes("fp")[len(MAGIC) + 32 :])
    tensors |= {f"linear.0.{name}": t for name, t in vars(dense.linear[0]).items()}
    payload = st_save(tensors, metadata={"format": str(FORMAT_VERSION), "kind": "segment", "fingerprint": "fp"})
    with pytest.raises(CorruptEntry, match="two forms"):
        SegmentEntry.from_bytes(MAGIC + hashlib.sha256(payload).digest() + payload, "fp")
