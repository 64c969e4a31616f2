"""``hypic-rag eval --report DIR``: an evaluation's JSON as a Markdown table, a PNG bar chart and, where the
modes record the tokens they recompute, the Pareto picture: gap and KL against tokens computed, a probe's
layer-weighted tokens included (a hollow mark at the tokens recomputed without it)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


def write_report(report: dict[str, Any], directory: str | Path, command: str = "") -> list[Path]:
    """``report.md`` (a table of workloads x modes, with gaps and KL) and PNG plots, in ``directory``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    reports = report.get("workloads", [report])
    labels = list(reports[0]["results"])
    lines = ["# hypic-rag eval", ""]
    if command:
        lines += ["```", command, "```", ""]
    lines += ["| workload | metric | " + " | ".join(labels) + " |", "|---|---|" + "---|" * len(labels)]
    for r in reports:
        cells = []
        for m in labels:
            row = r["results"][m]
            gap = r.get("gap_points", {}).get(m)
            cells.append(f"{row['score']:.1f}" + (f" ({-gap:+.1f})" if gap is not None else ""))
        lines.append(f"| {r['workload']} | {r['results'][labels[0]]['metric']} | " + " | ".join(cells) + " |")
    if "mean_score" in report:
        lines.append("| **mean** | | " + " | ".join(f"**{report['mean_score'][m]:.1f}**" for m in labels) + " |")
    with_kl = [m for m in labels if "kl" in reports[0]["results"][m]]
    if with_kl:
        title = "KL(full ‖ mode) and top-1 agreement of the first answer token (and the share of answers identical to"
        title += " full's):"
        lines += _table(reports, with_kl, title, _fidelity)
    pareto = [m for m in with_kl if "recomputed_tokens" in reports[0]["results"][m]]
    if pareto:
        title = "Tokens recomputed per request / with the probe's layer-weighted tokens:"
        lines += _table(reports, pareto, title, lambda row: f"{row['recomputed_tokens']:.1f} / {_cost(row):.1f}")
    lines += ["", "![scores](scores.png)"]
    if pareto:
        lines += ["", "![gap and KL against tokens recomputed](pareto.png)"]
    md = out / "report.md"
    md.write_text("\n".join(lines) + "\n")
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(reports)), 3.5))
    width = 0.8 / len(labels)
    for i, m in enumerate(labels):
        xs = [j + i * width for j in range(len(reports))]
        ax.bar(xs, [r["results"][m]["score"] for r in reports], width, label=m)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(reports))], [r["workload"] for r in reports])
    ax.set_ylabel("score")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=8)
    fig.tight_layout()
    png = out / "scores.png"
    fig.savefig(png, dpi=120)
    plt.close(fig)
    written = [md, png]
    if pareto:
        written.append(_pareto(plt, reports, pareto, out / "pareto.png"))
    return written


def _pareto(plt: Any, reports: list[dict[str, Any]], labels: list[str], path: Path) -> Path:
    """Per workload and on their mean: each mode's gap to ``full`` and KL against its mean tokens computed (the
    probe's, layer-weighted, included; a hollow mark where they are, at the tokens recomputed alone)."""
    rows = [*reports, _mean_row(reports, labels)] if len(reports) > 1 else reports
    fig, axes = plt.subplots(2, len(rows), figsize=(3.2 * len(rows), 5.5), squeeze=False)
    for j, r in enumerate(rows):
        for m in labels:
            res = r["results"][m]
            x, bare = _cost(res), res["recomputed_tokens"]
            for k, y in ((0, r.get("gap_points", {}).get(m, 0.0)), (1, max(res["kl"], 1e-12))):
                dot = axes[k][j].scatter(x, y, s=14)
                if bare != x:
                    axes[k][j].scatter(bare, y, s=14, facecolors="none", edgecolors=dot.get_facecolor())
                    axes[k][j].plot([bare, x], [y, y], lw=0.5, color=dot.get_facecolor()[0])
                axes[k][j].annotate(m.removeprefix("hypic@"), (x, y), fontsize=6)
        axes[0][j].set_title(r["workload"], fontsize=9)
        axes[1][j].set_yscale("log")
        axes[1][j].set_xlabel("tokens computed (probe included)")
    axes[0][0].set_ylabel("gap to full (points)")
    axes[1][0].set_ylabel("KL(full ‖ mode)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _cost(row: dict[str, Any]) -> float:
    """A mode's tokens computed per request: ``cost_tokens``, or in a JSON from before it, the tokens
    recomputed."""
    return row.get("cost_tokens", row["recomputed_tokens"])


def _fidelity(row: dict[str, Any]) -> str:
    same = f" / {row['same_answer']:.3f}" if "same_answer" in row else ""
    return f"{row['kl']:.2e} / {row['top1']:.2f}{same}"


def _mean_row(reports: list[dict[str, Any]], labels: list[str]) -> dict[str, Any]:
    def mean(values: list[float]) -> float:
        return sum(values) / len(values)

    results = {m: {"recomputed_tokens": mean([r["results"][m]["recomputed_tokens"] for r in reports])} for m in labels}
    for m in labels:
        results[m]["kl"] = mean([r["results"][m]["kl"] for r in reports])
        results[m]["cost_tokens"] = mean([_cost(r["results"][m]) for r in reports])
    gaps = {m: mean([r.get("gap_points", {}).get(m, 0.0) for r in reports]) for m in labels}
    return {"workload": "mean", "results": results, "gap_points": gaps}


def _table(reports: list[dict], modes: list[str], title: str, cell: Callable[[dict], str]) -> list[str]:
    """A titled markdown table: a row per workload, a column per mode, ``cell`` of each mode's results."""
    lines = ["", title, "", "| workload | " + " | ".join(modes) + " |", "|---|" + "---|" * len(modes)]
    for r in reports:
        lines.append(f"| {r['workload']} | " + " | ".join(cell(r["results"][m]) for m in modes) + " |")
    return lines
