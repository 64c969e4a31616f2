"""``hypic-rag eval --report DIR``: an evaluation's JSON as a Markdown table and a PNG bar chart."""

from __future__ import annotations

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
        lines += ["", "KL(full ‖ mode) and top-1 agreement of the first answer token:", ""]
        lines += ["| workload | " + " | ".join(with_kl) + " |", "|---|" + "---|" * len(with_kl)]
        for r in reports:
            cells = [f"{r['results'][m]['kl']:.2e} / {r['results'][m]['top1']:.2f}" for m in with_kl]
            lines.append(f"| {r['workload']} | " + " | ".join(cells) + " |")
    lines += ["", "![scores](scores.png)"]
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
    return [md, png]
