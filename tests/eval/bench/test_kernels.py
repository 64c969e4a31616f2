"""The GPU benchmark's code path, on tiny CPU shapes with Triton interpreted (its times mean nothing)."""

from __future__ import annotations

import pytest
import torch

from hypic_rag.eval.bench.kernels import run
from hypic_rag.kernels import HAS_TRITON


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
def test_kernel_bench_runs_end_to_end_on_small_shapes():
    report = run(device="cpu", small=True, repeats=1, log=lambda _: None)
    names = {r["kernel"] for r in report["kernels"]}
    assert names == {"transition", "scan_with_jumps", "compose", "stitch", "kda_scan"}
    assert all(r["torch_s"] > 0 and r["triton_s"] > 0 for r in report["kernels"])
    assert [r["prompt_tokens"] for r in report["ttft"]] == [128, 256]


def test_kernel_bench_needs_a_gpu_unless_told_otherwise():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(ValueError, match="no CUDA device"):
        run(device="cuda", log=lambda _: None)
