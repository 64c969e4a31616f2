"""hypic-rag: position-independent caching for hybrid-attention LLMs (Gated DeltaNet + full attention).

The public names load on first use, so a light submodule (``hypic_rag.defaults``, the command line's help) does
not pull torch in."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .engine import Engine
    from .options import RequestOptions
    from .outputs import GenerationOutput
    from .segments import Segment

__all__ = ["Engine", "GenerationOutput", "RequestOptions", "Segment"]
__version__ = "0.1.0"
_HOMES = {"Engine": ".engine", "RequestOptions": ".options", "GenerationOutput": ".outputs", "Segment": ".segments"}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        value = getattr(import_module(_HOMES[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])
