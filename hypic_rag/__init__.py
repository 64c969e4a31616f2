"""hypic-rag: position-independent caching for hybrid-attention LLMs (Gated DeltaNet + full attention)."""

from .engine import Engine
from .outputs import GenerationOutput
from .segments import Segment

__all__ = ["Engine", "GenerationOutput", "Segment"]
__version__ = "0.1.0"
