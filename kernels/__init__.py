"""Fused kernels for the operations HYPIC adds, each beside its torch reference.

- ``transition``: a segment's end state and transition operator;
- ``compose``: chains of cached segments' states;
- ``stitch``: attention of new tokens over reassembled, re-rotated cached KV.

``backend="auto"`` runs Triton on CUDA tensors and torch elsewhere; ``HYPIC_KERNEL_BACKEND`` forces
one. Installed as ``hypic_rag.kernels``; never importable as a top-level ``kernels``.
"""

from .algebra import (
    SplitTransition,
    Transition,
    compose,
    compose_reference,
    rerotate,
    split_transition,
    transition,
    transition_reference,
)
from .backend import BACKENDS, HAS_TRITON
from .stitch import stitch, stitch_reference

__all__ = [
    "BACKENDS",
    "HAS_TRITON",
    "SplitTransition",
    "Transition",
    "compose",
    "compose_reference",
    "rerotate",
    "split_transition",
    "stitch",
    "stitch_reference",
    "transition",
    "transition_reference",
]
