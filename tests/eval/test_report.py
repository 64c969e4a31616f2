"""``hypic-rag eval --report``: the table, the bar chart and, where modes record their tokens, the Pareto plot."""

from __future__ import annotations

from hypic_rag.eval.report import write_report


def _row(score, kl=None, tokens=None):
    row = {"score": score, "metric": "f1"}
    if kl is not None:
        row.update(kl=kl, top1=1.0)
    if tokens is not None:
        row["recomputed_tokens"] = tokens
    return row


def test_the_pareto_plot_comes_with_recomputed_tokens(tmp_path):
    report = {
        "workloads": [
            {
                "workload": w,
                "results": {
                    "full": _row(90, tokens=300),
                    "hypic@w8": _row(89, 1e-3, 60),
                    "hypic@auto": {**_row(90, 5e-4, 55), "cost_tokens": 81.5, "same_answer": 0.995},
                },
                "gap_points": {"hypic@w8": 1.0, "hypic@auto": 0.0},
            }
            for w in ("memory", "aggregate")
        ],
        "mean_score": {"full": 90, "hypic@w8": 89, "hypic@auto": 90},
    }
    paths = write_report(report, tmp_path / "with", "hypic-rag eval")
    assert [p.name for p in paths] == ["report.md", "scores.png", "pareto.png"]
    assert paths[2].stat().st_size > 0 and "(pareto.png)" in paths[0].read_text()
    # the tokens each mode computes, its probe included where it has one (an older JSON: recomputed only)
    assert "| memory | 60.0 / 60.0 | 55.0 / 81.5 |" in paths[0].read_text()
    # KL / top-1, and the share of answers identical to full's where the JSON has it
    assert "| memory | 1.00e-03 / 1.00 | 5.00e-04 / 1.00 / 0.995 |" in paths[0].read_text()
    for r in report["workloads"]:
        for row in r["results"].values():
            row.pop("recomputed_tokens")
    assert [p.name for p in write_report(report, tmp_path / "without")] == ["report.md", "scores.png"]
