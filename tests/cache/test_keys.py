"""Segment keys: the bytes they hash are the token ids as int64, so caches written before stay valid."""

from __future__ import annotations

import hashlib

import torch

from hypic_rag.cache.entry import FORMAT_VERSION
from hypic_rag.cache.keys import remainder_key, segment_key


def test_a_segment_key_hashes_the_ids_as_int64_bytes():
    ids = [0, 1, 2047, 70_000, 2**40]
    h = hashlib.sha256(f"v{FORMAT_VERSION}|fp|torch.float32|".encode())
    h.update(torch.tensor(ids, dtype=torch.int64).numpy().tobytes())
    assert segment_key(ids, "fp", torch.float32) == h.hexdigest()
    assert segment_key(tuple(ids), "fp", torch.float32) == h.hexdigest()


def test_keys_differ_by_ids_model_and_dtype():
    keys = {
        segment_key([1, 2, 3], "fp", torch.float32),
        segment_key([1, 2, 4], "fp", torch.float32),
        segment_key([1, 2, 3], "other", torch.float32),
        segment_key([1, 2, 3], "fp", torch.bfloat16),
    }
    assert len(keys) == 4
    key = segment_key([1], "fp", torch.float32)
    assert remainder_key(key, 8) != remainder_key(key, 4)
