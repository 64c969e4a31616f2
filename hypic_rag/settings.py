"""An engine's settings, each checked when it is made or set: how it prefills composed requests
(``PrefillSettings``, which the engine's attributes of those names read and write through ``Setting``), where and
how it caches (``CacheSettings``), both together (``EngineSettings``), and the device it runs on."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from .cache.entry import entry_dtype as entry_dtype_of
from .cache.lru import check_memory
from .cache.remote import check_url
from .cache.seal import secret_bytes
from .options import RequestOptions, check_seam
from .plan import VARIANTS

COLD_POLICIES = ("parallel", "exact")


def check_choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"unknown {name} {value!r}; expected one of {', '.join(allowed)}")


def check_count(name: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


def check_flag(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")


_CHECKS: dict[str, Callable[[str, Any], None]] = {
    "seam": lambda _, v: check_seam(v),
    "seam_variant": lambda n, v: check_choice(n, v, VARIANTS),
    "cold_policy": lambda n, v: check_choice(n, v, COLD_POLICIES),
    "min_cached_tokens": lambda n, v: check_count(n, v, 0),
    "fuse_forwards": check_flag,
    "fidelity_budget": lambda _, v: RequestOptions(fidelity_budget=v),  # checked as a request's would be
    "keep_states": check_flag,
}


@dataclass
class PrefillSettings:
    """How composed requests are prefilled (``Engine``'s docstring says what each does); each checked whenever
    it is set, so that a benchmark or a test switching one between requests cannot leave a bad one."""

    seam: int | float = 8
    seam_variant: str = "B"
    cold_policy: str = "parallel"
    min_cached_tokens: int = 12
    fuse_forwards: bool = True
    fidelity_budget: float | None = None
    keep_states: bool = True

    def __setattr__(self, name: str, value: Any) -> None:
        _CHECKS[name](name, value)
        super().__setattr__(name, value)


assert set(_CHECKS) == {f.name for f in fields(PrefillSettings)}


@dataclass(frozen=True)
class CacheSettings:
    """Where and how an engine caches (``Engine``'s docstring says what each does), checked and normalised when
    made: ``cache_dir`` a folder (a URL there is a ``ValueError``), ``cache_url`` a Redis URL, ``entry_dtype`` a
    dtype, ``cache_secret`` bytes."""

    cache_dir: Path | None = None
    cache_url: str | None = None
    memory_bytes: int = 2 << 30
    disk_bytes: int | None = None  # None: a share of the disk's free space
    entry_dtype: torch.dtype = torch.float32
    cache_policy: str = "value"
    cache_secret: bytes | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.cache_dir is not None:
            if "://" in str(self.cache_dir):  # Path() would fold it into a folder name
                raise ValueError(f"cache_dir is a folder, not {str(self.cache_dir)!r}: pass a Redis URL as cache_url")
            object.__setattr__(self, "cache_dir", Path(self.cache_dir).expanduser())
        if self.cache_url is not None:
            check_url(self.cache_url)
        check_memory(self.memory_bytes, self.cache_policy)
        check_count("disk_bytes", 1 if self.disk_bytes is None else self.disk_bytes, 1)
        object.__setattr__(self, "entry_dtype", entry_dtype_of(self.entry_dtype))
        if self.cache_secret is not None:
            object.__setattr__(self, "cache_secret", secret_bytes(self.cache_secret))


@dataclass
class EngineSettings:
    """Every setting of an engine, made (and so checked) in one place before anything is built from them."""

    prefill: PrefillSettings = field(default_factory=PrefillSettings)
    cache: CacheSettings = field(default_factory=CacheSettings)
    flush_denormals: bool = True

    def __post_init__(self) -> None:
        check_flag("flush_denormals", self.flush_denormals)


class Setting:
    """An engine attribute that is its prefill settings' field of the same name."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, engine: Any, owner: type | None = None) -> Any:
        return self if engine is None else getattr(engine.settings.prefill, self.name)

    def __set__(self, engine: Any, value: Any) -> None:
        setattr(engine.settings.prefill, self.name, value)


def usable_device(device: str | torch.device) -> torch.device:
    """``device`` parsed, and present on this machine."""
    try:
        out = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device {device!r} is not a torch device: {exc}") from None
    if out.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: this torch build or machine has no CUDA device")
    if out.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {device!r}: MPS is not available here")
    return out


def check_chunk(tokens: int | None) -> int | None:
    """A request's ``prefill_chunk``."""
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1):
        raise ValueError(f"prefill_chunk must be a positive number of tokens, got {tokens!r}")
    return tokens
