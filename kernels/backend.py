"""Which implementation runs: Triton on CUDA tensors, torch everywhere else.

``HYPIC_KERNEL_BACKEND=torch`` or ``=triton`` forces one (tests force Triton on CPU tensors under
``TRITON_INTERPRET=1``, which must be set before the kernels are imported, since the decorators read
it). Triton is optional: without it every entry point runs its torch reference.
"""

from __future__ import annotations

import os

import torch

BACKENDS = ("auto", "torch", "triton")

try:  # pragma: no cover - depends on the environment
    import triton  # noqa: F401

    HAS_TRITON = True
except ImportError:  # pragma: no cover
    HAS_TRITON = False


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def resolve(backend: str, *tensors: torch.Tensor) -> str:
    """``"torch"`` or ``"triton"`` for a call on ``tensors``."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    forced = os.environ.get("HYPIC_KERNEL_BACKEND", "")
    if forced and forced not in BACKENDS:
        raise ValueError(f"HYPIC_KERNEL_BACKEND={forced!r}; expected one of {', '.join(BACKENDS)}")
    if backend == "auto":
        backend = forced if forced in ("torch", "triton") else "auto"
    if backend == "auto":
        on_gpu = all(t.is_cuda for t in tensors)
        return "triton" if HAS_TRITON and on_gpu else "torch"
    if backend == "triton":
        if not HAS_TRITON:
            raise ValueError("backend 'triton' needs the triton package")
        if not interpreting() and not all(t.is_cuda for t in tensors):
            raise ValueError("backend 'triton' needs CUDA tensors (or TRITON_INTERPRET=1)")
    return backend
