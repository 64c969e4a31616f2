"""An engine's caches, opened from its ``settings.CacheSettings`` in one place: the tiers (memory, a disk folder, a
shared Redis), one memory budget for every in-memory cache, the segment store and the prefix store over them, and
the fingerprint every entry is filed under (the weights', the entries' dtype, and the seal's secret, if any)."""

from __future__ import annotations

from dataclasses import dataclass

from ..model import HybridModel
from ..settings import CacheSettings
from .disk import DiskCacheTier
from .keys import entry_fingerprint, module_fingerprint
from .lru import ByteLRU
from .prefix import PrefixStore
from .remote import RedisTier
from .seal import secret_id
from .store import SegmentStore
from .validate import EntryLayout


@dataclass
class Stores:
    """What an engine caches in: ``memory`` (the one in-memory budget), ``segments`` and ``prefixes`` over it,
    filed under ``fingerprint``."""

    memory: ByteLRU
    segments: SegmentStore
    prefixes: PrefixStore
    fingerprint: str


def open_stores(settings: CacheSettings, model: HybridModel, fingerprint: str | None = None) -> Stores:
    """The stores of an engine over ``model`` (``fingerprint``: the checkpoint's, else the module's own)."""
    filed = entry_fingerprint(fingerprint or module_fingerprint(model), settings.entry_dtype)
    if settings.cache_secret is not None:
        filed += f"+sealed:{secret_id(settings.cache_secret)}"
    disk = DiskCacheTier(settings.cache_dir, settings.disk_bytes) if settings.cache_dir is not None else None
    remote = RedisTier(settings.cache_url) if settings.cache_url is not None else None
    # One budget for every in-memory cache of the engine: segments, remainders and prefix nodes.
    memory = ByteLRU(settings.memory_bytes, settings.cache_policy)
    segments = SegmentStore(
        filed,
        memory,
        disk,
        device=model.device,
        layout=EntryLayout.of(model, settings.entry_dtype),
        remote=remote,
        entry_dtype=settings.entry_dtype,
        model_dtype=model.dtype,
        secret=settings.cache_secret,
    )
    return Stores(memory, segments, PrefixStore(filed, memory), filed)
