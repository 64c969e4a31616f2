"""Linear layers whose CPU fp32 inference runs on weights packed once for oneDNN, and whose decode steps may run on
8-bit weights.

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

``int8 = True`` adds a copy of the weight quantized per output channel to 8 bits, which the projections of a decode
step (``decoding()``) read instead: a quarter of the bytes, through PyTorch's fbgemm kernel
(``quantized.linear_dynamic``, which quantizes the activations to 8 bits too, as llama.cpp's Q8_0 does; 7 on a CPU
without VNNI, ``_full_range``). Prompts
still run on the float weights. That kernel quantizes a whole batch with one range, so a row's result would depend
on the rows beside it; each row is therefore scaled to a largest magnitude of one and given two more inputs, one
and minus one, against zero weights, which pins every batch's range to [-1, 1]: each row is then quantized alone,
its products are integers, and a decode row gives the same result alone and batched. PyTorch 2.13 marks its
quantized tensors deprecated (``torch.quantize_per_channel`` builds the weight the kernel takes) and its other CPU
8-bit products are slower here (oneDNN's ``qlinear_pointwise`` by about three times, ``_int_mm`` by more); a build
without the kernel decodes on the float weights, with one warning.

``bf16 = True`` adds a bfloat16 copy of the weight, packed for oneDNN like the float one, which decode steps read
instead: half the bytes, the rows cast to bfloat16 on the way in and the result back to float32. Worth it only on a
CPU that multiplies bfloat16 natively (``native_bf16``: AVX-512 BF16 or AMX); the engine asks for it only there.
A row runs padded to four rows as on the float copy, so it is the same alone and in a batch of up to four.
"""

from __future__ import annotations

import contextvars
import functools
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
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
# Whether the projections now running are a decode step's, which read a layer's 8-bit copy where it has one.
_DECODING = contextvars.ContextVar("hypic_decoding", default=False)


@contextmanager
def decoding() -> Iterator[None]:
    """The projections run inside read the 8-bit weight copies of the layers that have one (``Linear.int8``)."""
    token = _DECODING.set(True)
    try:
        yield
    finally:
        _DECODING.reset(token)


class Linear(nn.Linear):
    """``nn.Linear`` whose CPU fp32 inference runs on a weight packed once (module docstring), and whose decode
    batch runs weight-first where packing is off.

    The copy is rebuilt when the weight is replaced, moved, cast, loaded or written in place through the
    parameter; a write through ``.data`` (or into a weight made under ``torch.inference_mode``) is not seen:
    call ``invalidate()`` after one."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, **kwargs: Any) -> None:
        super().__init__(in_features, out_features, bias=bias, **kwargs)
        self._packed = _PackedCopy()
        self._int8 = _Int8Copy()
        self._bf16 = _Bf16Copy()

    @property
    def int8(self) -> bool:
        """Whether decode steps (``decoding()``) run on an 8-bit copy of the weight (module docstring); setting
        it False frees the copy."""
        return self._int8.enabled

    @int8.setter
    def int8(self, on: bool) -> None:
        self._int8.enabled = bool(on)
        self._int8.clear()

    @property
    def bf16(self) -> bool:
        """Whether decode steps (``decoding()``) run on a bfloat16 copy of the weight packed for oneDNN (module
        docstring); setting it False frees the copy."""
        return self._bf16.enabled

    @bf16.setter
    def bf16(self, on: bool) -> None:
        self._bf16.enabled = bool(on)
        self._bf16.clear()

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
        """Drop the packed, 8-bit and bfloat16 copies; the next call builds them from the weight as it is then."""
        self._packed.clear()
        self._int8.clear()
        self._bf16.clear()

    def _apply(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.invalidate()  # ``to``, ``float``, ``cpu``...: the weight is replaced
        return super()._apply(*args, **kwargs)

    def _load_from_state_dict(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        self.invalidate()
        super()._load_from_state_dict(*args, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _DECODING.get():
            if self._int8.enabled and (copy := self._int8.for_input(self.weight, x)) is not None:
                return self._int8.linear(copy, self.weight, x, self.bias)
            if self._bf16.enabled and (copy := self._bf16.for_input(self.weight, x)) is not None:
                return _packed_product(x, copy, self.bias, torch.bfloat16)
        packed = self.packed_weight(x)
        if packed is not None:
            return _packed_product(x, packed, self.bias)
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


class _WeightCopy:
    """A copy of a layer's weight in another form, built on first use and rebuilt when the weight changes, which a
    copy of the model rebuilds rather than copies (an opaque oneDNN or fbgemm tensor has no storage to copy or
    serialize). One lock, so threads meeting a layer without its copy build one. ``_build`` makes the copy, or
    gives None where this torch build cannot: the copy is then off from there on."""

    enabled_at_start = True

    def __init__(self) -> None:
        self.enabled = self.enabled_at_start
        self._lock = threading.Lock()
        self._key: tuple[int, int, int, tuple[int, ...]] | None = None
        self._storage: StorageWeakRef | None = None  # a freed weight whose address is reused is not this one
        self._tensor: Any = None

    def _build(self, w: torch.Tensor) -> Any:
        raise NotImplementedError

    def clear(self) -> None:
        with self._lock:
            self._key = self._storage = self._tensor = None

    @property
    def held(self) -> bool:
        return self._tensor is not None

    def of(self, w: torch.Tensor) -> Any:
        key = (w.data_ptr(), _version(w), id(w), tuple(w.shape))
        with self._lock:
            if self._key == key and self._storage is not None and not self._storage.expired():
                return self._tensor
            self._key = self._storage = self._tensor = None  # the old copy goes before the new one is built
            built = self._build(w)
            if built is None:
                self.enabled = False
                return None
            self._key, self._storage, self._tensor = key, StorageWeakRef(w.untyped_storage()), built
            return built

    def __deepcopy__(self, memo: dict) -> _WeightCopy:
        twin = type(self)()
        twin.enabled = self.enabled
        return twin


class _DecodeCopy(_WeightCopy):
    """A copy that only decode steps read, off until asked for."""

    enabled_at_start = False

    def for_input(self, w: torch.Tensor, x: torch.Tensor) -> Any:
        """The copy this input runs on, or None where it cannot: CPU float32 inference, with the kernel in this torch
        build. Looked up once a call, since a decode step calls it for every projection."""
        if w.device.type != "cpu" or w.dtype != torch.float32 or x.dtype != torch.float32:
            return None
        if torch.is_grad_enabled() and (w.requires_grad or x.requires_grad):
            return None
        return self.of(w)

    def __reduce__(self) -> tuple[Any, tuple]:
        return _unbuilt, (type(self), self.enabled)


def _unbuilt(kind: type[_DecodeCopy], enabled: bool) -> _DecodeCopy:
    """An unbuilt copy, on or off: what a pickled layer's copy comes back as."""
    copy = kind()
    copy.enabled = enabled
    return copy


class _PackedCopy(_WeightCopy):
    """A layer's weight packed for oneDNN (module docstring)."""

    def _build(self, w: torch.Tensor) -> torch.Tensor | None:
        try:
            return torch.ops.mkldnn._reorder_linear_weight(w.detach(), _PACK_ROWS)
        except (AttributeError, RuntimeError):  # a torch build without the op: the plain product from now on
            return None

    def __reduce__(self) -> tuple[type, tuple]:
        return _PackedCopy, ()


class _Bf16Copy(_DecodeCopy):
    """A layer's weight in bfloat16, packed for oneDNN (module docstring)."""

    def _build(self, w: torch.Tensor) -> torch.Tensor | None:
        try:
            return torch.ops.mkldnn._reorder_linear_weight(w.detach().bfloat16(), _PACK_ROWS)
        except (AttributeError, RuntimeError):  # no bf16 oneDNN in this build: the float weight from now on
            return None


class _Int8Copy(_DecodeCopy):
    """A layer's weight quantized per output channel to 8 bits and prepacked for fbgemm, with two zero columns for
    the pinned range (module docstring)."""

    def _build(self, w: torch.Tensor) -> Any:
        return _int8_packed(w)

    def linear(self, copy: Any, w: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``x`` through ``copy`` (``for_input``'s); ``w``, the float weight, takes a row that is not finite."""
        rows = x.reshape(-1, x.shape[-1])
        try:
            out = self._rows(copy, rows, bias)
        except RuntimeError:  # a row that is not finite has no range: each row alone, that one on the float weight
            out = torch.cat([self._row(copy, w, row[None], bias) for row in rows])
        return out.reshape(*x.shape[:-1], -1)

    def _rows(self, copy: Any, rows: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """The product of rows scaled to a largest magnitude of one and pinned (module docstring), scaled back: as
        few operations as it takes, since a decode step runs it for every projection."""
        top = torch.linalg.vector_norm(rows, float("inf"), dim=1, keepdim=True).clamp_min_(_TINY)
        pinned = torch.cat((rows / top, _PINS.expand(rows.shape[0], 2)), dim=1)
        product = torch.ops.quantized.linear_dynamic(pinned, copy, not _full_range())
        return product.mul_(top) if bias is None else torch.addcmul(bias, product, top)

    def _row(self, copy: Any, w: torch.Tensor, row: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return self._rows(copy, row, bias) if bool(torch.isfinite(row).all()) else F.linear(row, w, bias)


_PINS = torch.tensor([[1.0, -1.0]])  # the two inputs that pin a batch's range
_TINY = torch.finfo(torch.float32).tiny


def _packed_product(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """``x`` through a weight packed for oneDNN, its rows (in ``dtype``, where the copy is in another) run as four
    where fewer (module docstring); the result in ``x``'s dtype."""
    rows = x.reshape(-1, x.shape[-1])
    n = rows.shape[0]
    if 0 < n < _MIN_ROWS:  # run as four rows (module docstring)
        rows = torch.cat((rows, rows.new_zeros(_MIN_ROWS - n, rows.shape[1])))
    if dtype is not None:
        rows, bias = rows.to(dtype), (bias.to(dtype) if bias is not None else None)
    out = torch.ops.mkldnn._linear_pointwise(rows.contiguous(), packed, bias, "none", [], "")
    return out[:n].reshape(*x.shape[:-1], -1).to(x.dtype)


@functools.cache
def _cpu_flags() -> frozenset[str]:
    """The CPU's feature flags, as Linux lists them (none elsewhere)."""
    try:
        with open("/proc/cpuinfo") as info:
            return frozenset(next((line.split(":", 1)[1].split() for line in info if line.startswith("flags")), []))
    except OSError:
        return frozenset()


@functools.cache
def _full_range() -> bool:
    """Whether activations may use all 8 bits: on a CPU with VNNI, whose 8-bit dot products add into 32 bits. Without
    it fbgemm multiplies pairs into 16 bits, which two large products can overflow, so activations keep 7 bits
    (``reduce_range``), at about three times the drift."""
    return bool({"avx512_vnni", "avx_vnni"} & _cpu_flags())


def native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX-512 BF16 or AMX), where a bfloat16 copy reads half the
    bytes at the float product's speed; elsewhere oneDNN converts it back in software and gains nothing."""
    return bool({"avx512_bf16", "amx_bf16"} & _cpu_flags())


_WARNED: list[bool] = []


def _int8_packed(w: torch.Tensor) -> Any:
    """``w`` with its two zero columns, quantized per output channel and prepacked for fbgemm; None, with one
    warning a process, where this torch build cannot."""
    padded = torch.cat((w.detach(), w.new_zeros(w.shape[0], 2)), dim=1)  # the pinning inputs' weights
    scale = (padded.abs().amax(dim=1) / 127).clamp_min(_TINY).double()
    zero = torch.zeros(w.shape[0], dtype=torch.long)
    try:
        if "fbgemm" not in torch.backends.quantized.supported_engines:
            raise RuntimeError("this torch build has no fbgemm")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # the deprecation the module docstring speaks of
            quantized = torch.quantize_per_channel(padded, scale, zero, 0, torch.qint8)
        return torch.ops.quantized.linear_prepack(quantized, None)
    except (AttributeError, RuntimeError) as exc:
        if not _WARNED:
            _WARNED.append(True)
            warnings.warn(f"8-bit weights are unavailable ({exc}): decoding on the float weights", stacklevel=3)
        return None


def _version(w: torch.Tensor) -> int:
    """The weight's in-place write count. An inference tensor keeps none: a weight made under
    ``torch.inference_mode`` is repacked only when it is replaced, not when written in place."""
    try:
        return w._version
    except RuntimeError:
        return -1
