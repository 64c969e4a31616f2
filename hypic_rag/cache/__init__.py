"""The position-independent segment cache: entries and their bytes (``entry``), keys, the segment store
(``store``) over its tiers (memory: ``lru``; the byte-tier interface: ``tier``; local disk: ``disk``; shared
Redis: ``remote``), what an entry must look like to be used (``validate``), and the prefix store of the
``prefix`` baseline."""

from .disk import DiskCacheTier, ForeignPath, PickledValue, RawBytesDisk, default_cache_dir
from .entry import (
    FORMAT_VERSION,
    AttentionEntry,
    CachedSegment,
    CacheEntry,
    CorruptEntry,
    LinearEntry,
    LinearRemainder,
    LinearTokens,
    RemainderEntry,
    SegmentEntry,
)
from .keys import checkpoint_fingerprint, module_fingerprint, remainder_key, segment_key
from .prefix import PrefixStore
from .store import SegmentStore
from .tier import BytesTier
from .validate import EntryLayout

__all__ = [
    "FORMAT_VERSION",
    "AttentionEntry",
    "BytesTier",
    "CachedSegment",
    "CacheEntry",
    "CorruptEntry",
    "DiskCacheTier",
    "EntryLayout",
    "ForeignPath",
    "LinearEntry",
    "LinearRemainder",
    "LinearTokens",
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
