"""hypic-rag: position-independent caching for hybrid-attention LLMs (Gated DeltaNet + full attention)."""

from .engine import Engine
from .options import RequestOptions
from .outputs import GenerationOutput
from .segments import Segment

__all__ = ["Engine", "GenerationOutput", "RequestOptions", "Segment"]
__version__ = "0.1.0"
