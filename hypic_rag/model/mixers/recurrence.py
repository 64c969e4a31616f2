"""The three ways a linear mixer's recurrence runs over a forward's tokens, in one place for every mixer
that scans piece by piece (Mamba2, Lightning, KDA):

- plain: one scan from the request's state (or zero);
- capture (an isolated, zero-start prefill): the scan with the segment's operators (``split``), which
  are recorded on the ``TransitionCapture``;
- marked (``StateMarks``, a forward run in context): plain, cut at the marks, the state recorded at each;
- fused (``SegmentJumps``): the fresh tokens scanned a piece at a time, the state jumping over each
  cached segment by its operator in the mixer's form (``kernels.scan.scan_pieces``).

Gated DeltaNet runs its own fused kernel (``kernels.scan.scan_with_jumps``) and does not come here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from hypic_rag.kernels.algebra import SplitTransition, apply_operator
from hypic_rag.kernels.scan import scan_pieces

from ..state import SegmentJumps, StateMarks, TransitionCapture

Scan = Callable[[slice, "torch.Tensor | None"], tuple[torch.Tensor, torch.Tensor]]


def run_recurrence(
    layer_idx: int,
    form: str,
    tokens: int,
    s0: torch.Tensor | None,
    zero_state: Callable[[], torch.Tensor],
    scan: Scan,
    split: Callable[[torch.Tensor], SplitTransition],
    capture: TransitionCapture | None,
    jumps: SegmentJumps | None,
    marks: StateMarks | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Outputs ``[B, T, ...]`` and the end state. ``scan(tokens, start)`` runs the recurrence over a slice
    of the forward's tokens from ``start`` (None: zero); ``split(rest_start)`` is the mixer's capture."""
    if marks is not None and capture is not None:
        raise ValueError("a zero-start capture records no marks")
    if jumps is not None:
        p, b, _ = jumps.linear[layer_idx]
        pieces: list[torch.Tensor] = []

        def run(lo: int, hi: int, state: torch.Tensor) -> torch.Tensor:
            out, state = scan(slice(lo, hi), state)
            pieces.append(out)
            return state

        def jump(j: int, source: torch.Tensor) -> torch.Tensor:
            return apply_operator(form, p[j], source, b[j])

        start = s0 if s0 is not None else zero_state()
        upto = marks.after(jumps.at) if marks is not None else tokens
        end = scan_pieces(upto, jumps.at.tolist(), jumps.src.tolist(), start, run, jump)
        if marks is not None:
            out, end = scan_marked(layer_idx, tokens, end, scan, marks, upto)
            pieces.append(out)
        return torch.cat(pieces, dim=1), end
    if marks is not None:
        return scan_marked(layer_idx, tokens, s0, scan, marks)
    if capture is not None:
        if s0 is not None:
            raise ValueError("transitions are captured from a zero start only")
        found = split(capture.rest_start)
        capture.operators[layer_idx] = replace(found, out=None)
        return found.out, found.state
    return scan(slice(None), s0)


def scan_marked(
    layer_idx: int, tokens: int, s0: torch.Tensor | None, scan: Scan, marks: StateMarks, start: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain scan of the tokens from ``start`` (``s0`` the state there) a piece at a time, cut at ``marks``,
    which get the state at each of theirs."""
    outs, states, state = [], [], s0
    for lo, hi in marks.pieces(tokens, start):
        if hi > lo:
            out, state = scan(slice(lo, hi), state)
            outs.append(out)
        states.append(state)
    marks.recurrent[layer_idx] = states[:-1]
    return torch.cat(outs, dim=1), state
