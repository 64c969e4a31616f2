"""What a forward pass hands every decoder layer, mixer and attention besides the hidden states: one object, made
once per forward by ``HybridModel``, so that a layer's signature is ``forward(x, ctx)`` and a family that needs
more of the pass (its tokens' embeddings, say) reads it here instead of changing every layer's arguments."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .state import RequestState, SegmentJumps, StateMarks, TransitionCapture

if TYPE_CHECKING:
    from .batch import BatchState


@dataclass(frozen=True)
class Forward:
    """``positions`` ``[T]`` (``[B]`` in a batched decode step: a position per row) and their ``rope`` (cos, sin,
    inverse frequencies); ``state`` the request's (a ``batch.BatchState`` in a batched decode step; None: no
    cache); ``pad_mask`` ``[B, T]`` the real tokens of left-padded rows; ``capture`` records the linear layers'
    segment operators of a zero-start forward; ``jumps`` the cached segments a fused forward skips between its
    tokens; ``embeds`` ``[B, T, H]`` the pass's tokens as the first layer received them (Zamba2's shared
    attention reads them beside the hidden states); ``marks`` where the linear layers of a forward run in context
    record their states."""

    positions: torch.Tensor
    rope: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    state: RequestState | BatchState | None
    pad_mask: torch.Tensor | None = None
    capture: TransitionCapture | None = None
    jumps: SegmentJumps | None = None
    embeds: torch.Tensor | None = None
    marks: StateMarks | None = None
