"""LFM2's gated short convolution: ``y = C * conv(B * x)``.

The short conv is the whole of its linear state: it carries only the last ``kernel - 1`` values of ``B * x``
across a boundary, so its operator form is ``none``: a cached segment hands over its conv tail and nothing
else, and no seam can repair more than that tail's reach. Weight names are transformers' ``Lfm2ShortConv``'s
(``conv``, ``in_proj``, ``out_proj``).
"""

from __future__ import annotations

import torch
from torch import nn

from hypic_rag.kernels.algebra import NONE, SplitTransition

from ..config import HybridConfig
from ..context import Forward
from ..linear import Linear
from .conv import request_conv


class ShortConv(nn.Module):
    operator_form = NONE

    def __init__(self, config: HybridConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        h, bias = config.hidden_size, config.short_conv_bias
        self.kernel = config.short_conv_kernel
        self.conv = nn.Conv1d(h, h, self.kernel, groups=h, bias=bias)
        self.in_proj = Linear(h, 3 * h, bias=bias)
        self.out_proj = Linear(h, h, bias=bias)

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"b": (0,), "p": (0,), "conv_tail": (self.conv.weight.shape[0], self.kernel - 1)}

    def forward(self, x: torch.Tensor, ctx: Forward) -> torch.Tensor:
        """Padding is zero conv input (projection biases too), so a left-padded row is its real tokens alone."""
        state, pad_mask, capture, jumps = ctx.state, ctx.pad_mask, ctx.capture, ctx.jumps
        b = x.shape[0]
        if pad_mask is not None:
            x = torch.where(pad_mask[..., None], x, 0.0)
        layer = state.linear(self.layer_idx) if state is not None else None
        gate_in, gate_out, inputs = self.in_proj(x).chunk(3, dim=-1)
        u = gate_in * inputs
        if pad_mask is not None:
            u = torch.where(pad_mask[..., None], u, 0.0)
        tail = layer.conv if layer else None
        mixed, tail = request_conv(u, tail, self.conv.weight[:, 0, :], self.conv.bias, jumps, self.layer_idx, ctx.marks)
        empty = x.new_zeros(b, 0, dtype=torch.float32)
        if ctx.marks is not None:  # no recurrence: the conv tail is its whole state
            ctx.marks.recurrent[self.layer_idx] = [empty] * len(ctx.marks.at)
        if capture is not None:
            rest = empty if bool((capture.rest_start < x.shape[1]).any()) else None
            capture.operators[self.layer_idx] = SplitTransition(empty, empty, None, rest, rest)
        if state is not None:
            state.set_linear(self.layer_idx, tail, empty)
        return self.out_proj(gate_out * mixed)
