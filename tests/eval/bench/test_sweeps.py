"""The TTFT sweeps: every point measures its modes side by side, and the plots draw."""

from __future__ import annotations

import pytest

from hypic_rag.eval.bench.sweeps import DEFAULTS, plot, sweep
from hypic_rag.testing.synthetic import TINY


@pytest.mark.parametrize("name", ["length", "hits", "seam", "cold", "memory"])
def test_sweeps_measure_each_point_side_by_side(name, tmp_path):
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
    with pytest.raises(ValueError, match="unknown sweep"):
        sweep("speed", shapes=TINY, log=lambda _: None)
