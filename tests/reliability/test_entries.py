"""Entries that do not fit: random damage to their bytes (Hypothesis), and well-checksummed entries with the
wrong structure, as a buggy or hostile writer would make them. None is used; every answer equals a cache-less
engine's; ``generate`` never raises because of what a cache holds."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hypic_rag.cache import CorruptEntry, DiskCacheTier, RemainderEntry, SegmentEntry, remainder_key, segment_key

from .conftest import DOCS, QUESTION, engine, same, segments


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """A folder warmed with DOCS, and the bytes and keys of the second document's entry and remainder."""
    folder = tmp_path_factory.mktemp("warm")
    writer = engine(cache_dir=folder)
    writer.generate(segments(), QUESTION, max_new_tokens=1)
    ids = writer.segment_ids(segments()[1])
    key = segment_key(ids, writer.fingerprint, torch.float32)
    tier = DiskCacheTier(folder)
    rest_key = remainder_key(key, writer.seam)
    return {
        "folder": folder,
        "fingerprint": writer.fingerprint,
        "key": key,
        "entry": tier.get(key),
        "rest_key": rest_key,
        "rest": tier.get(rest_key),
    }


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(st.tuples(st.integers(0, 10**9), st.integers(0, 255)), min_size=1, max_size=6),
    st.one_of(st.none(), st.integers(0, 10**9)),
)
def test_damaged_bytes_never_decode_to_another_entry(warm, flips, cut):
    data = bytearray(warm["entry"])
    for at, value in flips:
        data[at % len(data)] = value
    if cut is not None:
        data = data[: cut % len(data)]
    try:
        entry = SegmentEntry.from_bytes(bytes(data), warm["fingerprint"])
    except CorruptEntry:
        return
    assert bytes(data) == warm["entry"]  # only bytes that are unchanged decode
    assert entry.token_ids


def _hostile(entry: SegmentEntry | RemainderEntry, case: str) -> None:
    layer = sorted(entry.linear)[0]
    if case == "nan state":
        entry.linear[layer].b[0, 0, 0] = float("nan")
    elif case == "inf operator":
        entry.linear[layer].p[0, 0, 0] = float("inf")
    elif case == "missing linear layer":
        del entry.linear[layer]
    elif case == "extra linear layer":
        source = entry.linear[layer]
        entry.linear[99] = type(source)(*(t.clone() for t in vars(source).values()))
    elif case == "operator of the wrong shape":
        entry.linear[layer].p = entry.linear[layer].p[:, :-1]
    elif case == "state in float64":
        entry.linear[layer].b = entry.linear[layer].b.double()
    elif case == "missing attention layer":
        del entry.attention[sorted(entry.attention)[0]]
    elif case == "keys of another length":
        att = entry.attention[sorted(entry.attention)[0]]
        att.keys = att.keys[:, :-1]
    elif case == "seam past the segment":
        entry.seam = len(entry.token_ids) + 3
    else:  # pragma: no cover
        raise AssertionError(case)


SEGMENT_CASES = [
    "nan state",
    "inf operator",
    "missing linear layer",
    "extra linear layer",
    "operator of the wrong shape",
    "state in float64",
    "missing attention layer",
    "keys of another length",
]


@pytest.mark.parametrize("case", SEGMENT_CASES + ["remainder: nan state", "remainder: seam past the segment"])
def test_a_well_checksummed_entry_of_the_wrong_structure_is_dropped_and_recomputed(warm, oracle, tmp_path, case):
    import shutil

    folder = tmp_path / "cache"
    shutil.copytree(warm["folder"], folder)
    tier = DiskCacheTier(folder)
    if case.startswith("remainder: "):
        entry = RemainderEntry.from_bytes(warm["rest"], warm["fingerprint"])
        _hostile(entry, case.removeprefix("remainder: "))
        tier.set(warm["rest_key"], entry.to_bytes(warm["fingerprint"]))
    else:
        entry = SegmentEntry.from_bytes(warm["entry"], warm["fingerprint"])
        _hostile(entry, case)
        tier.set(warm["key"], entry.to_bytes(warm["fingerprint"]))
    tier.close()
    reader = engine(cache_dir=folder)
    out = reader.generate(segments(DOCS[::-1]), QUESTION, max_new_tokens=1)
    assert out.stats["corrupt"] == 1, out.stats
    assert same(out.prompt_logits, oracle(DOCS[::-1]))
    again = reader.generate(segments(DOCS[::-1]), QUESTION, max_new_tokens=1)  # recomputed, stored, now a hit
    assert again.stats["corrupt"] == 0 and again.stats["hit_segments"] == 3
