"""The prepared GPU run's code path, on tiny CPU shapes with Triton interpreted (its times mean nothing)."""

from __future__ import annotations

import pytest
import torch

from hypic_rag.eval.bench.gpu import run
from hypic_rag.kernels import HAS_TRITON


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
def test_the_gpu_script_runs_every_section_on_small_shapes():
    report = run(device="cpu", small=True, repeats=1, log=lambda _: None)
    assert report["skipped"] == []
    assert all(r["max_abs_diff"] < 1e-3 for r in report["kernels"]), report["kernels"]
    assert [r["prompt_tokens"] for r in report["ttft"]] == [128 + 64, 256 + 64]
    assert all(r[f"{m}_ttft_s"] > 0 for r in report["ttft"] for m in ("full", "prefix", "hypic", "transformers"))
    assert set(report["decode"]["layers"]["2"]["batches"]) == {"1", "2", "4"}


def test_sections_past_the_budget_are_skipped_and_a_gpu_is_needed():
    report = run(device="cpu", small=True, budget_s=-1, log=lambda _: None)
    assert report["skipped"] == ["kernels", "ttft", "decode"]
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            run(device="cuda", log=lambda _: None)
