"""An engine's settings, checked where they are set: how it prefills composed requests (``PrefillSettings``, which
the engine's attributes of those names read and write through ``Setting``) and the device it runs on."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import torch

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

    def __setattr__(self, name: str, value: Any) -> None:
        _CHECKS[name](name, value)
        super().__setattr__(name, value)


assert set(_CHECKS) == {f.name for f in fields(PrefillSettings)}


class Setting:
    """An engine attribute that is its ``settings``' field of the same name."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, engine: Any, owner: type | None = None) -> Any:
        return self if engine is None else getattr(engine.settings, self.name)

    def __set__(self, engine: Any, value: Any) -> None:
        setattr(engine.settings, self.name, value)


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
