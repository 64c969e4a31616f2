from __future__ import annotations

import pytest

from hypic_rag.eval.ttft_bench import run
from hypic_rag.testing.synthetic import TINY


def test_bench_json_follows_the_api_and_warm_means_reordered():
    report = run(
        segments=4,
        segment_tokens=64,
        query_tokens=8,
        modes=["full", "prefix", "pic", "hypic", "transformers"],
        repeats=1,
        layers=4,
        log=lambda _: None,
        shapes=TINY,
    )
    rows = {r["mode"]: r for r in report["results"]}
    assert set(rows) == {"full", "prefix", "pic", "hypic", "transformers"}
    for r in rows.values():
        assert r["ttft_s"] > 0 and r["prompt_tokens"] == 4 * 64 + 8 and r["segments"] == 4
    assert rows["hypic"]["hit_ratio"] == 1.0 and rows["pic"]["hit_ratio"] == 1.0
    assert rows["prefix"]["hit_ratio"] < 1.0  # the earlier request had the documents in another order
    assert rows["hypic"]["recomputed_tokens"] == 3 * 8 + 8
    assert set(report["speedup"]) == {"prefix", "pic", "hypic", "transformers"}


def test_bench_needs_full():
    with pytest.raises(ValueError, match="must include 'full'"):
        run(modes=["hypic"], log=lambda _: None, shapes=TINY)


@pytest.mark.parametrize("name", ["length", "hits", "seam", "cold", "memory"])
def test_sweeps_measure_each_point_side_by_side(name, tmp_path):
    from hypic_rag.eval.ttft_sweeps import DEFAULTS, plot, sweep

    values = {"length": [128, 256], "hits": [0.0, 0.5, 1.0], "seam": [0, 4], "cold": [0.0], "memory": [32, 128]}[name]
    report = sweep(
        name,
        values,
        ["full", "prefix", "hypic"],
        total_tokens=200,
        query_tokens=8,
        layers=2,
        shapes=TINY,
        log=lambda _: None,
    )
    assert [p["x"] for p in report["points"]] == values and name in DEFAULTS
    for point in report["points"]:
        rows = {r["mode"]: r for r in point["results"]}
        if name == "hits":
            assert rows["hypic"]["hit_ratio"] == round(point["x"] * 10) / 10
        if name == "cold":
            assert set(rows) == {"full", "hypic-parallel", "hypic-sequential"}
            assert rows["hypic-parallel"]["hit_ratio"] == 0.0
        if name == "seam":
            assert rows["hypic"]["recomputed_tokens"] == 7 * point["x"] + 8
        if name == "memory":
            assert rows["hypic"]["bytes_per_token"] > 0
    if name == "memory":  # fixed linear-state bytes spread over more tokens
        assert (
            report["points"][1]["results"][0]["bytes_per_token"] < report["points"][0]["results"][0]["bytes_per_token"]
        )
    assert plot(report, tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_unknown_sweep_is_refused():
    from hypic_rag.eval.ttft_sweeps import sweep

    with pytest.raises(ValueError, match="unknown sweep"):
        sweep("speed", shapes=TINY, log=lambda _: None)
