"""How well each boundary deviation signal (``hypic_rag.deviation``) ranks requests by their KL to ``full``.

    python -m hypic_rag.eval.bench.deviation --n 40 --json deviation.json

For each request: its ``hypic`` logits at seam 8 (variant B), KL(full ‖ hypic), and every signal of
``deviation.SIGNALS`` from a probe of ``PROBE_WIDTH`` tokens per boundary, aggregated over the boundaries
(``AGGREGATES``), and the guard's estimate at seam 8 (``plan.estimate``). Reported: Spearman's rank
correlation of each with the KL, per model: the bundled model on the five workloads (chat prompts as
``hypic-rag eval`` makes them), and random 8-layer models of three families (``families.FIDELITY``: Gated
DeltaNet, Mamba2, KDA with MLA) on random-token prompts of 2-8 segments of 16-160 tokens.

``--pareto`` instead runs each seam of ``PARETO_SEAMS`` (``auto`` at the default budget and at 10 tokens per
boundary among them, and the CacheBlend-style baseline ``blend`` at 8 and 12) on the three random models: mean
KL, the tokens a warm request recomputes and those with its probe's layer-weighted tokens (``cost_tokens``).
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from scipy.stats import spearmanr

from hypic_rag import Engine, Segment
from hypic_rag.deviation import SIGNALS, boundary_deviation, reading_shares
from hypic_rag.fidelity import kl_divergence
from hypic_rag.plan import estimate

from ..data.workloads import SEGMENTATION, WORKLOADS, make
from .common import RandomSegments, write_report
from .families import FIDELITY, _model

FAMILY_KINDS = ("qwen3_5_text", "nemotron_h", "kimi_linear")
SEAM = 8
# Over a request's boundaries; "last": the one nearest the query; "share": each weighted by its segment's share
# of the prompt (the part of the context it stands for).
# "read": each weighted by the share of attention the prompt's last token pays its segment at the last attention
# layer (``deviation.reading_shares``: what ``auto`` spends by); ``read@max`` is the largest such share.
AGGREGATES = ("sum", "max", "mean", "last", "share", "read")


def _prompts_bundled(engine: Engine, n: int, seed: int) -> Iterator[tuple[list[Segment], Segment]]:
    per = max(1, n // len(WORKLOADS))
    for workload in WORKLOADS:
        for ex in make(workload, per, seed):
            rendered = engine.render(ex.messages, ex.tools, segmentation=SEGMENTATION)
            yield rendered.segments, rendered.query


def _prompts_random(vocab: int, n: int, seed: int) -> Iterator[tuple[list[Segment], Segment]]:
    rng, segments = random.Random(seed), RandomSegments(vocab, seed)
    for _ in range(n):
        count = rng.randint(2, 8)
        yield [segments.segment(rng.randint(16, 160)) for _ in range(count)], segments.segment(16)


def measure(engine: Engine, prompts: Iterator[tuple[list[Segment], Segment]]) -> dict[str, Any]:
    """Per request the KL at seam 8 and each signal; then each signal's Spearman correlation with the KL."""
    rows: list[dict[str, float]] = []
    for segments, query in prompts:
        full = engine.prompt_logits(segments, query, mode="full")
        hypic = engine.prompt_logits(segments, query, mode="hypic", seam=SEAM)  # fills the cache too
        plan = engine.plan(engine.build_prompt(segments, query), "hypic", SEAM)
        found = engine.prefill_program.lookup(plan)
        dev = boundary_deviation(engine.model, plan, found, deep=True)
        if not dev.per_boundary:
            continue
        reads = reading_shares(engine.model, plan, found).shares
        total = sum(len(seg.ids) for seg in plan.segments) + len(plan.query)
        bounds = sorted(dev.per_boundary)
        lengths = [len(plan.segments[i].ids) for i in bounds]
        row = {
            "kl": kl_divergence(full, hypic),
            "boundaries": len(bounds),
            # what the guard would report for this request at seam 8
            "estimate": estimate([dev.profiles[i] for i in bounds], [SEAM] * len(bounds), lengths),
        }
        for s in SIGNALS:
            per = dev.signal(s)
            values = list(per.values())
            row[f"{s}@sum"], row[f"{s}@max"] = sum(values), max(values)
            row[f"{s}@mean"], row[f"{s}@last"] = sum(values) / len(values), per[max(per)]
            row[f"{s}@share"] = sum(v * len(plan.segments[i].ids) for i, v in per.items()) / total
            row[f"{s}@read"] = sum(v * reads[i] for i, v in per.items())
        row["read@max"] = max(reads[i] for i in bounds)
        rows.append(row)
    kls = [r["kl"] for r in rows]
    names = [f"{s}@{agg}" for s in SIGNALS for agg in AGGREGATES] + ["read@max", "boundaries", "estimate"]
    corr = {name: float(spearmanr([r[name] for r in rows], kls).statistic) for name in names}
    return {"requests": len(rows), "mean_kl": sum(kls) / max(1, len(kls)), "spearman": corr}


PARETO_SEAMS: tuple[Any, ...] = (0, 4, 8, 16, 32, "auto", ("auto", 10.0), ("blend", 8.0), ("blend", 12.0))


def pareto(n: int, seed: int, log: Callable[[str], None] = print) -> dict[str, Any]:
    """On the random models of ``FAMILY_KINDS``: each seam's mean KL(full ‖ hypic) and tokens recomputed by a
    warm request (its second run), ``("auto", B)`` being ``auto`` under a budget of B tokens per boundary (and
    ``("blend", B)`` the baseline's)."""
    torch.set_num_threads(1)
    out: dict[str, Any] = {"benchmark": "deviation-pareto", "n": n, "seed": seed, "models": {}}
    for kind in FAMILY_KINDS:
        engine = Engine(_model(FIDELITY[kind]), seam_variant="B", min_cached_tokens=12)
        rows: dict[str, dict[str, list[float]]] = {}
        for segments, query in _prompts_random(FIDELITY[kind]["vocab_size"], n, seed):
            full = engine.prompt_logits(segments, query, mode="full")
            for seam in PARETO_SEAMS:
                options = {"seam": seam[0], "seam_budget": seam[1]} if isinstance(seam, tuple) else {"seam": seam}
                label = f"{seam[0]}:{seam[1]:g}" if isinstance(seam, tuple) else str(seam)
                engine.generate(segments, query, mode="hypic", max_new_tokens=1, **options)  # fills the cache
                warm = engine.generate(segments, query, mode="hypic", max_new_tokens=1, **options)
                row = rows.setdefault(label, {"kl": [], "recomputed_tokens": [], "cost_tokens": []})
                row["kl"].append(kl_divergence(full, warm.prompt_logits))
                row["recomputed_tokens"].append(warm.stats["recomputed_tokens"])
                row["cost_tokens"].append(warm.stats["recomputed_tokens"] + warm.stats.get("probe_cost", 0.0))
        means = {label: {k: sum(v) / len(v) for k, v in row.items()} for label, row in rows.items()}
        out["models"][kind] = means
        parts = [
            f"{k} KL {v['kl']:.2e} ({v['recomputed_tokens']:.0f} tok, {v['cost_tokens']:.0f} with probe)"
            for k, v in means.items()
        ]
        log(f"{kind}: " + ", ".join(parts))
    return out


def run(n: int, seed: int, log: Callable[[str], None] = print) -> dict[str, Any]:
    torch.set_num_threads(1)
    out: dict[str, Any] = {"benchmark": "deviation", "seam": SEAM, "n": n, "seed": seed, "models": {}}
    bundled = Engine.from_pretrained(None, min_cached_tokens=12)
    models: list[tuple[str, Engine, Iterator]] = [("bundled", bundled, _prompts_bundled(bundled, n, seed))]
    for kind in FAMILY_KINDS:
        engine = Engine(_model(FIDELITY[kind]), seam_variant="B", min_cached_tokens=12)
        models.append((kind, engine, _prompts_random(FIDELITY[kind]["vocab_size"], n, seed)))
    for name, engine, prompts in models:
        res = measure(engine, prompts)
        out["models"][name] = res
        best = sorted(res["spearman"].items(), key=lambda kv: -abs(kv[1]))[:4]
        log(
            f"{name}: {res['requests']} requests, mean KL {res['mean_kl']:.2e}; "
            + ", ".join(f"{k} {v:+.2f}" for k, v in best)
        )
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=40, help="requests per model")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--pareto", action="store_true", help="instead: KL and tokens of each seam, random models")
    args = parser.parse_args(argv)
    report = pareto(args.n, args.seed) if args.pareto else run(args.n, args.seed)
    if args.json is not None:
        write_report(report, args.json, "deviation")


if __name__ == "__main__":
    main()
