"""The position-independent segment cache: entries and their bytes, keys, the memory and disk tiers, what an
entry must look like to be used (``validate``), and the prefix store of the ``prefix`` baseline."""

from .disk import BytesTier, DiskCacheTier, ForeignPath, PickledValue, RawBytesDisk, default_cache_dir
from .entry import (
    FORMAT_VERSION,
    AttentionEntry,
    CacheEntry,
    CorruptEntry,
    LinearEntry,
    LinearRemainder,
    RemainderEntry,
    SegmentEntry,
)
from .keys import checkpoint_fingerprint, module_fingerprint, remainder_key, segment_key
from .prefix import PrefixStore
from .store import SegmentStore
from .validate import EntryLayout

__all__ = [
    "FORMAT_VERSION",
    "AttentionEntry",
    "BytesTier",
    "CacheEntry",
    "CorruptEntry",
    "DiskCacheTier",
    "EntryLayout",
    "ForeignPath",
    "LinearEntry",
    "LinearRemainder",
    "PickledValue",
    "PrefixStore",
    "RawBytesDisk",
    "RemainderEntry",
    "SegmentEntry",
    "SegmentStore",
    "checkpoint_fingerprint",
    "default_cache_dir",
    "module_fingerprint",
    "remainder_key",
    "segment_key",
]
