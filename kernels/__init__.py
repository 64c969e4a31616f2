"""Fused kernels for the operations HYPIC adds, each beside its torch reference.

- ``transition``: a segment's end state and transition operator;
- ``compose``: chains of cached segments' states;
- ``stitch``: attention of new tokens over reassembled, re-rotated cached KV.
- ``scan_with_jumps``: the gated delta rule over a request's fresh tokens, its state jumping over
  cached segments.

``backend="auto"`` runs Triton on CUDA tensors and torch elsewhere; ``HYPIC_KERNEL_BACKEND`` forces
one. Installed as ``hypic_rag.kernels``. Python run from the repository root (``python -c``, ``-m``, a notebook)
finds this folder as a top-level ``kernels``, the import name of Hugging Face's kernel hub, which transformers
imports; so under that name this package steps aside (``_shadow``) and nothing of ours is loaded.
"""

from __future__ import annotations

if __name__ == "kernels":  # imported by the other distribution's name, from the repository root
    from ._shadow import step_aside

    step_aside()
else:
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
    from .scan import Jumps, scan_with_jumps, scan_with_jumps_reference
    from .stitch import stitch, stitch_reference

__all__ = [
    "BACKENDS",
    "HAS_TRITON",
    "Jumps",
    "SplitTransition",
    "Transition",
    "compose",
    "compose_reference",
    "rerotate",
    "scan_with_jumps",
    "scan_with_jumps_reference",
    "split_transition",
    "stitch",
    "stitch_reference",
    "transition",
    "transition_reference",
]
