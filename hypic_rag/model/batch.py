"""Many requests' states advanced by one forward: the decode step of a continuous batch.

Each request keeps its own ``RequestState`` (per-sequence KV buffers with their own lengths), and a
``BatchState`` presents them to the layers as one state for a forward of one token per row. Per-sequence
buffers rather than a paged pool, because HYPIC places a cached segment's keys anywhere with a rotation still
owed (``AttentionLayerKV.shift``), so a request's KV is not a run of shared prefix pages; the buffers already
grow geometrically, and a row joining or leaving the batch is a list operation, no copy. What the rows share
is where decode spends its time on a memory-bound device: every weight matrix is read once for all of them.
Linear layers' states are stacked ``[B, ...]`` for their step and split back after as views of the stack, so
while the same rows step in the same order the next step updates the stack in place, with no copy (``stacked``);
attention runs each row over its own KV by the single-request code, so a row's arithmetic is the one it has
alone up to the rounding of a matmul over more rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from .state import LinearLayerState, RequestState

# One row's attention: (layer, q, k, v, positions, inv_freq, state, pad_mask, scale) -> [1, Hq, 1, D].
RowAttention = Callable[..., torch.Tensor]


def stacked(rows: Sequence[torch.Tensor], in_place: bool) -> torch.Tensor:
    """``rows`` (each ``[1, ...]``) as one ``[B, ...]`` tensor: where they are consecutive rows of one tensor
    already (the previous step's stack, the batch unchanged) and ``in_place``, a view of it; else a copy."""
    first = rows[0]
    size = first.numel()
    offset, storage = first.storage_offset(), first.untyped_storage().data_ptr()
    if in_place and all(
        row.is_contiguous()
        and row.shape == first.shape
        and row.dtype == first.dtype
        and row.untyped_storage().data_ptr() == storage
        and row.storage_offset() == offset + i * size
        for i, row in enumerate(rows)
    ):
        return first.as_strided((len(rows), *first.shape[1:]), (size, *first.stride()[1:]), offset)
    return torch.cat(list(rows))


class BatchState:
    """The states of a batch's rows, as the layers of a one-token-per-row forward read and write them."""

    def __init__(self, states: Sequence[RequestState]) -> None:
        if not states:
            raise ValueError("a batch needs at least one request state")
        self.rows = list(states)
        self.positions = torch.tensor([s.seq_len for s in self.rows])

    @property
    def seq_len(self) -> int:
        """The longest row's length (what the context check needs)."""
        return max(s.seq_len for s in self.rows)

    def linear(self, idx: int) -> LinearLayerState | None:
        layers = [s.linear(idx) for s in self.rows]
        if any(layer is None for layer in layers):
            raise ValueError(f"layer {idx}: every row of a batched step needs a prefilled state")
        owned = all(layer.scratch for layer in layers)  # type: ignore[union-attr]
        return LinearLayerState(
            conv=stacked([layer.conv for layer in layers], owned),  # type: ignore[union-attr]
            recurrent=stacked([layer.recurrent for layer in layers], owned),  # type: ignore[union-attr]
            scratch=True,
        )

    def set_linear(self, idx: int, conv: torch.Tensor, recurrent: torch.Tensor) -> None:
        for i, row in enumerate(self.rows):
            row.set_linear(idx, conv[i : i + 1], recurrent[i : i + 1], scratch=True)

    def attend_rows(
        self,
        attend: RowAttention,
        layer_idx: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        inv_freq: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        """Each row's query over its own keys, by ``attend`` (the single-request core)."""
        positions = self.positions.to(q.device)
        outs = [
            attend(
                layer_idx, q[i : i + 1], k[i : i + 1], v[i : i + 1], positions[i : i + 1], inv_freq, row, None, scale
            )
            for i, row in enumerate(self.rows)
        ]
        return torch.cat(outs)

    def advance(self, tokens: int) -> None:
        for row in self.rows:
            row.advance(tokens)
