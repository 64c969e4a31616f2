"""Position-independent segment cache: entries, keys, and the memory and disk tiers."""

from .disk import BytesTier, DiskCacheTier, PickledValue, RawBytesDisk, default_cache_dir
from .entry import FORMAT_VERSION, AttentionEntry, CorruptEntry, LinearEntry, SegmentEntry
from .keys import checkpoint_fingerprint, module_fingerprint, segment_key
from .store import SegmentStore

__all__ = [
    "FORMAT_VERSION",
    "AttentionEntry",
    "BytesTier",
    "CorruptEntry",
    "DiskCacheTier",
    "LinearEntry",
    "PickledValue",
    "RawBytesDisk",
    "SegmentEntry",
    "SegmentStore",
    "checkpoint_fingerprint",
    "default_cache_dir",
    "module_fingerprint",
    "segment_key",
]
