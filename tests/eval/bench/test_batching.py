from __future__ import annotations

import pytest

from hypic_rag.eval.bench.batching import run
from hypic_rag.testing.synthetic import TINY


def test_reports_every_batch_size_against_alone():
    report = run(layers=[2], batches=[1, 2, 4], prompt_tokens=5, steps=2, repeats=1, log=lambda _: None, shapes=TINY)
    rows = report["layers"]["2"]["batches"]
    assert set(rows) == {"1", "2", "4"}
    alone = report["layers"]["2"]["alone_tokens_per_s"]
    for row in rows.values():
        assert row["tokens_per_s"] > 0
        assert row["over_alone"] == pytest.approx(row["tokens_per_s"] / alone)
    with pytest.raises(ValueError, match="must be >= 1"):
        run(layers=[2], batches=[0], shapes=TINY)


def test_cpu_clock_needs_one_thread():
    import torch

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        report = run(
            layers=[2], batches=[2], prompt_tokens=3, steps=1, repeats=1, log=lambda _: None, shapes=TINY, clock="cpu"
        )
        assert report["clock"] == "cpu" and report["layers"]["2"]["batches"]["2"]["tokens_per_s"] > 0
        torch.set_num_threads(2)
        with pytest.raises(ValueError, match="one torch thread"):
            run(layers=[2], batches=[2], shapes=TINY, clock="cpu")
    finally:
        torch.set_num_threads(threads)
    with pytest.raises(ValueError, match="clock must be one of"):
        run(layers=[2], batches=[2], shapes=TINY, clock="sundial")
