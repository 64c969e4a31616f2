"""Linear layers whose CPU fp32 inference runs on weights packed once for oneDNN.

Decode on CPU is bound by reading weights. ``F.linear`` hands a few rows to BLAS, which on this path streams the
weight at a fraction of the memory bandwidth, and for a batch of rows packs the weight into its own blocked layout
on every call (the weight read twice). oneDNN can pack the weight once, ahead of time
(``torch.ops.mkldnn._reorder_linear_weight``); its matmul then streams the packed copy once per call, for one row,
a decode batch or a prompt, at several times the plain product's speed on every projection shape a hybrid model
has. PyTorch has no public API for this, so each layer holds its packed copy itself, built on first use and rebuilt
when the weight changes, and falls back to ``F.linear`` wherever oneDNN is missing (other devices, other dtypes,
training). Its kernels for one to three rows stream the weight slower than for four (for two, by a fifth or
more), so fewer than four rows run as four, the rest zeros: the weight is read once either way, the extra rows
cost arithmetic a memory-bound step has spare, and a decode row alone runs the same kernel as in a batch of up
to four, so its outputs are the same alone and batched.

The packed copy is extra memory, the size of the weight; ``pack = False`` on a layer frees it and turns packing
off (``HybridModel.pack_weights``; ``Engine.from_pretrained(pack_weights=False, pack_head=False)``,
``hypic-rag serve --no-pack-weights --no-pack-head``). Unpacked, a decode batch's rows ``[B, 1, H]`` go through
``W @ h.T``, a GEMM with the weight's long side first, which streams the weight once where ``h @ W.T`` re-reads it.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.nn import functional as F

# The batch size oneDNN tunes the packed layout for; one row runs as fast as with the plain weight.
_PACK_ROWS = 16
# Fewer rows than this run padded to it: oneDNN streams a packed weight fastest from four rows on.
_MIN_ROWS = 4


# A decode batch's rows past which ``F.linear``'s layout is as good (the weight is read once either way).
_ROWS = range(3, 65)


class Linear(nn.Linear):
    """``nn.Linear`` whose CPU fp32 inference runs on a weight packed once (module docstring), and whose decode
    batch runs weight-first where packing is off.

    The copy is rebuilt when the weight is replaced, moved, cast, loaded or written in place through the
    parameter; a write through ``.data`` (or into a weight made under ``torch.inference_mode``) is not seen:
    call ``invalidate()`` after one."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, **kwargs: Any) -> None:
        super().__init__(in_features, out_features, bias=bias, **kwargs)
        self._packed = _PackedCopy()

    @property
    def pack(self) -> bool:
        """Whether CPU fp32 inference runs on the packed copy; setting it False frees the copy."""
        return self._packed.enabled

    @pack.setter
    def pack(self, on: bool) -> None:
        self._packed.enabled = bool(on)
        if not on:
            self.invalidate()

    def invalidate(self) -> None:
        """Drop the packed copy; the next call builds it from the weight as it is then."""
        self._packed.clear()

    def _apply(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.invalidate()  # ``to``, ``float``, ``cpu``...: the weight is replaced
        return super()._apply(*args, **kwargs)

    def _load_from_state_dict(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        self.invalidate()
        super()._load_from_state_dict(*args, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        packed = self.packed_weight(x)
        if packed is not None:
            rows = x.reshape(-1, x.shape[-1])
            n = rows.shape[0]
            if 0 < n < _MIN_ROWS:  # run as four rows (module docstring)
                rows = torch.cat((rows, rows.new_zeros(_MIN_ROWS - n, rows.shape[1])))
            out = torch.ops.mkldnn._linear_pointwise(rows.contiguous(), packed, self.bias, "none", [], "")
            return out[:n].reshape(*x.shape[:-1], -1)
        if x.dim() == 3 and x.shape[1] == 1 and x.shape[0] in _ROWS and x.device.type == "cpu":
            out = (self.weight @ x[:, 0].t()).t()[:, None]
            return out if self.bias is None else out + self.bias
        return F.linear(x, self.weight, self.bias)

    def packed_weight(self, x: torch.Tensor) -> torch.Tensor | None:
        """The packed weight for this input, or ``None`` where the plain product must run."""
        w = self.weight
        if not self.pack or w.device.type != "cpu" or w.dtype != torch.float32:
            self.invalidate()  # the weight itself cannot use it: hold no copy
            return None
        if x.dtype != torch.float32 or (torch.is_grad_enabled() and (w.requires_grad or x.requires_grad)):
            return None
        if self.bias is not None and self.bias.dtype != torch.float32:
            return None
        if not torch.backends.mkldnn.is_available():
            return None
        return self._packed.of(w)


class LMHead(Linear):
    """The output projection: a ``Linear`` without bias, the largest weight a decode step reads."""

    def __init__(self, hidden_size: int, vocab_size: int) -> None:
        super().__init__(hidden_size, vocab_size, bias=False)


class _PackedCopy:
    """A layer's packed weight, which a copy of the model rebuilds rather than copies (an opaque oneDNN
    tensor has no storage to copy or serialize). One lock, so threads meeting an unpacked layer build one copy."""

    def __init__(self) -> None:
        self.enabled = True
        self._lock = threading.Lock()
        self._key: tuple[int, int, int, tuple[int, ...]] | None = None
        self._storage: StorageWeakRef | None = None  # a freed weight whose address is reused is not this one
        self._tensor: torch.Tensor | None = None

    def clear(self) -> None:
        with self._lock:
            self._key = self._storage = self._tensor = None

    @property
    def held(self) -> bool:
        return self._tensor is not None

    def of(self, w: torch.Tensor) -> torch.Tensor | None:
        key = (w.data_ptr(), _version(w), id(w), tuple(w.shape))
        with self._lock:
            if self._key == key and self._storage is not None and not self._storage.expired():
                return self._tensor
            self._key = self._storage = self._tensor = None  # the old copy goes before the new one is built
            try:
                packed = torch.ops.mkldnn._reorder_linear_weight(w.detach(), _PACK_ROWS)
            except (AttributeError, RuntimeError):  # a torch build without the op: the plain product from now on
                self.enabled = False
                return None
            self._key, self._storage, self._tensor = key, StorageWeakRef(w.untyped_storage()), packed
            return packed

    def __deepcopy__(self, memo: dict) -> _PackedCopy:
        twin = _PackedCopy()
        twin.enabled = self.enabled
        return twin

    def __reduce__(self) -> tuple[type, tuple]:
        return _PackedCopy, ()


def _version(w: torch.Tensor) -> int:
    """The weight's in-place write count. An inference tensor keeps none: a weight made under
    ``torch.inference_mode`` is repacked only when it is replaced, not when written in place."""
    try:
        return w._version
    except RuntimeError:
        return -1
