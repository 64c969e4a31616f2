"""Linear layers laid out for decode batches on CPU: the LM head's weight pre-packed for oneDNN, and the
other projections run as ``W @ h.T`` for a batch's rows.

Decode on CPU is bound by reading weights, and the LM head is the largest one (a 248k-token vocabulary at
hidden 1,024 is 1 GB in fp32). ``F.linear`` hands a few rows to BLAS, which packs the weight into its own
blocked layout on every call: for one row that is a plain matrix-vector pass, but for a batch of rows the
weight is read twice (once to pack, once to multiply), so a batched decode step costs far more than one row
though the weight is the same. oneDNN can pack the weight once, ahead of time
(``torch.ops.mkldnn._reorder_linear_weight``); its matmul then streams the packed copy once per call, for one
row or many. PyTorch has no public API for this, so the head holds the packed copy itself, rebuilt when the
weight changes, and falls back to ``F.linear`` wherever oneDNN is missing (other devices, other dtypes,
training). The same kernel serves one row and a batch, so a batched request's logits equal its logits alone.

The packed copy is extra memory, the size of the head's weight; ``pack = False`` on the module turns it off.
The decoder layers' projections are smaller and many, so they keep one copy: a decode batch's rows ``[B, 1, H]``
go through ``W @ h.T``, a GEMM with the weight's long side first, which streams the weight once where
``h @ W.T`` (``F.linear``) re-reads it; one row and prefill keep ``F.linear``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

# The batch size oneDNN tunes the packed layout for; one row runs as fast as with the plain weight.
_PACK_ROWS = 16


# A decode batch's rows past which ``F.linear``'s layout is as good (the weight is read once either way).
_ROWS = range(3, 65)


class Linear(nn.Linear):
    """``nn.Linear`` whose decode batch on CPU runs weight-first (module docstring)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 3 and x.shape[1] == 1 and x.shape[0] in _ROWS and x.device.type == "cpu":
            out = (self.weight @ x[:, 0].t()).t()[:, None]
            return out if self.bias is None else out + self.bias
        return F.linear(x, self.weight, self.bias)


class LMHead(nn.Linear):
    """``nn.Linear`` without bias whose CPU fp32 inference runs on a weight packed once (module docstring)."""

    def __init__(self, hidden_size: int, vocab_size: int) -> None:
        super().__init__(hidden_size, vocab_size, bias=False)
        self.pack = True
        self._packed = _PackedCopy()

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        packed = self.packed_weight(h)
        if packed is None:
            return F.linear(h, self.weight)
        return torch.ops.mkldnn._linear_pointwise(h.contiguous(), packed, None, "none", [], "")

    def packed_weight(self, h: torch.Tensor) -> torch.Tensor | None:
        """The packed weight for this input, or ``None`` where the plain product must run."""
        w = self.weight
        if not self.pack or w.device.type != "cpu" or w.dtype != torch.float32 or h.dtype != torch.float32:
            return None
        if torch.is_grad_enabled() and (w.requires_grad or h.requires_grad):
            return None
        if not torch.backends.mkldnn.is_available():
            return None
        key = (w.data_ptr(), _version(w), id(w), tuple(w.shape))
        if self._packed.key == key:
            return self._packed.tensor
        self._packed.key = self._packed.tensor = None  # the old copy goes before the new one is built
        try:
            packed = torch.ops.mkldnn._reorder_linear_weight(w.detach(), _PACK_ROWS)
        except (AttributeError, RuntimeError):  # a torch build without the op: the plain product from now on
            self.pack = False
            return None
        self._packed.key, self._packed.tensor = key, packed
        return packed


class _PackedCopy:
    """The head's packed weight, which a copy of the model rebuilds rather than copies (an opaque oneDNN
    tensor has no storage to copy or serialize)."""

    def __init__(self) -> None:
        self.key: tuple[int, int, int, tuple[int, ...]] | None = None
        self.tensor: torch.Tensor | None = None

    def __deepcopy__(self, memo: dict) -> _PackedCopy:
        return _PackedCopy()

    def __reduce__(self) -> tuple[type, tuple]:
        return _PackedCopy, ()


def _version(w: torch.Tensor) -> int:
    """The weight's in-place write count. An inference tensor keeps none: a weight made under
    ``torch.inference_mode`` is repacked only when it is replaced, not when written in place."""
    try:
        return w._version
    except RuntimeError:
        return -1
