"""The causal depthwise conv that linear mixers run before their scan, with the tail it carries.

Its history (the last ``kernel - 1`` inputs) is state that crosses a segment boundary like the
recurrent state does; inside a fused forward, each cached segment replaces it with its own tail.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ..state import SegmentJumps, StateMarks


def causal_conv(
    mixed: torch.Tensor, tail: torch.Tensor | None, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal depthwise conv over ``mixed [B, T, C]`` after ``tail [B, C, kernel-1]`` (None: zeros, the
    start of a sequence) with ``weight [C, kernel]``; returns the output (before any activation) and the
    new tail.

    Written as ``kernel`` shifted multiply-adds over ``[B, T, C]``: on CPU this is about twice as fast
    as a grouped ``conv1d``, which needs the channels-first layout."""
    b, t, c = mixed.shape
    kernel = weight.shape[-1]
    if tail is None:
        tail = mixed.new_zeros(b, c, kernel - 1)
    full = torch.cat((tail.transpose(1, 2).to(mixed.dtype), mixed), dim=1)
    w = weight.t()  # [kernel, C]
    out = full[:, :t] * w[0]
    for j in range(1, kernel):
        out.addcmul_(full[:, j : j + t], w[j])
    if bias is not None:
        out = out + bias
    return out, full[:, t:].transpose(1, 2).clone(memory_format=torch.contiguous_format)


def causal_conv_across(
    mixed: torch.Tensor,
    tail: torch.Tensor | None,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    at: torch.Tensor,
    tails: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The conv over fresh tokens between which cached segments sit: after fresh token ``at[j]`` the
    history is segment ``j``'s tail ``tails[j]`` (the last one's, where several segments meet at one
    point).

    One conv for all pieces: each piece is laid out after its own history (``kernel - 1`` columns that
    separate it from the piece before), the outputs at those columns dropped — a fused forward has a piece
    per cached segment, and a conv per piece cost a handful of small ops each."""
    b, t, c = mixed.shape
    k1 = weight.shape[-1] - 1
    history = tail.to(mixed.dtype) if tail is not None else mixed.new_zeros(b, c, k1)
    parts, keep, start, used = [], [], 0, 0
    for j, cut in enumerate(at.tolist()):
        if cut > start:
            parts += [history.transpose(1, 2), mixed[:, start:cut]]
            keep.append(torch.arange(used + k1, used + k1 + cut - start))
            used += k1 + cut - start
            start = cut
        history = tails[j][None].expand(b, -1, -1).to(mixed.dtype)
    if start < t:
        parts += [history.transpose(1, 2), mixed[:, start:]]
        keep.append(torch.arange(used + k1, used + k1 + t - start))
        used += k1 + t - start
        history = None  # the final tail is the last piece's own
    laid = torch.cat(parts, dim=1)
    out, end = causal_conv(laid[:, k1:], laid[:, :k1].transpose(1, 2), weight, bias)
    out = out[:, torch.cat(keep).to(mixed.device) - k1]
    return out, (end if history is None else history.clone())


def request_conv(
    mixed: torch.Tensor,
    tail: torch.Tensor | None,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    jumps: SegmentJumps | None,
    layer_idx: int,
    marks: StateMarks | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A linear layer's conv in a forward: plain after ``tail``, or across the cached segments of a fused
    forward (``jumps``, whose ``linear[layer_idx]`` holds their tails); ``marks`` get the tail at each of theirs."""
    if jumps is None:
        if marks is not None:
            marks.conv[layer_idx] = tails_at(mixed, tail, weight.shape[-1] - 1, marks.at)
        return causal_conv(mixed, tail, weight, bias)
    tails = jumps.linear[layer_idx][2]
    if marks is not None:  # after the last jump: its segment's tail, then fresh tokens
        last = int(jumps.at[-1])
        history = tails[-1][None].expand(mixed.shape[0], -1, -1)
        marks.after(jumps.at)
        marks.conv[layer_idx] = tails_at(mixed[:, last:], history, weight.shape[-1] - 1, [m - last for m in marks.at])
    return causal_conv_across(mixed, tail, weight, bias, jumps.at, tails)


def tails_at(mixed: torch.Tensor, tail: torch.Tensor | None, k1: int, at: Sequence[int]) -> list[torch.Tensor]:
    """The conv history ``[B, C, k1]`` after each of ``at`` of ``mixed [B, T, C]``'s tokens, ``tail`` before them."""
    b, _, c = mixed.shape
    history = tail.to(mixed.dtype) if tail is not None else mixed.new_zeros(b, c, k1)
    full = torch.cat((history.transpose(1, 2), mixed), dim=1)
    return [full[:, m : m + k1].transpose(1, 2).clone(memory_format=torch.contiguous_format) for m in at]
