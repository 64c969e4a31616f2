"""``hypic-rag eval``: score a workload in several modes on one model, with fidelity against ``full``.

Each example's segments and query go through ``Engine.generate`` in every mode on the same token
ids; the answer is what the model writes up to its end tag, scored with the workload's metric. For
modes other than ``full`` it also reports KL(full ‖ mode) and top-1 agreement of the first answer
token. The JSON follows API.md: ``{"workload", "n", "results": {mode: {"score", "metric", "kl",
"top1"}}, "gap_points": {mode: full - mode}}``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hypic_rag import Engine, Segment
from hypic_rag.engine import MODES
from hypic_rag.fidelity import kl_divergence, top1_agreement
from hypic_rag.prompt_format import END, wrap

from .metrics import score
from .workloads import WORKLOADS, Example, make, read_longbench_jsonl


def load_examples(workload: str, n: int, seed: int) -> tuple[str, list[Example]]:
    """A named workload, or a LongBench-schema JSONL file (its first ``n`` rows)."""
    if workload in WORKLOADS:
        return workload, make(workload, n, seed)
    path = Path(workload)
    if path.suffix == ".jsonl" and path.is_file():
        return path.stem, read_longbench_jsonl(path)[:n]
    raise ValueError(f"--workload must be one of {', '.join(WORKLOADS)} or an existing .jsonl file, not {workload!r}")


def _progress(total: int, label: str):
    try:
        from tqdm import tqdm

        return tqdm(total=total, desc=label, unit="ex")
    except ImportError:  # tqdm comes with the eval extra
        return None


def evaluate(
    engine: Engine,
    workload: str,
    modes: Sequence[str],
    n: int = 100,
    seed: int = 0,
    max_new_tokens: int = 48,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise ValueError(f"modes must come from {', '.join(MODES)}; got {list(modes)}")
    if engine.tokenizer is None:
        raise ValueError("evaluation needs a checkpoint with a tokenizer")
    name, examples = load_examples(workload, n, seed)
    stops = [i for i in (engine.tokenizer.token_to_id(END),) if i is not None]
    scores: dict[str, list[float]] = {m: [] for m in modes}
    kls: dict[str, list[float]] = {m: [] for m in modes if m != "full"}
    agree: dict[str, list[bool]] = {m: [] for m in modes if m != "full"}
    bar = _progress(len(examples) * len(modes), f"{name} x {len(modes)} modes")
    for ex in examples:
        query = Segment(wrap("query", ex.query), kind="query")
        outputs = {
            mode: engine.generate(ex.segments, query, mode=mode, max_new_tokens=max_new_tokens, stop_token_ids=stops)
            for mode in modes
        }
        full = outputs["full"].prompt_logits if "full" in outputs else None
        if full is None and kls:
            full = engine.prompt_logits(ex.segments, query, mode="full")
        for mode, out in outputs.items():
            prediction = (out.text or "").split(END)[0].strip()
            scores[mode].append(score(ex.metric, prediction, ex.answers))
            if mode != "full":
                kls[mode].append(kl_divergence(full, out.prompt_logits))
                agree[mode].append(top1_agreement(full, out.prompt_logits))
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    metric = examples[0].metric if examples else "f1"
    results: dict[str, dict[str, Any]] = {}
    for mode in modes:
        row: dict[str, Any] = {"score": sum(scores[mode]) / max(1, len(scores[mode])), "metric": metric}
        if mode in kls:
            row["kl"] = sum(kls[mode]) / max(1, len(kls[mode]))
            row["top1"] = sum(agree[mode]) / max(1, len(agree[mode]))
        results[mode] = row
        log(
            f"  {mode:<7} {metric} {row['score']:6.1f}"
            + (f"  KL {row['kl']:.2e}  top-1 {row['top1']:.2f}" if "kl" in row else "")
        )
    report: dict[str, Any] = {"workload": name, "n": len(examples), "seed": seed, "results": results}
    if "full" in results:
        report["gap_points"] = {m: results["full"]["score"] - r["score"] for m, r in results.items() if m != "full"}
    return report
